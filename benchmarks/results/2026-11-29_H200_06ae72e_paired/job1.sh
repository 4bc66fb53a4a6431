#!/bin/bash
# session 15, call 1: verification of last session's MLA decode / GPU tests; decode profile (stamps, ncu, tuning)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
D=attn_global,attn_gqa,attn_causal,attn_norm_inside,attn_softcap,attn_window,attn_alibi
(timeout 150 python3 benchmarks/gpu_check.py --sizes bench --ops attn_mla_decode --jobs 4 --out $OUT/check_mla > $OUT/gpu_check_mla.txt 2>&1; echo "rc=$?" >> $OUT/gpu_check_mla.txt) &
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_staged_stores.py tests/test_gpu.py -k "bulk or staged" > $OUT/pytest.txt 2>&1
wait
tail -2 $OUT/pytest.txt $OUT/gpu_check_mla.txt
POLYFUSE_CACHE_DIR=/tmp/pfc_st timeout 100 python3 .gpu/dstamps.py attn_global,attn_gqa,attn_causal decode 2>&1 | F > $OUT/dstamps.txt; cat $OUT/dstamps.txt
timeout 120 ncu --kernel-name regex:"polyfuse|cudnn|flash|fmha|sm90" --launch-skip 0 --launch-count 8 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats python3 .gpu/dprof.py attn_global decode > $OUT/ncu_global.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|Registers|Block Size|Grid Size|Waves" $OUT/ncu_global.txt | head -80
timeout 150 python3 .gpu/tune.py $D decode "default;decode_blocks_per_sm=4;decode_blocks_per_sm=16;decode_tile=64;decode_warps=8" 2>&1 | F > $OUT/tune.txt; cat $OUT/tune.txt
