#!/bin/bash
# session 17, call 8: d15c38c bench (decode and rows entries), staged partials across the decode sweep's keys
# (option on/off = this commit / the one before, same process), the warp-split experiment with one-warp blocks
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/device.txt
for s in 1024 4096; do timeout 120 python3 .gpu/tune.py attn_global,attn_norm_inside decode ";stage_partials=off" Skv=$s 2>&1 | F >> $OUT/tune_sweep.txt; done
timeout 200 python3 .gpu/wdec.py decode "1,2,64,32;1,3,64,32;1,2,128,32;2,2,32,32;8,2,8,32" 2>&1 | F > $OUT/wdec_onewarp.txt
timeout 220 python3 benchmarks/gpu_bench.py --ops attn_global,attn_norm_inside,attn_causal,attn_gqa,attn_window,attn_alibi,attn_softcap,attn_mla_decode --modes decode,decode_b32 --no-reference --commit d15c38c --out $OUT/bench > $OUT/bench.log 2>&1
rm -f $OUT/*/*.png
cat $OUT/tune_sweep.txt $OUT/wdec_onewarp.txt
grep "^| " $OUT/bench/gpu_bench.md | head -60
