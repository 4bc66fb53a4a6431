"""Run one decode operator's warp-split kernel (GpuTuning keys) on every input variant against NumPy (for
compute-sanitizer).  usage: sanw.py OP "decode_warp_splits=8,..." [SIZE=N ...]"""
import sys
from polyfuse import ops
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.pipeline import build
name = sys.argv[1]
tn = GpuTuning(**{a: int(b) for a, b in (kv.split("=") for kv in sys.argv[2].split(",") if kv)})
op = ops.get(name)
sizes = {**op.sizes("decode"), **{k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3:])}}
k = build(default_schedule(name, "decode", op.program("decode", **sizes), target="cuda", tuning=tn), "cuda", sizes=sizes, werror=True)
assert "pf_group" in k.kernel_source.text
bad = 0
for variant in VARIANTS:
    inputs = op.inputs(3, "decode", sizes, 1.0, variant)
    r = ops.compare(k.run(inputs), op.reference(inputs, "decode", sizes), op.tolerance("decode", sizes))
    bad += not r.ok
    print(name, sizes, variant, "OK" if r.ok else "FAIL " + r.line(), flush=True)
print("sanw.py", name, "FAILS" if bad else "all OK")
