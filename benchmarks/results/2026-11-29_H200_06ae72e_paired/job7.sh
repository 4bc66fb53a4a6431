#!/bin/bash
# session 15, call 7: 06ae72e: the paired-block GPU tests (fixed sizes), sanitizer on paired softcap
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_paired_blocks.py > $OUT/pytest_gpu.txt 2>&1
tail -3 $OUT/pytest_gpu.txt
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --print-limit 5 python3 .gpu/san.py attn_softcap prefill "" Sq=300 Skv=300 D=64 Dv=64 > $OUT/san_softcap_$tool.txt 2>&1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|san.py" $OUT/san_softcap_$tool.txt | tail -2
done
