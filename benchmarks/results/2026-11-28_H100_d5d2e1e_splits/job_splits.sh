#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import matplotlib, tqdm" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 .gpu/splits.py attn_global:decode,attn_global:decode:4096,attn_global:decode:1024,attn_gqa:decode,attn_gqa:decode:4096,attn_causal:decode,attn_norm_inside:decode,attn_mla_decode:decode,attn_global:decode_b32 2>&1 | grep -v Warn | tee $R/splits_ab.txt
SECS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats"
timeout 120 ncu $SECS -k regex:polyfuse_attn_causal_k0 -c 1 python3 -m polyfuse check attn_causal --mode prefill --set Hq=8 --set Hkv=8 --set Sq=4096 --set Skv=4096 --set D=128 --set Dv=128 --backend cuda > $R/ncu_causal_prefill.txt 2>&1; echo "ncu prefill rc=$?"
timeout 90 ncu $SECS -k regex:polyfuse_attn_global_k0 -c 1 python3 -m polyfuse check attn_global --mode decode --set B=1 --set Hq=16 --set Hkv=16 --set Skv=32768 --set D=64 --set Dv=64 --backend cuda > $R/ncu_global_decode.txt 2>&1; echo "ncu decode rc=$?"
grep -E "Duration|Throughput|Issue Slots|No Eligible|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Tensor|Pipe|Stall|Memory Throughput|L1/TEX Hit|L2 Hit|DRAM Throughput" $R/ncu_causal_prefill.txt | head -40
grep -E "Duration|Throughput|Issue Slots|No Eligible|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Memory Throughput|DRAM Throughput" $R/ncu_global_decode.txt | head -20
cd $OUT && tar czf r.tgz r && rm -rf r
