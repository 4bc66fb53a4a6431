#!/bin/bash
# session 8, call 2: reciprocal_rows on/off with torch.compile in one process; GPU tests; sanitizer; warps of the read-only rows
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
COMPILE=1 timeout 150 python3 .gpu/tune.py sum_sum,layernorm_stats,rmsnorm_amax default "reciprocal_rows=off;" 2>&1 | F | tee $R/ab_rcp.txt
COMPILE=1 timeout 150 python3 .gpu/tune.py sum_sum,layernorm_stats,rmsnorm_amax default "reciprocal_rows=off;" 2>&1 | F | tee $R/ab_rcp2.txt
(cd $OUT && tar czf r.tgz r)
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_row_reciprocals.py tests/test_onchip_rows.py -k "rcp or sum_sum or layernorm or rmsnorm" 2>&1 | tail -15 > $R/pytest_gpu.txt
cat $R/pytest_gpu.txt | tail -3
for op in sum_sum layernorm_stats rmsnorm_amax; do
  timeout 60 compute-sanitizer --tool memcheck python3 .gpu/san.py $op default "" > $R/san_$op.txt 2>&1
  echo "$op memcheck rc=$?: $(grep -E 'ERROR SUMMARY' $R/san_$op.txt | tail -1)" | tee -a $R/sanitizer.txt
done
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 100 python3 .gpu/tune.py logsumexp,softmax_sum,l2norm_stable,variance default ";warps=4;warps=16" 2>&1 | F | tee $R/warps_rows.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
