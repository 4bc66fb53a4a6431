#!/bin/bash
# session 8, call 1: where rows and decode stand on this card (HEAD), exact-build identity of row groups, ncu of two row kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product"; }
FP_CONTRACT=0 timeout 80 python3 .gpu/tune.py attn_causal,attn_window,attn_global decode "row_groups=off;" 2>&1 | F | tee $R/ab_exact.txt
timeout 200 python3 benchmarks/gpu_bench.py --ops softmax,softmax_sum,logsumexp,rmsnorm_amax,layernorm_stats,variance,sum_sum,l2norm_stable,moe_routing --out $R/rows > $R/rows.log 2>&1; echo "rows rc=$?" >> $R/rows.log
(cd $OUT && tar czf r.tgz r)
for op in logsumexp sum_sum; do
  timeout 60 ncu --set full --import-source no -k regex:polyfuse_ -s 1 -c 1 python3 .gpu/one.py $op default > $R/ncu_$op.txt 2>&1
  cp /tmp/one_src.cu $R/src_$op.cu
done
cd $OUT && rm -f r.tgz && tar czf r.tgz r && rm -rf r
