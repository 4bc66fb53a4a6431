#!/bin/bash
# Issue 23 item 2: decode's K/V tiles copied one iteration ahead (stream_ahead). GPU tests, sanitizers, A/B of
# the option (and 64-key tiles) on this commit, the decode bench with cuDNN/Flex/compile, and the decode sweep of
# this commit and of .base (main before) in one run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -c "import matplotlib, tqdm" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt

# 1. GPU tests: ahead vs at-once bit for bit and vs NumPy; every decode operator at the test sizes.
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "staging_variants or decode" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -3 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -12

# 2. compute-sanitizer on kernels with tiles copied ahead: global decode (3 splits of tiles, a masked last tile), MLA at the test size.
for SPEC in "attn_global --mode decode --set B=1 --set Skv=3001 --set D=64 --set Dv=64" "attn_mla_decode --mode decode"; do
  for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool python3 -m polyfuse check $SPEC --backend cuda --inputs leading_zeros > $R/san.txt 2>&1
    echo "$SPEC $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san.txt | tail -1) | $(grep -iE ' ok|fail' $R/san.txt | tail -1)"
  done
done | tee $R/sanitizer.txt

# 3. A/B on this commit: stream_ahead off / on, 128- and 64-key tiles.
timeout 150 python3 .gpu/ahead.py attn_global:decode,attn_global:decode_b32,attn_causal:decode,attn_gqa:decode,attn_softcap:decode,attn_norm_inside:decode,attn_mla_decode:decode,attn_mla_decode:decode_b32 2>&1 | grep -v Warning | tee $R/ahead_ab.txt

# 4. Decode bench (bench sizes) with the baselines, this commit.
timeout 150 python3 benchmarks/gpu_bench.py --modes decode,decode_b32 --sizes bench --warmup 10 --rep 50 --out $R/bench > $R/bench.log 2>&1; echo "bench rc=$?"
rm -f $R/bench/*.png; grep '^| attn' $R/bench/gpu_bench.md | cut -d'|' -f2,3,5,6,7,8,9,13 | tee $R/bench_short.txt

# 5. Decode sweep, this commit then .base, same GPU.
DEC=attn_global,attn_causal,attn_gqa,attn_norm_inside,attn_mla_decode
BENCH="--no-compile --no-reference --warmup 5 --rep 25"
for who in new base; do
  if [ $who = base ]; then cd $ROOT/.base; export PYTHONPATH=/tmp/site:$PWD; fi
  timeout 80 python3 benchmarks/gpu_bench.py --ops $DEC --modes decode --sizes sweep $BENCH --commit $who --out $R/${who}_sweep > $R/${who}_sweep.log 2>&1; echo "$who sweep rc=$?"
  rm -f $R/${who}_sweep/*.png
done
cd $ROOT; export PYTHONPATH=/tmp/site:$PWD
for who in new base; do echo "== $who"; grep -h '^| attn' $R/${who}_sweep/gpu_bench.md | cut -d'|' -f2,3,4,5; done 2>&1 | tee $R/sweep_ab.txt
cd $OUT && tar czf r.tgz r && rm -rf r
