#!/bin/bash
# session 18, call 5 (a50be0a): stall reasons and instructions of polyfuse's decode (default; warp split 8 x 32 keys and
# 4 x 16 keys, forced) against the hand-written warp-split experiment (wdec), attn_global decode B=1, 32768 keys
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
M=""
for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle membar dispatch_stall no_instruction not_selected selected branch_resolving; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
timeout 200 ncu --kernel-name regex:"polyfuse|wdec" --launch-skip 0 --launch-count 8 --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed$M python3 .gpu/wprof.py > $OUT/ncu_stalls.txt 2>&1
grep -E "^  [a-z_]|stalled|duration|inst_executed|warps_active|dram" $OUT/ncu_stalls.txt | awk '!seen[$0]++' | head -90
