"""Build one operator's kernel at a preset (default options, or opt=on/off) and launch it 3 times (for ncu).
usage: one.py OP PRESET [opt=on ...] [SIZE=N ...]"""
import sys
import torch
from polyfuse import ops
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
name, preset = sys.argv[1], sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
from polyfuse.ops.gpu_tuning import GpuTuning
import dataclasses
tf = {f.name for f in dataclasses.fields(GpuTuning)}
opts = {k: v == "on" for k, v in (a.split("=") for a in sys.argv[3:]) if k.islower() and k not in tf}
tune = GpuTuning(**{k: int(v) for k, v in (a.split("=") for a in sys.argv[3:]) if k in tf})
extra = {k: int(v) for k, v in (a.split("=") for a in sys.argv[3:]) if not k.islower()}
op = ops.get(name)
sizes = {**op.presets[preset], **extra}
o = CodegenOptions(**opts)
dev = loader("cuda").device_spec()
k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev, options=o, tuning=tune), "cuda", fp_contract=True, codegen=o)
inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
ins = [inputs[a.name] for a in k.inputs]
out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
for _ in range(3):
    k(*ins, *out)
torch.cuda.synchronize()
open("/tmp/one_src.cu", "w").write(k.kernel_source.text)
print("done", name, preset, sizes)
