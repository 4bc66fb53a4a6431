"""Decode kernels under several GpuTuning variants (same commit, same inputs) beside the SDPA/flex alternatives,
timed alternately (3 rounds, min of do_bench medians).
usage: tune.py OPS PRESET "warps=2,decode_blocks_per_sm=16;..." [SIZE=N ...]"""
import os, sys, time
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.emit_cpp import CodegenOptions
import dataclasses
OPTS = {f.name for f in dataclasses.fields(CodegenOptions)}
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
configs = [dict((kv.split("=")[0], kv.split("=")[1]) for kv in c.split(",") if kv) for c in sys.argv[3].split(";")]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}
preset = sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
for name in sys.argv[1].split(","):
    op = ops.get(name)
    if preset not in op.presets:
        continue
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    runs, labels = [], []
    for c in configs:
        tn = GpuTuning(**{a: ((() if b == "none" else ((64, int(b)),)) if a == "prefill_wgmma_rows" else b == "True" if b in ("True", "False") else tuple(int(x) for x in b.split("x")) if "x" in b else int(b)) for a, b in c.items() if a not in OPTS})
        o = CodegenOptions(**{a: int(b) if b.isdigit() else b == "on" for a, b in c.items() if a in OPTS})
        t0 = time.time()
        try:
            sch = default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev, tuning=tn, options=o)
            k = build(sch, "cuda", fp_contract=os.environ.get("FP_CONTRACT", "1") == "1", codegen=o)
        except Exception as e:
            print(f"  {name} {c}: {type(e).__name__}: {str(e)[:200]}")
            continue
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
        runs.append((lambda k=k, ins=ins, out=out: k(*ins, *out), out))
        labels.append(",".join(f"{a}={b}" for a, b in c.items()) or "default")
    for lab, fn in baselines.alternatives(name, inputs, mode, sizes).items():
        if isinstance(fn, str) or lab not in ("sdpa:CUDNN_ATTENTION", "sdpa:FLASH_ATTENTION"):
            continue
        try:
            fn(); torch.cuda.synchronize()
        except Exception:
            continue
        runs.append((fn, None)); labels.append(lab)
    if os.environ.get("COMPILE") == "1":  # torch.compile of the eager baseline (polyfuse.bench.measure's)
        prepared = baselines.prepare(name, mode, sizes)
        names = list(inputs)
        compiled = torch.compile(lambda *ts: prepared(dict(zip(names, ts))))
        tensors = [inputs[n] for n in names]
        compiled(*tensors); torch.cuda.synchronize()
        runs.append((lambda: compiled(*tensors), None)); labels.append("torch.compile")
    times = [[] for _ in runs]
    for rnd in range(3):
        for i, (fn, _) in enumerate(runs):
            times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ref = runs[0][1]
    parts = []
    for i, lab in enumerate(labels):
        t = min(times[i])
        d = ""
        if runs[i][1] is not None:
            d = f" d={max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, runs[i][1])):.1e}"
        parts.append(f"[{lab}] {t*1e3:.1f}us x{min(times[0])/t:.3f}{d}")
    print(f"{name} {preset} {extra}: " + " | ".join(parts), flush=True)
