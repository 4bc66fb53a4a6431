"""Run one operator's kernel under given codegen options on every input variant, against NumPy (for compute-sanitizer).
usage: san.py OP MODE "opt=off,..." [SIZE=N ...]"""
import sys
from polyfuse import ops
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.variants import VARIANTS
from polyfuse.pipeline import build
name, mode = sys.argv[1], sys.argv[2]
opts = dict((kv.split("=")[0], kv.split("=")[1] == "on") for kv in sys.argv[3].split(",") if kv)
op = ops.get(name)
sizes = {**op.sizes(mode), **{k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}}
o = CodegenOptions(**opts)
k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", options=o), "cuda", sizes=sizes, codegen=o, werror=True)
marks = [m for m in ("into the buffer", "the next iteration's tiles") if m in k.kernel_source.text]
bad = 0
for variant in VARIANTS:
    inputs = op.inputs(3, mode, sizes, 1.0, variant)
    r = ops.compare(k.run(inputs), op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
    bad += not r.ok
    print(name, mode, sizes, variant, marks, "OK" if r.ok else "FAIL " + r.line(), flush=True)
print("san.py", name, "FAILS" if bad else "all OK")
