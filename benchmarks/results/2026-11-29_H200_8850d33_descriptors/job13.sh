#!/bin/bash
# session 13, call 1: decode key tiles (64/32 keys double-buffered) against the default; moe_routing profile and tiles
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
for op in attn_global attn_causal attn_gqa attn_norm_inside attn_softcap attn_alibi attn_window; do
  timeout 80 python3 .gpu/tune.py $op decode ";decode_tile=64;decode_tile=64,decode_min_split=512;decode_tile=32" 2>&1 | F | tee -a $R/decode_tiles.txt
done
timeout 60 ncu --set full -k regex:polyfuse_ -s 1 -c 1 python3 .gpu/one.py moe_routing default > $R/ncu_moe.txt 2>&1
COMPILE=1 timeout 120 python3 .gpu/tune.py moe_routing default ";gate_tile=32x256;gate_tile=16x128;gate_tile=32x128" 2>&1 | F | tee -a $R/moe_tiles.txt
timeout 60 ncu --set full -k regex:polyfuse_ -s 1 -c 1 python3 .gpu/one.py attn_global decode > $R/ncu_decode128.txt 2>&1
timeout 60 ncu --set full -k regex:polyfuse_ -s 1 -c 1 python3 .gpu/one.py attn_global decode decode_tile=64 > $R/ncu_decode64.txt 2>&1
timeout 100 python3 .gpu/tune.py attn_global decode_b32 ";decode_tile=64" 2>&1 | F | tee -a $R/decode_tiles.txt
cd $OUT && tar czf r.tgz r && rm -rf r
