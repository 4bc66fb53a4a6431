"""Prefill at the bench sizes: each op's kernel with a boolean codegen option off and on (same commit, same inputs),
alternately twice, median of do_bench; ms, TFLOP/s, ratio off/on (>1: on faster), same bits."""
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
option = sys.argv[2]
extra = dict(kv.split("=") for kv in sys.argv[3:])
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **{k: int(v) for k, v in extra.items()}}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, "prefill", sizes, 1.0).items()}
    flops = torch_ops.flops(name, "prefill", sizes)
    kernels = {}
    for on in (False, True):
        o = CodegenOptions(**{option: on})
        sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=dev, options=o)
        kernels[on] = build(sch, "cuda", fp_contract=True, codegen=o)
    times = {False: [], True: []}
    outs = {}
    for rnd in range(2):
        for on, k in kernels.items():
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            times[on].append(do_bench(lambda: k(*ins, *out), warmup=25, rep=100, return_mode="median"))
            outs[on] = out
    same = all(torch.equal(a, b) for a, b in zip(outs[False], outs[True]))
    t0, t1 = min(times[False]), min(times[True])
    print(f"{name} {sizes}: {option} off {t0:.4f} ms ({flops/t0/1e9:.0f} TF/s) | on {t1:.4f} ms ({flops/t1/1e9:.0f} TF/s)"
          f" | off/on {t0/t1:.3f} | same bits {same}", flush=True)
