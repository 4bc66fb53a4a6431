"""Experiment (not polyfuse code): moe_routing's gate loop with each block starting its hidden steps at a step
of its own (h_0 = (t + f(s_0)) % steps), so that the blocks do not all read the same W tile from the L2 at once.
Text rewrite of the generated kernel; compared with the default kernel and torch.compile in one process.
usage: rot.py"""
import os, re, sys
import torch
from triton.testing import do_bench
import polyfuse.pipeline as PL
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
import polyfuse.runtime.gpu_compiler as G

dev = loader("cuda").device_spec()
MODE = {"f": None}


def rewrite(t, f):
    m = re.search(r"for \(int h_0 = 0; h_0 < \((\d+)\); \+\+h_0\) \{", t)
    n = int(m.group(1))
    t = t.replace(m.group(0), "for (int pf_hh = 0; pf_hh < %d; ++pf_hh) {\n        const int h_0 = (pf_hh + %s) %% %d;" % (n, f, n), 1)
    assert t.count("(h_0 == (0))") == 1
    return t.replace("(h_0 == (0))", "(pf_hh == 0)")


orig = G.compile_gpu
def patched(text, *a, **k):
    if MODE["f"]:
        text = rewrite(text, MODE["f"])
    return orig(text, *a, **k)
G.compile_gpu = patched

name, mode = "moe_routing", "default"
op = ops.get(name)
sizes = dict(op.presets["default"])
inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
runs, labels = [], []
for f in (None, "s_0", "s_0 * 5", "(s_0 / 16)", "s_0 * 7"):
    MODE["f"] = f
    PL._KERNELS.clear()
    k = PL.build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", fp_contract=True)
    MODE["f"] = None
    ins = [inputs[a.name] for a in k.inputs]
    out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    fn = lambda k=k, ins=ins, out=out: k(*ins, *out)
    fn(); torch.cuda.synchronize()
    runs.append((fn, out)); labels.append(f or "default")
prepared = baselines.prepare(name, mode, sizes)
names = list(inputs)
compiled = torch.compile(lambda *ts: prepared(dict(zip(names, ts))))
tensors = [inputs[n] for n in names]
compiled(*tensors); torch.cuda.synchronize()
runs.append((lambda: compiled(*tensors), None)); labels.append("torch.compile")
times = [[] for _ in runs]
for rnd in range(4):
    for i, (fn, _) in enumerate(runs):
        times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
ref = runs[0][1]
for i, lab in enumerate(labels):
    t = min(times[i]); d = ""
    if runs[i][1] is not None:
        d = " " + " ".join(f"{a.dtype}:max|d|={float((a.double() - b.double()).abs().max()):.1e}" for a, b in zip(ref, runs[i][1]))
    print(f"{name}: [{lab}] {t*1e3:.1f}us x{min(times[0])/t:.3f}{d}", flush=True)
