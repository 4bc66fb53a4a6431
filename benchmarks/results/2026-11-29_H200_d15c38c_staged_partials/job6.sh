#!/bin/bash
# session 17, call 6: ncu of polyfuse's decode (default, one-warp) against the warp-split experiment; SASS sizes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
timeout 300 ncu --kernel-name regex:"polyfuse|wdec" --launch-skip 0 --launch-count 9 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats --metrics sm__inst_executed.sum,smsp__inst_executed.sum,sm__cycles_elapsed.max python3 .gpu/wprof.py > $OUT/ncu.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Achieved Occupancy|Stall|Registers Per|Block Size|Grid Size|Waves|inst_executed|Executed Ipc|Warp Cycles Per Issued|Issued Warp" $OUT/ncu.txt | head -120
for f in $(find /tmp/pfc -name "*.cubin" | head -4); do echo "== $f"; cuobjdump -sass $f | grep -cE "^\s+/\*[0-9a-f]{4}\*/"; done
python3 - <<'PY'
src=open('.gpu/wdec.py').read(); open('/tmp/wdec.cu','w').write(src.split('SRC = r"""')[1].split('"""')[0])
PY
nvcc -std=c++17 -arch=sm_90a -DWARPS=8 -DNST=2 -DSPLITS=8 -DTK=32 -DS=32768 -DD=64 -cubin -o /tmp/wd.cubin /tmp/wdec.cu && echo "== wdec" && cuobjdump -sass /tmp/wd.cubin | grep -cE "^\s+/\*[0-9a-f]{4}\*/"
