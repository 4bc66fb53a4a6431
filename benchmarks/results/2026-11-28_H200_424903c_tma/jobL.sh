#!/bin/bash
# session 9, call 1: TMA for the producer warpgroup (bulk tensor copies) + the rolled variance fix on the GPU
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu.py -k "bulk" tests/test_hopper_primitives.py 2>&1 | tail -15 > $R/pytest_bulk.txt
tail -3 $R/pytest_bulk.txt
timeout 90 python3 .gpu/sass.py attn_global:prefill attn_causal:prefill attn_norm_inside:prefill attn_mla_decode:decode_b32 2>&1 | F | tee $R/sass.txt
(cd $OUT && tar czf r.tgz r)
timeout 200 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_window,attn_alibi prefill "tma=off;" 2>&1 | F | tee $R/ab_prefill.txt
timeout 60 python3 .gpu/tune.py attn_mla_decode decode_b32 "tma=off;" 2>&1 | F | tee -a $R/ab_prefill.txt
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
for t in memcheck racecheck synccheck; do
  timeout 50 compute-sanitizer --tool $t python3 .gpu/san.py attn_global prefill "" Sq=300 Skv=300 D=64 Dv=64 > $R/san_${t}_global.txt 2>&1
  echo "global 300 $t rc=$?: $(grep -E 'SUMMARY' $R/san_${t}_global.txt | tail -1) $(tail -1 $R/san_${t}_global.txt)" | tee -a $R/sanitizer.txt
done
timeout 60 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_causal prefill "" Sq=384 Skv=384 D=128 Dv=128 > $R/san_race_causal.txt 2>&1
echo "causal 384 racecheck rc=$?: $(grep -E 'SUMMARY' $R/san_race_causal.txt | tail -1)" | tee -a $R/sanitizer.txt
(cd $OUT && rm -f r.tgz && tar czf r.tgz r)
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_onchip_rows.py -k "variance or layernorm" 2>&1 | tail -5 > $R/pytest_rows.txt
tail -2 $R/pytest_rows.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
