"""Kernels of one mode preset under several option sets (same commit, same inputs), timed alternately (3 rounds,
min of do_bench medians); us, GB/s of inputs+outputs, ratio to the first set, max |diff| to the first set.
usage: optab3.py OPS PRESET "opt=on,opt=off;..." [SIZE=N ...]; option 'force_refill' lifts _why_not_refilled."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp import plan as plan_mod
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
real = plan_mod._why_not_refilled
configs = [dict((kv.split("=")[0], kv.split("=")[1] == "on") for kv in c.split(",") if kv) for c in sys.argv[3].split(";")]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}
preset = sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
for name in sys.argv[1].split(","):
    op = ops.get(name)
    if preset not in op.presets:
        continue
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    kernels = []
    for c in configs:
        c = dict(c)
        force = c.pop("force_refill", False)
        plan_mod._why_not_refilled = (lambda *a, **k: "") if force else real
        o = CodegenOptions(**c)
        sch = default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev, options=o)
        kernels.append(build(sch, "cuda", fp_contract=True, codegen=o))
    plan_mod._why_not_refilled = real
    times = [[] for _ in kernels]
    outs = [None] * len(kernels)
    nbytes = 0
    for rnd in range(3):
        for i, k in enumerate(kernels):
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            nbytes = sum(t.numel() * t.element_size() for t in ins + out)
            times[i].append(do_bench(lambda: k(*ins, *out), warmup=25, rep=100, return_mode="median"))
            outs[i] = out
    t0 = min(times[0])
    parts = []
    for i, c in enumerate(configs):
        t = min(times[i])
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs[0], outs[i]))
        parts.append(f"[{','.join(f'{k}={int(v)}' for k, v in c.items()) or 'default'}] {t*1e3:.1f} us {nbytes/t/1e6:.0f} GB/s x{t0/t:.3f} d={diff:.1e}")
    print(f"{name} {preset} {extra}: " + " | ".join(parts), flush=True)
# copy reference: device-to-device copy of 256 MB
x = torch.empty(128 * 2**20, dtype=torch.float16, device="cuda"); y = torch.empty_like(x)
t = do_bench(lambda: y.copy_(x), warmup=25, rep=100, return_mode="median")
print(f"copy 256 MB: {t*1e3:.1f} us, {2*x.numel()*2/t/1e6:.0f} GB/s")
