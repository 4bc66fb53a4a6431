#!/bin/bash
# session 16, call 8: the bench of issue 23's entries at HEAD (rounds alternating over the candidates): row operators,
# moe_routing, decode at B=1 and B=32
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
C=08863d8
timeout 200 python3 benchmarks/gpu_bench.py --ops softmax_sum,softmax,logsumexp,rmsnorm_amax,layernorm_stats,variance,sum_sum,l2norm_stable,moe_routing --no-reference --commit $C --out $OUT/rows > $OUT/rows.log 2>&1
timeout 330 python3 benchmarks/gpu_bench.py --ops attn_global,attn_norm_inside,attn_causal,attn_gqa,attn_softcap,attn_window,attn_alibi,attn_mla_decode --modes decode,decode_b32 --no-reference --commit $C --out $OUT/decode > $OUT/decode.log 2>&1
rm -f $OUT/*/*.png
for f in rows decode; do grep "^| " $OUT/$f/gpu_bench.md | cut -d'|' -f2,3,5,7,8,10,12,14; done
