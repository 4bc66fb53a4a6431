#!/bin/bash
# session 11, call 5 (tree 10f3e35): the library table of every prefill entry; correctness of the final tree
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $R/gpu.txt
timeout 280 python3 benchmarks/gpu_bench.py --ops attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_alibi,attn_softcap,attn_window --modes prefill --no-reference --out $R/bench > $R/bench.txt 2>&1
echo "bench rc=$?"; grep -E "^\| attn" $R/bench/gpu_bench.md | cut -d'|' -f2,5,8,9,12,13
timeout 120 python3 benchmarks/gpu_check.py --sizes test --inputs all --ops attn_global,attn_norm_inside,attn_causal,attn_gqa --out $R/check > $R/gpu_check.txt 2>&1
echo "check rc=$?"; tail -1 $R/gpu_check.txt
timeout 120 compute-sanitizer --tool memcheck python3 .gpu/san.py attn_global prefill "" Hq=16 Hkv=16 Sq=3000 Skv=3000 D=64 Dv=64 > $R/san_global_3000.txt 2>&1
grep -hE "ERROR SUMMARY|all OK|FAILS" $R/san_global_3000.txt
cd $OUT && tar czf r.tgz r && rm -rf r
