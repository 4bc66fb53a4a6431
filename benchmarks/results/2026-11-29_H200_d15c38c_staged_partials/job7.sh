#!/bin/bash
# session 17, call 7: stall reasons of polyfuse's decode (default, one-warp) and the warp-split experiment
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
M=""
for r in barrier long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle membar dispatch_stall no_instruction not_selected selected sleeping branch_resolving drain imc_miss misc tex_throttle; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
timeout 300 ncu --kernel-name regex:"polyfuse|wdec" --launch-skip 0 --launch-count 9 --metrics gpu__time_duration.sum,smsp__inst_executed.sum$M python3 .gpu/wprof.py > $OUT/ncu_stalls.txt 2>&1
grep -E "^  [a-z_]|stalled|duration" $OUT/ncu_stalls.txt | awk '!seen[$0]++' | head -80
