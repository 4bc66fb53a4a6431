#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 .gpu/mla_wg.py check > $R/check.txt 2>&1; echo "check rc=$?"; grep -c OK $R/check.txt; grep -E "FAIL|Error|error" $R/check.txt | head -20
timeout 150 python3 .gpu/mla_wg.py time > $R/time.txt 2>&1; echo "time rc=$?"; cat $R/time.txt | grep -v "^ " | tail -12
for tool in memcheck racecheck synccheck; do
  timeout 60 compute-sanitizer --tool $tool --print-limit 5 python3 .gpu/mla_wg.py sanitize > $R/san_$tool.txt 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $R/san_$tool.txt | tr '\n' ' ')"
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py tests/test_hopper_primitives.py tests/test_decode_groups.py -k "warpgroup or wgmma or producer or decode or mla" > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -3 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -12
cd $OUT && tar czf r.tgz r && rm -rf r
