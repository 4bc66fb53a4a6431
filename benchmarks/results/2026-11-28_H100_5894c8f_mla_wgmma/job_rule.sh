#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
ROOT=$PWD; R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
export PYTHONPATH=/tmp/site:$ROOT
CASES=32:4096,8:4096,4:4096,1:4096,32:1024,4:32768
timeout 100 python3 .gpu/mla_rule.py check > $R/check.txt 2>&1; echo "check rc=$? OK=$(grep -c ': OK' $R/check.txt) FAIL=$(grep -c FAIL $R/check.txt)"; grep -E "FAIL|Error" $R/check.txt | head
timeout 120 python3 .gpu/mla_rule.py time new $CASES --compile > $R/time_new.txt 2>&1; echo "time rc=$?"; grep -E "^new" $R/time_new.txt
(cd .base && PYTHONPATH=/tmp/site:$ROOT/.base timeout 60 python3 $ROOT/.gpu/mla_rule.py time base $CASES > $R/time_base.txt 2>&1; echo "base rc=$?"); grep -E "^base" $R/time_base.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_groups.py tests/test_fold_combine.py -k "decode or mla" -x > $R/pytest_gpu.txt 2>&1
echo "pytest rc=$?"; tail -2 $R/pytest_gpu.txt; grep -E "^FAILED|^E  " $R/pytest_gpu.txt | head -8
cd $OUT && tar czf r.tgz r && rm -rf r
