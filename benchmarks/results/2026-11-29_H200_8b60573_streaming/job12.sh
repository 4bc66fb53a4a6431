#!/bin/bash
# session 12, call 12: cp.async with the L2::256B prefetch size (new) against HEAD (base), alternating processes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
for tree in base new base new; do
  dir=$PWD; [ $tree = base ] && dir=$PWD/.base
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfc_$tree timeout 70 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree decode attn_global,attn_causal,attn_gqa,attn_window) | sed "s/^/$tree /" >> $R/ab_l2pref.txt 2>&1
  (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfc_$tree timeout 40 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree default moe_routing) | sed "s/^/$tree /" >> $R/ab_l2pref.txt 2>&1
done
cat $R/ab_l2pref.txt; python3 .gpu/cmp.py /tmp/o_base /tmp/o_new
cd $OUT && tar czf r.tgz r && rm -rf r
