"""Experiment (not polyfuse code): prefill kernels as generated against the same kernels with the exponential's
log2 e folded into one FFMA per score (text rewrite before nvcc), same process, alternating, same inputs.
usage: foldexp.py OPS PRESET [SIZE=N ...]"""
import re, struct, sys, os
import numpy as np, torch
from triton.testing import do_bench
import polyfuse.pipeline as P
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
L = 1.4426950408889634
def f32hex(x):
    return float.hex(struct.unpack("f", struct.pack("f", x))[0]) + "f"
PAT = re.compile(r"pf::exp_fast\(\(\(?(\w+\[pf_nb\]\[pf_q\])(?: \* (0x[0-9a-fp.+-]+)f\))? - (\(\((\w+\[pf_h\]) == \(-INFINITY\)\) \? 0x0\.0p\+0f : \4\))\)\)")
HELPER = ('\n__device__ __forceinline__ float pf_ex2(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }\n')
def fold(text):
    def rep(m):
        c = float.fromhex(m.group(2)) if m.group(2) else 1.0
        return f"pf_ex2(fmaf({m.group(1)}, {f32hex(c * L)}, -({m.group(3)} * 1.44269502162933349609375f)))"
    new, n = PAT.subn(rep, text)
    return new.replace('#include "polyfuse_gpu.h"', '#include "polyfuse_gpu.h"' + HELPER, 1), n
FOLD = [False]
import polyfuse.runtime.gpu_compiler as G
orig = G.compile_gpu
def patched(text, *a, **k):
    if FOLD[0]:
        text, n = fold(text)
        print(f"    folded {n} exponentials", flush=True)
    return orig(text, *a, **k)
G.compile_gpu = patched
dev = loader("cuda").device_spec()
preset = sys.argv[2]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3:])}
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, preset, sizes, 1.0).items()}
    runs = []
    for f in (False, True):
        FOLD[0] = f
        P._KERNELS.clear()  # (the in-process build cache would hand back the first kernel)
        k = P.build(default_schedule(name, preset, op.program(preset, **sizes), target="cuda", device=dev), "cuda", fp_contract=True)
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
        runs.append((lambda k=k, ins=ins, out=out: k(*ins, *out), out))
    times = [[], []]
    for _ in range(3):
        for i, (fn, _o) in enumerate(runs):
            times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    d = max(float((a.float() - b.float()).abs().max()) for a, b in zip(runs[0][1], runs[1][1]))
    t0, t1 = min(times[0]) * 1e3, min(times[1]) * 1e3
    print(f"{name} {preset} {extra}: as generated {t0:.1f}us | folded {t1:.1f}us x{t0 / t1:.3f} d={d:.1e}", flush=True)
