"""MLA decode: the default schedule of the tree on PYTHONPATH (and, with --forced, warpgroup rows at every batch)
timed with torch.compile beside it; `check` compares the default kernels with NumPy on every input variant."""
import dataclasses, sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
from polyfuse.bench import baselines

NAME = "attn_mla_decode"
op = ops.get(NAME)
dev = loader("cuda").device_spec()


def kernel(sizes, tuning=None):
    sch = default_schedule(NAME, "decode", op.program("decode", **sizes), target="cuda", device=dev, tuning=tuning)
    return build(sch, "cuda", fp_contract=True)


def bench(k, inputs):
    ins = [inputs[a.name] for a in k.inputs]
    out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    return min(do_bench(lambda: k(*ins, *out), warmup=10, rep=100, return_mode="median") for _ in range(2))


label = sys.argv[2] if len(sys.argv) > 2 else "tree"
if sys.argv[1] == "check":
    for b, skv in ((4, 256), (8, 1024), (32, 4096)):
        sizes = op.sizes("decode", {**op.presets["decode"], "B": b, "Skv": skv})
        k = kernel(sizes)
        plan = [l for l in k.kernel_source.text.splitlines() if "wgmma" in l][:1]
        tol = op.tolerance("decode", sizes)
        for magnitude in op.magnitudes:
            for variant in ("random", "leading_zeros", "special", "ties"):
                inputs = op.inputs(3, "decode", sizes, magnitude, variant)
                ref = op.reference(inputs, "decode", sizes)
                got = k.run(inputs)
                r = ops.compare({n: got[n] for n in ref}, ref, tol)
                print(f"check B={b} Skv={skv} wgmma={bool(plan)} {variant}@{magnitude:g}: "
                      f"{'OK' if r.ok else 'FAIL'} {r.line()}", flush=True)
else:
    for case in sys.argv[3].split(","):
        b, skv = (int(x) for x in case.split(":"))
        sizes = op.sizes("decode", {**op.presets["decode"], "B": b, "Skv": skv})
        inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
        line = f"{label} B={b} Skv={skv} default={bench(kernel(sizes), inputs) * 1000:.1f}us"
        if "--compile" in sys.argv:
            fn = torch.compile(baselines.prepare(NAME, "decode", sizes))
            fn(inputs)
            tc = min(do_bench(lambda: fn(inputs), warmup=10, rep=100, return_mode="median") for _ in range(2))
            line += f" torch.compile={tc * 1000:.1f}us"
        print(line, flush=True)
