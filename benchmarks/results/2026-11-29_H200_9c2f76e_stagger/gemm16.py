"""Experiment: a user's f16 GEMM (z += f32(x)·f32(w), 64-row blocks, 64-wide steps, tiles copied ahead) with its loop
staggered or not, timed alternately in one process (3 rounds, min of do_bench medians); "small": one run of each
at 512x256x64 (for compute-sanitizer), checked against NumPy within 2·gamma_n.
usage: gemm16.py [small]"""
import sys
import numpy as np
sys.path.insert(0, ".gpu")
from gemm16prog import gemm16
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.pipeline import build

small = len(sys.argv) > 1
S, H, E = (512, 256, 64) if small else (8192, 4096, 128)
prog = gemm16(S, H, E)
kernels = {"staggered": build(prog, "cuda"), "plain": build(prog, "cuda", codegen=CodegenOptions(stagger_loops=False))}
rng = np.random.default_rng(1)
x = rng.standard_normal((S, H)).astype(np.float16)
w = rng.standard_normal((H, E)).astype(np.float16)
exact = x.astype(np.float64) @ w.astype(np.float64)
bound = 2 * H * 2.0 ** -24 / (1 - 2 * H * 2.0 ** -24) * (np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)))
for lab, k in kernels.items():
    z = np.asarray(k.run({"x": x, "w": w})["z"], dtype=np.float64)
    print(lab, "within bound" if np.all(np.abs(z - exact) <= bound) else "OUT OF BOUND", f"max err {np.abs(z - exact).max():.2e}", flush=True)
if small:
    sys.exit(0)
import torch
from triton.testing import do_bench
xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
outs = {lab: torch.empty((S, E), dtype=torch.float32, device="cuda") for lab in kernels}
fns = {lab: (lambda k=k, o=outs[lab]: k(xt, wt, o)) for lab, k in kernels.items()}
fns["torch (f16 matmul, f32 out)"] = lambda: torch.matmul(xt, wt).float()
times = {lab: [] for lab in fns}
for _ in range(3):
    for lab, fn in fns.items():
        times[lab].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
base = min(times["staggered"])
for lab, t in times.items():
    print(f"gemm16 {S}x{H}x{E}: [{lab}] {min(t)*1e3:.1f}us x{base/min(t):.3f}", flush=True)
