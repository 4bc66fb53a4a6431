#!/bin/bash
# session 12, call 6: streaming loads (rows on chip, reductions only) on/off over row lengths; checks; gpu_bench rows
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
for M in 1024 4096 8192 32768; do
  timeout 100 python3 .gpu/tune.py logsumexp,softmax_sum,l2norm_stable,sum_sum default ";streaming_loads=off" M=$M >> $R/ab_sweep.txt 2>&1
done
for L in 1024 8192 32768; do
  timeout 60 python3 .gpu/tune.py variance default ";streaming_loads=off" L=$L >> $R/ab_sweep.txt 2>&1
done
grep -v Warn $R/ab_sweep.txt | grep "us x"
timeout 150 python3 benchmarks/gpu_check.py --ops logsumexp,softmax_sum,l2norm_stable,sum_sum,variance,softmax,rmsnorm_amax,layernorm_stats --sizes test --inputs all --jobs 4 > $R/gpu_check.txt 2>&1
tail -3 $R/gpu_check.txt
timeout 200 python3 benchmarks/gpu_bench.py --ops logsumexp,softmax_sum,l2norm_stable,sum_sum,variance,softmax,rmsnorm_amax,layernorm_stats,moe_routing --out $R/bench > $R/bench.log 2>&1
tail -5 $R/bench.log; grep -A30 "^| operator\|^|" $R/bench/gpu_bench.md | head -40
cd $OUT && tar czf r.tgz r && rm -rf r
