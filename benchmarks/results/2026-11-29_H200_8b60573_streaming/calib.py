"""Read-only and copy bandwidth on one 4096x4096 f32 tensor against polyfuse's logsumexp/softmax_sum (one process)."""
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
N = M = 4096
x = torch.randn(N, M, device="cuda")
nb = x.numel() * 4
half = torch.empty(nb // 2, dtype=torch.uint8, device="cuda"); half2 = torch.empty_like(half)
full = torch.empty(nb, dtype=torch.uint8, device="cuda"); full2 = torch.empty_like(full)
runs = {"copy half (gpu_bench)": lambda: half2.copy_(half), "copy full": lambda: full2.copy_(full),
        "x.sum(1)": lambda: x.sum(1), "x.amax(1)": lambda: x.amax(1), "torch.logsumexp": lambda: torch.logsumexp(x, 1)}
for name in ("logsumexp", "softmax_sum", "softmax"):
    op = ops.get(name)
    k = build(default_schedule(name, "default", op.program("default", N=N, M=M), target="cuda", device=dev), "cuda", fp_contract=True)
    ins = [x for a in k.inputs]
    outs = [torch.empty(a.shape, device="cuda") for a in k.outputs]
    runs[f"polyfuse {name}"] = lambda k=k, ins=ins, outs=outs: k(*ins, *outs)
csum = torch.compile(lambda t: t.sum(1)); csum(x)
runs["compile x.sum(1)"] = lambda: csum(x)
clse = torch.compile(lambda t: torch.logsumexp(t, 1)); clse(x)
runs["compile logsumexp"] = lambda: clse(x)
times = {n: min(do_bench(f, warmup=25, rep=200, return_mode="median") for _ in range(3)) for n, f in runs.items()}
for n, t in times.items():
    rd = nb if "copy" not in n else (nb // 2 if "half" in n else nb)
    moved = rd if "copy" not in n else 2 * rd
    if n == "polyfuse softmax": moved = 2 * nb
    print(f"{n:28s} {t*1e3:8.2f} us  {moved / t / 1e9:6.2f} TB/s moved")
