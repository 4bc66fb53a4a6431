"""MLA decode: accumulate_products off/on, default schedule, alternately twice; then NumPy checks with it on."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
NAME = "attn_mla_decode"
op = ops.get(NAME)
dev = loader("cuda").device_spec()
def kernel(sizes, on):
    o = CodegenOptions(accumulate_products=on)
    sch = default_schedule(NAME, "decode", op.program("decode", **sizes), target="cuda", device=dev, options=o)
    return build(sch, "cuda", fp_contract=True, codegen=o)
for case in (sys.argv[1].split(",") if sys.argv[1] else []):
    b, skv = (int(x) for x in case.split(":"))
    sizes = op.sizes("decode", {**op.presets["decode"], "B": b, "Skv": skv})
    inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
    ks = {on: kernel(sizes, on) for on in (False, True)}
    into = "accumulates into its registers" in ks[True].kernel_source.text
    t = {False: [], True: []}
    outs = {}
    for _ in range(2):
        for on, k in ks.items():
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            t[on].append(do_bench(lambda: k(*ins, *out), warmup=10, rep=100, return_mode="median"))
            outs[on] = out
    d = max(float((a.float() - c.float()).abs().max()) for a, c in zip(outs[False], outs[True]))
    print(f"B={b} Skv={skv} accumulates={into}: off {min(t[False])*1000:.1f}us on {min(t[True])*1000:.1f}us "
          f"off/on {min(t[False])/min(t[True]):.3f} maxdiff {d:.1e}", flush=True)
for b, skv in ((int(c.split(":")[0]), int(c.split(":")[1])) for c in sys.argv[2].split(",")):
    sizes = op.sizes("decode", {**op.presets["decode"], "B": b, "Skv": skv})
    k = kernel(sizes, True)
    into = "accumulates into its registers" in k.kernel_source.text
    tol = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in ("random", "leading_zeros", "special", "ties", "zero_rows", "monotone"):
            inputs = op.inputs(3, "decode", sizes, magnitude, variant)
            ref = op.reference(inputs, "decode", sizes)
            got = k.run(inputs)
            r = ops.compare({n: got[n] for n in ref}, ref, tol)
            print(f"check B={b} Skv={skv} accumulates={into} {variant}@{magnitude:g}: {'OK' if r.ok else 'FAIL'} {r.line()}", flush=True)
