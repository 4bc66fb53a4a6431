#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
F() { grep -v "Warn\|image = \|^$\|ptxas warn"; }
V="decode_warps=8;decode_warps=4;decode_warps=2"
timeout 230 python3 .gpu/tune.py attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_softcap,attn_mla_decode,attn_alibi,attn_window decode "$V" 2>&1 | F | tee $R/tune_decode.txt
timeout 100 python3 .gpu/tune.py attn_global,attn_norm_inside,attn_mla_decode decode_b32 "$V" 2>&1 | F | tee $R/tune_b32.txt
timeout 120 ncu --set full --import-source no -k regex:polyfuse_attn_global_k0 -s 1 -c 1 -o $R/gp python3 .gpu/one.py attn_global prefill > $R/ncu_log.txt 2>&1; echo "ncu rc=$?"
ncu -i $R/gp.ncu-rep --print-details all > $R/gp_details.txt 2>&1
ncu -i $R/gp.ncu-rep --page source --csv --print-source sass > $R/gp_sass.csv 2>&1
cp /tmp/one_src.cu $R/gp_src.cu
timeout 100 ncu --set full --import-source no -k regex:polyfuse_attn_global_k0 -s 1 -c 1 -o $R/gd python3 .gpu/one.py attn_global decode > $R/ncu_log2.txt 2>&1; echo "ncu rc=$?"
ncu -i $R/gd.ncu-rep --print-details all > $R/gd_details.txt 2>&1
ncu -i $R/gd.ncu-rep --page source --csv --print-source sass > $R/gd_sass.csv 2>&1
cp /tmp/one_src.cu $R/gd_src.cu
rm -f $R/*.ncu-rep
cd $OUT && tar czf r.tgz r && rm -rf r
