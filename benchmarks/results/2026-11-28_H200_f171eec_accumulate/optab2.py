"""Prefill at the bench sizes: each op's kernel under several option sets (same commit, same inputs), timed
alternately twice, min of do_bench medians; ms, TFLOP/s, ratio to the first set, max |diff| to the first set."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
from polyfuse.bench import baselines as torch_ops
dev = loader("cuda").device_spec()
configs = [dict((kv.split("=")[0], kv.split("=")[1] == "on") for kv in c.split(",") if kv) for c in sys.argv[2].split(";")]
extra = dict(kv.split("=") for kv in sys.argv[3:])
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **{k: int(v) for k, v in extra.items()}}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, "prefill", sizes, 1.0).items()}
    flops = torch_ops.flops(name, "prefill", sizes)
    kernels = []
    for c in configs:
        o = CodegenOptions(**c)
        sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=dev, options=o)
        kernels.append(build(sch, "cuda", fp_contract=True, codegen=o))
    times = [[] for _ in kernels]
    outs = [None] * len(kernels)
    for rnd in range(2):
        for i, k in enumerate(kernels):
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            times[i].append(do_bench(lambda: k(*ins, *out), warmup=25, rep=100, return_mode="median"))
            outs[i] = out
    t0 = min(times[0])
    parts = []
    for i, c in enumerate(configs):
        t = min(times[i])
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], outs[i]))
        parts.append(f"[{','.join(f'{k}={int(v)}' for k, v in c.items()) or 'default'}] {t:.4f} ms {flops/t/1e9:.0f} TF/s x{t0/t:.3f} d={diff:.1e}")
    print(f"{name} {sizes}: " + " | ".join(parts), flush=True)
