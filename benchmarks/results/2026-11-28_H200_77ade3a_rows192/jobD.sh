#!/bin/bash
# session 10, call 4 (tree 8887c74): gpu_check of the changed kernels at the test sizes (every input variant);
# a 192-row kernel with a padded last tile at a size the wave rule gives 192 (S 3000), every input variant
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt
timeout 300 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops attn_global,attn_causal,attn_alibi,attn_gqa,attn_softcap,attn_window,attn_norm_inside,attn_mla_decode,performer --out $R > $R/gpu_check.txt 2>&1
echo "gpu_check rc=$?: $(grep -c ' OK' $R/gpu_check.txt) OK, $(grep -c 'FAIL' $R/gpu_check.txt) FAIL"; tail -2 $R/gpu_check.txt
for op in attn_global attn_causal; do
  timeout 120 python3 .gpu/san.py $op prefill "" Hq=16 Hkv=16 Sq=3000 Skv=3000 D=64 Dv=64 > $R/wide_$op.txt 2>&1
  echo "$op S3000: $(grep -E 'all OK|FAILS|Error' $R/wide_$op.txt | tr '\n' ' ')"
done
cd $OUT && tar czf r.tgz r && rm -rf r
