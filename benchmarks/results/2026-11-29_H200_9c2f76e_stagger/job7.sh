#!/bin/bash
# session 16, call 7: 32bc85a: moe_routing staggered vs not vs torch.compile in three processes; row operators vs
# torch.compile in three processes; the bench's row entries and moe_routing; the device's L2 as the driver reports it
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 POLYFUSE_CACHE_DIR=/tmp/pfc
F() { grep -v "Warn\|image = \|^$\|ptxas warn\|scaled_dot_product\|warnings.warn"; }
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
python3 -c "
from polyfuse.runtime.loaders import loader
d = loader('cuda').device_spec(); print(d.describe())" > $OUT/device.txt 2>&1
python3 -c "
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import stages
from polyfuse.runtime.loaders import loader
from polyfuse.emit_cpp.target import Target
d = loader('cuda').device_spec(); op = ops.get('moe_routing'); s = op.presets['default']
print([l for l in str(stages(default_schedule('moe_routing', 'default', op.program('default', **s), target='cuda', device=d), Target('cuda', d)).plan).splitlines() if 'stagger' in l])" >> $OUT/device.txt 2>&1
cat $OUT/device.txt
for r in 1 2 3; do
  COMPILE=1 timeout 120 python3 .gpu/tune.py moe_routing default ";stagger_loops=off" 2>&1 | F >> $OUT/tune_moe.txt
  COMPILE=1 timeout 120 python3 .gpu/tune.py rmsnorm_amax,layernorm_stats,softmax default "" 2>&1 | F >> $OUT/tune_rows.txt
done
cat $OUT/tune_moe.txt $OUT/tune_rows.txt
timeout 240 python3 benchmarks/gpu_bench.py --ops softmax_sum,softmax,logsumexp,rmsnorm_amax,layernorm_stats,variance,sum_sum,l2norm_stable,moe_routing --no-reference --commit 32bc85a --out $OUT/bench > $OUT/bench.log 2>&1
rm -f $OUT/*/*.png
grep "^| " $OUT/bench/gpu_bench.md | cut -d'|' -f2,5,6,10,13
