"""Launch one decode operator's polyfuse kernel and cuDNN's SDPA 3 times each (for ncu).
usage: dprof.py OP PRESET"""
import sys
import torch
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
name, preset = sys.argv[1], sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
op = ops.get(name)
sizes = dict(op.presets[preset])
dev = loader("cuda").device_spec()
k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", fp_contract=True)
inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
ins = [inputs[a.name] for a in k.inputs]
out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
alts = baselines.alternatives(name, inputs, mode, sizes)
for _ in range(3):
    k(*ins, *out)
for lab in ("sdpa:CUDNN_ATTENTION", "sdpa:FLASH_ATTENTION"):
    fn = alts.get(lab)
    if callable(fn):
        for _ in range(3):
            fn()
torch.cuda.synchronize()
print("done")
