#!/bin/bash
# session 12, call 5: streaming loads on/off in one process (decode and rows), torch.compile / SDPA beside
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
COMPILE=1 timeout 200 python3 .gpu/tune.py logsumexp,softmax_sum,softmax,rmsnorm_amax,layernorm_stats,variance,sum_sum,l2norm_stable,moe_routing default ";streaming_loads=off" > $R/ab_rows.txt 2>&1
cat $R/ab_rows.txt
timeout 250 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_alibi,attn_window,attn_mla_decode decode ";streaming_loads=off" > $R/ab_decode.txt 2>&1
cat $R/ab_decode.txt
timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside decode_b32 ";streaming_loads=off" >> $R/ab_decode.txt 2>&1
tail -2 $R/ab_decode.txt
cd $OUT && tar czf r.tgz r && rm -rf r
