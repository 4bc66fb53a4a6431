#!/bin/bash
# session 13, call 2: wgmma descriptors built once per product (new) against HEAD (.base): prefill + MLA decode A/B, checks
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
P=attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window
for round in 1 2; do
  for tree in base new; do
    dir=$PWD; [ $tree = base ] && dir=$PWD/.base
    (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 150 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree prefill $P) | sed "s/^/$tree r$round /" >> $R/ab.txt 2>&1
  done
done
for tree in base new base new; do
  dir=$PWD; [ $tree = base ] && dir=$PWD/.base
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 100 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree decode_b32 attn_mla_decode) | sed "s/^/$tree mla /" >> $R/ab.txt 2>&1
done
for tree in base new; do
  dir=$PWD; [ $tree = base ] && dir=$PWD/.base
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 100 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree prefill attn_global,attn_causal Sq=16384 Skv=16384) | sed "s/^/$tree 16k /" >> $R/ab.txt 2>&1
done
cat $R/ab.txt
python3 .gpu/cmp.py /tmp/o_base /tmp/o_new > $R/bits.txt; cat $R/bits.txt
export PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfcache_new
timeout 150 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops attn_global,attn_causal,attn_alibi,attn_gqa,attn_softcap,attn_window,attn_norm_inside,attn_mla_decode --out $R/check > $R/gpu_check.txt 2>&1
echo "check rc=$?"; tail -1 $R/gpu_check.txt
timeout 60 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_causal prefill "" > $R/san_causal.txt 2>&1; grep -hE "ERROR SUMMARY|all OK|FAILS" $R/san_causal.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_hopper_primitives.py tests/test_gpu.py -k "hopper or wgmma or late or accumulated or warpgroup or fragment" > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
cd $OUT && tar czf r.tgz r && rm -rf r
