#!/bin/bash
# session 14, call 7: a2fa057 (epilogue quotient by rcp_rz once per row): checks, then A/B against fb45593 (.base)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
A=attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window
( export PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc_chk
  (timeout 130 python3 benchmarks/gpu_check.py --sizes test --inputs all --jobs 6 --ops $A,attn_mla_decode --out $R/check_test > $R/gpu_check_test.txt 2>&1; echo "rc=$?" >> $R/gpu_check_test.txt) &
  timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_staged_stores.py tests/test_row_reciprocals.py tests/test_gpu.py -k "staged or reciprocal or rcp or late" > $R/pytest.txt 2>&1
  wait )
tail -2 $R/pytest.txt; tail -2 $R/gpu_check_test.txt
for tree in base new; do
  dir=$PWD; [ $tree = base ] && dir=$PWD/.base
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 110 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree prefill $A) 2>&1 | F | sed "s/^/$tree /" >> $R/ab.txt
done
cat $R/ab.txt
python3 .gpu/cmp.py /tmp/o_base /tmp/o_new > $R/bits.txt; cat $R/bits.txt
cd $OUT && tar czf r.tgz r && rm -rf r
