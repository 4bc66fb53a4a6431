#!/bin/bash
# session 9, call 5: host cost of a call after the launch caches; short prefill kernels again; decode against cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
timeout 60 python3 .gpu/prof.py > $R/prof.txt 2>&1; grep "per call" $R/prof.txt
timeout 120 python3 .gpu/small.py attn_global,attn_causal "tma=off;" 1024 2048 2>&1 | F | tee $R/small.txt
(cd $OUT && tar czf r.tgz r)
timeout 150 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_window decode "" 2>&1 | F | tee $R/decode.txt
timeout 60 python3 .gpu/tune.py attn_global decode_b32 "" 2>&1 | F | tee -a $R/decode.txt
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "bulk and global" 2>&1 | tail -2 > $R/pytest.txt; tail -1 $R/pytest.txt
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
