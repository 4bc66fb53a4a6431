#!/bin/bash
# session 14, call 4: f8cf00d (+ test fix): the staged-store GPU tests, then gpu_bench prefill at bench sizes and the S sweep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_staged_stores.py > $R/pytest.txt 2>&1; tail -2 $R/pytest.txt
C=$(git rev-parse --short HEAD 2>/dev/null || echo f8cf00d)
timeout 270 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window --modes prefill --no-reference --commit f8cf00d --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$?"
timeout 230 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal --modes prefill --sizes sweep --no-reference --commit f8cf00d --out $R/sweep > $R/sweep.log 2>&1; echo "sweep rc=$?"
cat $R/bench/gpu_bench.md $R/sweep/gpu_bench.md 2>/dev/null | grep -v "^$" | head -60
cd $OUT && tar czf r.tgz r && rm -rf r
