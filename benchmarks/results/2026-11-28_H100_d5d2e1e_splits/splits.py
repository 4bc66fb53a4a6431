"""Decode: kernels of this commit with decode_min_split 1024 (default) / 512 / 256, built in one process, timed
alternately (two rounds, do_bench median), outputs compared to the default's; cases name:preset or name:preset:Skv."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule, gpu_decode_tiling
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
VARIANTS = {m: GpuTuning(decode_min_split=m) for m in (1024, 512, 256)}
for case in sys.argv[1].split(","):
    name, preset, *skv = case.split(":")
    op = ops.get(name)
    sizes = {**op.presets[preset], **({"Skv": int(skv[0])} if skv else {})}
    inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
    kernels, splits = {}, {}
    for v, t in VARIANTS.items():
        sch = default_schedule(name, "decode", op.program("decode", **sizes), target="cuda", device=dev, tuning=t)
        kernels[v] = build(sch, "cuda", fp_contract=True)
        splits[v] = len(kernels[v].kernel_source.launches)
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
    line = " | ".join(f"min_split {v}: {best[v] * 1000:.1f} us ({splits[v]} launches, x{best[1024] / best[v]:.3f}, "
                      f"diff {(outs[v] - outs[1024]).abs().max().item():.1e})" for v in kernels)
    print(f"{name} {preset} Skv={sizes['Skv']}: {line}", flush=True)
