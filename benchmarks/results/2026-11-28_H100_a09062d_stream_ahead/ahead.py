"""Decode at the bench presets: kernels of this commit with stream_ahead off / on, and on with 64-key tiles,
built in one process, timed alternately (two rounds, do_bench median), outputs compared to the 'off' kernel."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
VARIANTS = {"off": (CodegenOptions(stream_ahead=False), None), "ahead": (CodegenOptions(), None),
            "ahead_t64": (CodegenOptions(), GpuTuning(decode_tile=64)),
            "off_t64": (CodegenOptions(stream_ahead=False), GpuTuning(decode_tile=64))}
cases = [c.split(":") for c in sys.argv[1].split(",")]
for name, preset in cases:
    op = ops.get(name)
    sizes = op.presets[preset]
    inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
    kernels = {}
    for v, (o, t) in VARIANTS.items():
        sch = default_schedule(name, "decode", op.program("decode", **sizes), target="cuda", device=dev, tuning=t,
                               options=o)
        kernels[v] = build(sch, "cuda", fp_contract=True, codegen=o)
    times = {v: [] for v in kernels}
    outs = {}
    for rnd in range(2):
        for v, k in kernels.items():
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda")
                   for a in k.outputs]
            times[v].append(do_bench(lambda: k(*ins, *out), warmup=10, rep=50, return_mode="median"))
            outs[v] = out[0].float()
    best = {v: min(ts) for v, ts in times.items()}
    line = " | ".join(f"{v} {best[v] * 1000:.1f} us (x{best['off'] / best[v]:.3f}, diff {(outs[v] - outs['off']).abs().max().item():.1e})"
                      for v in kernels)
    print(f"{name} {preset}: {line}", flush=True)
