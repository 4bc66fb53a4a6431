"""Prefill at the bench sizes: (keys per block, overlap_products) variants of one commit, alternately twice, min of
medians (do_bench); ms and ratio against the default build."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.pipeline import build
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
variants = [(128, True), (128, False), (64, True), (64, False)]
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = dict(op.presets["prefill"])
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, "prefill", sizes, 1.0).items()}
    kernels = {}
    for keys, on in variants:
        o = CodegenOptions(overlap_products=on)
        t = GpuTuning(prefill_wgmma_keys=keys)
        sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=dev, options=o, tuning=t)
        k = build(sch, "cuda", fp_contract=True, codegen=o)
        kernels[(keys, on)] = (k, "issued one iteration late" in k.kernel_source.text)
    times = {v: [] for v in variants}
    for rnd in range(2):
        for v, (k, late) in kernels.items():
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            times[v].append(do_bench(lambda: k(*ins, *out), warmup=25, rep=100, return_mode="median"))
    base = min(times[(128, True)])
    print(name, " | ".join(f"keys {v[0]} overlap {'on' if v[1] else 'off'}{' (late)' if kernels[v][1] else ''}: {min(times[v]):.4f} ms ({base / min(times[v]):.3f})" for v in variants), flush=True)
