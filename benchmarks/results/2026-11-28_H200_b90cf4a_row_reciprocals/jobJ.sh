#!/bin/bash
# session 8, call 3: row reciprocals (proven and tested per row): GPU tests, sanitizer, A/B on/off with torch.compile at
# bench and sweep sizes (one process per operator), gpu_check of the row operators, the rows bench with torch.compile
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
git log --oneline -1 > $R/tree.txt 2>/dev/null; git status --short >> $R/tree.txt 2>/dev/null
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_row_reciprocals.py tests/test_onchip_rows.py tests/test_onchip_long_rows.py 2>&1 | tail -15 > $R/pytest_gpu.txt
tail -2 $R/pytest_gpu.txt
for op in softmax l2norm_stable; do
  timeout 60 compute-sanitizer --tool memcheck python3 .gpu/san.py $op default "" > $R/san_$op.txt 2>&1
  echo "$op memcheck rc=$?: $(grep -E 'ERROR SUMMARY' $R/san_$op.txt | tail -1)" | tee -a $R/sanitizer.txt
done
timeout 60 compute-sanitizer --tool racecheck python3 .gpu/san.py l2norm_stable default "" > $R/race_l2norm.txt 2>&1
echo "l2norm_stable racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY' $R/race_l2norm.txt | tail -1)" | tee -a $R/sanitizer.txt
(cd $OUT && tar czf r.tgz r)
COMPILE=1 timeout 120 python3 .gpu/tune.py softmax,l2norm_stable,sum_sum,layernorm_stats,rmsnorm_amax default "reciprocal_rows=off;" 2>&1 | F | tee $R/ab_bench.txt
for M in 1024 4096 8192 32768; do
  COMPILE=1 timeout 100 python3 .gpu/tune.py softmax,l2norm_stable,sum_sum,layernorm_stats,rmsnorm_amax default "reciprocal_rows=off;" M=$M 2>&1 | F | tee -a $R/ab_sweep.txt
done
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 100 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops softmax,l2norm_stable,sum_sum,layernorm_stats,rmsnorm_amax --jobs 14 > $R/gpu_check.log 2>&1; echo "gpu_check rc=$?" >> $R/gpu_check.log
tail -3 $R/gpu_check.log
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 150 python3 benchmarks/gpu_bench.py --ops softmax,softmax_sum,logsumexp,rmsnorm_amax,layernorm_stats,variance,sum_sum,l2norm_stable --out $R/rows > $R/rows.log 2>&1; echo "rows rc=$?" >> $R/rows.log
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
