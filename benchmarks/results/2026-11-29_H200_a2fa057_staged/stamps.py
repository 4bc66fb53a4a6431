"""Experiment (not polyfuse code): time stamps inside a prefill kernel's blocks (text rewrite before nvcc).
Thread 0 of each block records clock64 at entry, after the query tile's copy, after the barrier set-up, after the
first key tile arrives, at the loop's end and after the output stores, plus globaltimer at entry/exit and %smid;
it writes them over the first row of its own output tile at the very end (the outputs are not checked).
usage: stamps.py OPS PRESET [SIZE=N ...]"""
import re, sys
import numpy as np, torch
import polyfuse.pipeline as P
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
import polyfuse.runtime.gpu_compiler as G
GT = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(pf_st[{k}]));'
def rewrite(t):
    idx = re.search(r"\bout\[(.*?)\] = ", t).group(1)
    t = t.replace("int64_t pf_bid = blockIdx.x;", "int64_t pf_bid = blockIdx.x;\n    unsigned long long pf_st[10] = {};\n"
                  "    pf_st[0] = clock64(); " + GT.format(k=7) + ' asm volatile("mov.u32 %0, %%smid;" : "=r"(*reinterpret_cast<unsigned*>(&pf_st[9])));', 1)
    t = t.replace("pf::cp_async_wait<0>();", "pf::cp_async_wait<0>(); if (pf_tid == 0) pf_st[1] = clock64();", 1)
    t = t.replace("__syncthreads();", "__syncthreads(); if (pf_tid == 0) pf_st[2] = clock64();", 1)
    t = re.sub(r"(pf::mbarrier_wait\(&pf_bar23\[j_0 % 3\], \(j_0 / 3\) & 1\);)", r"\1 if (pf_tid == 0) pf_st[3] = clock64();", t, count=1)
    i = t.rindex("// out\n"); t = t[:i] + "if (pf_tid == 0) pf_st[4] = clock64();\n" + t[i:]
    i = t.rindex("__syncthreads();")
    tail = ("if (pf_tid == 0) pf_st[5] = clock64();\n    __syncthreads();\n    if (pf_tid == 0) { pf_st[6] = clock64(); " + GT.format(k=8) +
            " const int x_ax0 = 0, x_ax1 = 0; unsigned long long* pf_o = reinterpret_cast<unsigned long long*>(&out[" + idx +
            "]); for (int k = 0; k < 10; ++k) pf_o[k] = pf_st[k]; }")
    return t[:i] + tail + t[i + len("__syncthreads();"):]
orig = G.compile_gpu
LAST = ['']
def patched(text, *a, **k):
    LAST[0] = text
    return orig(rewrite(text), *a, **k)
G.compile_gpu = patched
dev = loader("cuda").device_spec()
preset = sys.argv[2]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3:])}
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, preset, sizes, 1.0).items()}
    P._KERNELS.clear()
    k = P.build(default_schedule(name, preset, op.program(preset, **sizes), target="cuda", device=dev), "cuda")
    ins = [inputs[a.name] for a in k.inputs]
    out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    for _ in range(5):
        k(*ins, *out)
    torch.cuda.synchronize()
    o = out[0].cpu().numpy()
    d = o.shape[-1]
    rows = o.reshape(-1, d).view(np.uint64)  # each row: d*2/8 words
    st = rows[:, :10].astype(np.int64)
    st = st[(st[:, 7] > 10**17) & (st[:, 8] > st[:, 7]) & (st[:, 8] - st[:, 7] < 10**9) & (st[:, 9] >= 0) & (st[:, 9] < 1024)]
    tile = "-"
    sm = st[:, 9] & 0xffffffff
    ns = (st[:, 8] - st[:, 7]) / 1e3
    seg = np.diff(st[:, :7], axis=1) / 1980.0  # cycles -> us at 1980 MHz
    names = ["q copy", "barriers", "first kv", "loop", "last pv+out", "exit sync"]
    print(f"== {name} {preset} {sizes}: {len(st)} blocks on {len(set(sm.tolist()))} SMs, tile rows {tile}")
    print(f"   kernel span {(st[:, 8].max() - st[:, 7].min()) / 1e3:.1f} us; block (globaltimer) median {np.median(ns):.2f} min {ns.min():.2f} max {ns.max():.2f} us")
    for j, nm in enumerate(names):
        print(f"   {nm:12s} median {np.median(seg[:, j]):7.3f}  p10 {np.percentile(seg[:, j], 10):7.3f}  p90 {np.percentile(seg[:, j], 90):7.3f} us")
    gaps = []
    for s in set(sm.tolist()):
        r = st[sm == s]; r = r[np.argsort(r[:, 7])]
        gaps += list((r[1:, 7] - r[:-1, 8]) / 1e3)
    if gaps:
        print(f"   gap between blocks on one SM: median {np.median(gaps):.2f} p90 {np.percentile(gaps, 90):.2f} us ({len(gaps)} gaps)")
    first = (st[:, 7] - st[:, 7].min()) / 1e3
    print(f"   block starts: first wave spread {np.sort(first)[:132].max():.2f} us; end of last block {(st[:, 8].max() - st[:, 7].min()) / 1e3:.1f} us")
    loops = seg[:, 3]
    print(f"   loop us per block: min {loops.min():.2f} median {np.median(loops):.2f} max {loops.max():.2f}")
