"""Experiment (not polyfuse code): decode kernels with the refill rule overridden (tiles refilled after their last
reader even where that lets fewer blocks reside than copying per statement), beside the rule's choice and cuDNN.
usage: refill.py OP PRESET TILES (e.g. 128,64,32)"""
import sys
import torch
from triton.testing import do_bench
import polyfuse.pipeline as PL
import polyfuse.emit_cpp.plan as PP
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader

dev = loader("cuda").device_spec()
name, preset = sys.argv[1], sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
op = ops.get(name)
sizes = dict(op.presets[preset])
inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
rule = PP._why_not_refilled
runs, labels = [], []
for tile in (int(t) for t in sys.argv[3].split(",")):
    for forced in (False, True):
        PP._why_not_refilled = (lambda *a: "") if forced else rule
        PL._KERNELS.clear()
        sch = default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev,
                               tuning=GpuTuning(decode_tile=tile))
        k = PL.build(sch, "cuda", fp_contract=True)
        PP._why_not_refilled = rule
        refills = "refilled after" in k.kernel_source.text or "into the buffer" in k.kernel_source.text
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
        runs.append((lambda k=k, ins=ins, out=out: k(*ins, *out), out))
        labels.append(f"tile {tile}{' refill forced' if forced else ''} ({'refills' if refills else 'per statement'})")
for lab, fn in baselines.alternatives(name, inputs, mode, sizes).items():
    if lab == "sdpa:CUDNN_ATTENTION" and callable(fn):
        runs.append((fn, None)); labels.append(lab)
for fn, _ in runs:
    fn()
torch.cuda.synchronize()
times = [[] for _ in runs]
for rnd in range(3):
    for i, (fn, _) in enumerate(runs):
        times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
ref = runs[0][1]
for i, lab in enumerate(labels):
    t = min(times[i]); d = ""
    if runs[i][1] is not None:
        d = f" d={max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, runs[i][1])):.1e}"
    print(f"{name} {preset}: [{lab}] {t*1e3:.1f}us x{min(times[0])/t:.3f}{d}", flush=True)
