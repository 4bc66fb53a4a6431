#!/bin/bash
# session 9, call 6: Nsight Compute of prefill global vs norm_inside (TMA), and of the read-only rows (logsumexp, softmax_sum) vs softmax
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfcache
R=$OUT/r; mkdir -p $R
M="--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats"
for spec in "attn_global prefill" "attn_norm_inside prefill" "logsumexp default" "softmax_sum default" "softmax default"; do
  set -- $spec
  timeout 90 ncu $M -k regex:polyfuse -c 1 -s 2 python3 .gpu/one.py $1 $2 > $R/ncu_$1.txt 2>&1
  echo "$1 rc=$?: $(grep -E 'Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|No Eligible' $R/ncu_$1.txt | tr -s ' ' | tr '\n' ';' | cut -c1-400)"
done
cd $OUT && tar czf r.tgz r && rm -rf r
