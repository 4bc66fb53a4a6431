"""Decode kernels with products' accumulators kept resident (resident.plan without its 'not with a product'
exclusion, patched in this process only) against the default, built in one process, timed alternately.
usage: optab4.py OPS PRESET"""
import inspect, sys, textwrap
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp import resident
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
real = resident.plan
src = textwrap.dedent(inspect.getsource(real)).replace(" or name in products", "")
assert src != textwrap.dedent(inspect.getsource(real))
ns = dict(vars(resident)); exec(src, ns); patched = ns["plan"]
preset = sys.argv[2]; mode = "decode"
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = op.presets[preset]
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    kernels = []
    for p in (real, patched):
        resident.plan = p
        o = CodegenOptions() if p is real else CodegenOptions(resident_elements=1025)  # another key: build() memoises
        kernels.append(build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", fp_contract=True, codegen=o))
    resident.plan = real
    marks = ["kept_pv" in k.kernel_source.text for k in kernels]
    times = [[], []]; outs = [None, None]
    for rnd in range(4):
        for i, k in enumerate(kernels):
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            times[i].append(do_bench(lambda: k(*ins, *out), warmup=25, rep=100, return_mode="median"))
            outs[i] = out
    d = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], outs[1]))
    print(f"{name} {preset}: default {min(times[0])*1e3:.1f} us {[round(t*1e3,1) for t in times[0]]} | resident products {min(times[1])*1e3:.1f} us {[round(t*1e3,1) for t in times[1]]} x{min(times[0])/min(times[1]):.3f} kept_pv={marks} d={d:.1e}", flush=True)
