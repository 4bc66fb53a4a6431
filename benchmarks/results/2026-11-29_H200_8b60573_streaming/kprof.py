"""Per-kernel device times of one polyfuse build (torch.profiler, 20 calls): which of a fused program's launches
takes the time.  usage: kprof.py OP PRESET "tuning/codegen keys k=v,..." [SIZE=N ...]"""
import dataclasses, sys, torch
from polyfuse import ops
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
OPTS = {f.name for f in dataclasses.fields(CodegenOptions)}
dev = loader("cuda").device_spec()
name, preset = sys.argv[1], sys.argv[2]
c = dict(kv.split("=") for kv in sys.argv[3].split(",") if kv)
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}
mode = "decode" if preset.startswith("decode") else preset
op = ops.get(name)
sizes = {**op.presets[preset], **extra}
tn = GpuTuning(**{a: (b == "True" if b in ("True", "False") else int(b)) for a, b in c.items() if a not in OPTS})
o = CodegenOptions(**{a: int(b) if b.isdigit() else b == "on" for a, b in c.items() if a in OPTS})
k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev, tuning=tn, options=o), "cuda", fp_contract=True, codegen=o)
inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
ins = [inputs[a.name] for a in k.inputs]
out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
for _ in range(5): k(*ins, *out)
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
    for _ in range(20): k(*ins, *out)
    torch.cuda.synchronize()
print(f"{name} {preset} {c} {extra}")
for e in p.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA or getattr(e, "device_time", 0):
        print(f"  {e.key[:60]:60s} n={e.count} avg={e.device_time:.1f}us")
