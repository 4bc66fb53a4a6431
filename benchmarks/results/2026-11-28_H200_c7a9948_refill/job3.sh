#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
timeout 170 python3 benchmarks/gpu_bench.py --ops attn_global,attn_norm_inside,attn_gqa,attn_causal --modes decode --out $R/decode 2>&1 | F | tail -3
timeout 330 python3 benchmarks/gpu_bench.py --ops attn_causal,attn_global --modes prefill --sizes sweep --no-reference --out $R/sweep 2>&1 | F | tail -3
rm -f $R/*/*.png
# SASS counts of every prefill/decode cubin built in this run
for f in $(find /tmp/pfcache -name "*.cubin"); do
  cuobjdump -sass $f > /tmp/s.txt 2>/dev/null
  for k in $(grep -o "Function : [a-z_0-9]*" /tmp/s.txt | awk '{print $3}' | sort -u); do
    awk -v k="$k" '/Function : /{on=($3==k)} on' /tmp/s.txt > /tmp/k.txt
    echo "$k $(basename $f): HGMMA=$(grep -c HGMMA /tmp/k.txt) HMMA=$(grep -c 'HMMA' /tmp/k.txt) LDGSTS=$(grep -c LDGSTS /tmp/k.txt) UTMALDG=$(grep -c UTMALDG /tmp/k.txt) UBLKCP=$(grep -c UBLKCP /tmp/k.txt) BAR=$(grep -c 'BAR\.' /tmp/k.txt) MUFU.EX2=$(grep -c 'MUFU.EX2' /tmp/k.txt) instr=$(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/k.txt)"
  done
done | sort -u > $R/sass_counts.txt
wc -l $R/sass_counts.txt; head -30 $R/sass_counts.txt
grep -h "^| attn" $R/decode/gpu_bench.md $R/sweep/gpu_bench.md | cut -d'|' -f2-5,8-14
cd $OUT && tar czf r.tgz r && rm -rf r
