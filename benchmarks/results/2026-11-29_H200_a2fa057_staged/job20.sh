#!/bin/bash
# session 14, call 2: staged epilogue stores + kept tile copied after the barriers (new) against HEAD 081b2c8 (.base)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
P=attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window
ab() {  # ab LABEL PRESET OPS [SIZES]
  for tree in base new; do
    dir=$PWD; [ $tree = base ] && dir=$PWD/.base
    (cd $dir && PYTHONPATH=/tmp/site:$dir POLYFUSE_CACHE_DIR=/tmp/pfcache_$tree timeout 150 python3 $OLDPWD/.gpu/ab.py /tmp/o_$tree "${@:2}") 2>&1 | F | sed "s/^/$tree $1 /" >> $R/ab.txt
  done
}
ab r1 prefill $P
ab r2 prefill $P
ab s1k prefill attn_global,attn_causal Sq=1024 Skv=1024
ab s2k prefill attn_global,attn_causal Sq=2048 Skv=2048
ab s8k prefill attn_global,attn_causal Sq=8192 Skv=8192
ab s16k prefill attn_global,attn_causal Sq=16384 Skv=16384
cat $R/ab.txt
python3 .gpu/cmp.py /tmp/o_base /tmp/o_new > $R/bits.txt; cat $R/bits.txt
export PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfcache_new
timeout 200 python3 .gpu/tune.py $P prefill ";staged_stores=off" 2>&1 | F | tee $R/staged_onoff.txt
timeout 80 python3 .gpu/stamps.py attn_global,attn_causal prefill 2>&1 | F | tee $R/stamps.txt
cd $OUT && tar czf r.tgz r && rm -rf r
