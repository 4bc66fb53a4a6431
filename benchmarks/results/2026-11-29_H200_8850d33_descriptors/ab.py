"""Time each operator's default kernel (this tree) and save its outputs, for an A/B of two trees in one call.
usage: ab.py OUTDIR PRESET OP[,OP...] [SIZE=N ...]   (prints one line per op: median µs of 3 do_bench rounds)"""
import os, sys
import numpy as np
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
out_dir, preset = sys.argv[1], sys.argv[2]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}
os.makedirs(out_dir, exist_ok=True)
dev = loader("cuda").device_spec()
mode = "decode" if preset.startswith("decode") else preset
for name in sys.argv[3].split(","):
    op = ops.get(name)
    if preset not in op.presets:
        continue
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", fp_contract=True)
    ins = [inputs[a.name] for a in k.inputs]
    outs = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    fn = lambda: k(*ins, *outs)
    t = min(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))
    np.save(f"{out_dir}/{name}_{preset}.npy", outs[0].float().cpu().numpy())
    print(f"{name} {preset} {extra}: {t*1e3:.1f}us", flush=True)
