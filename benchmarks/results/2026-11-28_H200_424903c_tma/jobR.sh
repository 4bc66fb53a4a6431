#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
M="--metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
timeout 60 ncu $M -c 1 -s 2 python3 .gpu/copy_bytes.py > $R/ncu_copy.txt 2>&1; echo "copy rc=$?"; grep -E "dram__|gpu__time" $R/ncu_copy.txt
timeout 60 ncu $M -k regex:polyfuse -c 1 -s 2 python3 .gpu/one.py logsumexp default > $R/ncu_logsumexp_bytes.txt 2>&1; echo "lse rc=$?"; grep -E "dram__|gpu__time" $R/ncu_logsumexp_bytes.txt
cd $OUT && tar czf r.tgz r && rm -rf r
