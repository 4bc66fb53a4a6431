#!/bin/bash
# session 12, call 7: final tree: GPU tests of streaming loads, memcheck, on/off repeat over sizes (5 rounds)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_streaming.py tests/test_onchip_rows.py -m gpu > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt
for op in logsumexp sum_sum variance; do
  timeout 60 compute-sanitizer --tool memcheck python3 .gpu/san.py $op default "" > $R/san_$op.txt 2>&1; tail -2 $R/san_$op.txt
done
sed -i 's/for rnd in range(3)/for rnd in range(int(os.environ.get("ROUNDS", "3")))/' .gpu/tune.py
for M in 1024 2048 4096 8192 16384; do
  ROUNDS=5 timeout 100 python3 .gpu/tune.py logsumexp,softmax_sum,l2norm_stable,sum_sum default ";streaming_loads=off" M=$M >> $R/ab_sweep2.txt 2>&1
done
for L in 1024 2048 4096 8192 16384; do
  ROUNDS=5 timeout 60 python3 .gpu/tune.py variance default ";streaming_loads=off" L=$L >> $R/ab_sweep2.txt 2>&1
done
grep "us x" $R/ab_sweep2.txt
cd $OUT && tar czf r.tgz r && rm -rf r
