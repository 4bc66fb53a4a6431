#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
V="decode_tile=128;warps=4,decode_tile=64,decode_min_split=512,decode_blocks_per_sm=16;warps=2,decode_tile=64,decode_min_split=256,decode_blocks_per_sm=32;warps=1,decode_tile=32,decode_min_split=256,decode_blocks_per_sm=32;warps=4,decode_tile=128,decode_blocks_per_sm=16;warps=2,decode_tile=32,decode_min_split=256,decode_blocks_per_sm=32"
timeout 240 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap decode "$V" 2>&1 | F | tee $R/tune_decode.txt
timeout 120 python3 .gpu/tune.py attn_global,attn_norm_inside decode_b32 "$V" 2>&1 | F | tee $R/tune_b32.txt
timeout 220 python3 benchmarks/gpu_bench.py --ops attn_softcap,attn_global,attn_norm_inside --modes prefill --no-reference --out $R/prefill 2>&1 | F | tail -30
cd $OUT && tar czf r.tgz r && rm -rf r
