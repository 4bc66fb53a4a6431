#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 60 python3 .gpu/tune.py attn_causal,attn_window,attn_global decode "row_groups=off;" 2>&1 | F | tee $R/ab_decode2.txt
(cd $OUT && tar czf r.tgz r)
timeout 40 compute-sanitizer --tool racecheck python3 .gpu/san.py attn_softcap decode "" Skv=512 > $R/san_softcap.txt 2>&1
echo "softcap racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY' $R/san_softcap.txt | tail -1) | $(grep 'san.py' $R/san_softcap.txt | tail -1)" | tee $R/sanitizer2.txt
grep -m3 -A6 "Error\|Race" $R/san_softcap.txt | head -30
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
