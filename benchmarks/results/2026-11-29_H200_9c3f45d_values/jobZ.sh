#!/bin/bash
# session 11, call 8: MLA decode on the warpgroup path (its source changed with the fragment-value rewrites)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc timeout 90 python3 .gpu/san.py attn_mla_decode decode "" B=8 H=128 Skv=1024 Dv=512 Drope=64 > $R/check_mla_wg.txt 2>&1
tail -2 $R/check_mla_wg.txt
for tree in base new base new; do
  dir=$PWD; [ $tree = base ] && dir=$PWD/.base
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfc_$tree timeout 60 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree decode_b32 attn_mla_decode) | sed "s/^/$tree /" >> $R/ab_mla.txt 2>&1
done
cat $R/ab_mla.txt; python3 .gpu/cmp.py /tmp/o_base /tmp/o_new
cd $OUT && tar czf r.tgz r && rm -rf r
