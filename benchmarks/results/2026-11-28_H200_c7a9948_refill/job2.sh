#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
timeout 200 ncu --set full --import-source no -k regex:polyfuse_attn_global_k0 -s 1 -c 1 -o $R/gd python3 .gpu/one.py attn_global decode > $R/ncu_log.txt 2>&1; echo "ncu rc=$?"
cp /tmp/one_src.cu $R/gd_src.cu
ncu -i $R/gd.ncu-rep --print-details all > $R/gd_details.txt 2>&1
ncu -i $R/gd.ncu-rep --page source --csv --print-source sass > $R/gd_sass.csv 2>&1
ls -la $R; head -c 600 $R/gd_sass.csv
grep -E "Stall|Warp Cycles|Eligible|Issued|DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy" $R/gd_details.txt | head -50
cd $OUT && tar czf r.tgz r && rm -rf r
