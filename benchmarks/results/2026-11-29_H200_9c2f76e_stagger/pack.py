"""Experiment (not polyfuse code): decode planned as one-warp blocks, P of them packed into one CUDA block
(text rewrite: lane = threadIdx % 32, virtual block = blockIdx * P + warp, shared memory sliced per warp,
block barriers -> __syncwarp, the fold's __syncthreads_or -> __any_sync).  Compared with the default kernel and
cuDNN/FA in one process; the packed kernel's output checked bit-for-bit against its unpacked self.
usage: pack.py OPS PRESET "cfg;cfg" P1,P2  (cfg: GpuTuning/CodegenOptions keys as tune.py)"""
import dataclasses, os, re, sys, time
import torch
from triton.testing import do_bench
import polyfuse.pipeline as PL
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.emit_cpp.target import Launch
from polyfuse.ir.expr import Const
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
import polyfuse.runtime.gpu_compiler as G
from polyfuse.ir.simplify import simplify

OPTS = {f.name for f in dataclasses.fields(CodegenOptions)}
TF = {f.name for f in dataclasses.fields(GpuTuning)}
dev = loader("cuda").device_spec()
PACK = {"p": 1, "size": 0}


def rewrite(t, p, size):
    t = t.replace("extern __shared__ __align__(16) unsigned char pf_smem[];",
                  "extern __shared__ __align__(16) unsigned char pf_smem_all[];\n    unsigned char* pf_smem = pf_smem_all + (threadIdx.x / 32) * %d;" % size)
    t = t.replace("extern __shared__ __align__(128) unsigned char pf_smem[];",
                  "extern __shared__ __align__(128) unsigned char pf_smem_all[];\n    unsigned char* pf_smem = pf_smem_all + (threadIdx.x / 32) * %d;" % size)
    t = t.replace("const int pf_tid = static_cast<int>(threadIdx.x);", "const int pf_tid = static_cast<int>(threadIdx.x % 32);")
    t = t.replace("int64_t pf_bid = blockIdx.x;", "int64_t pf_bid = static_cast<int64_t>(blockIdx.x) * %d + threadIdx.x / 32;" % p)
    t = t.replace("__syncthreads();", "__syncwarp();")
    t = re.sub(r"__syncthreads_or\(", "__any_sync(0xffffffffu, ", t)
    t = re.sub(r"__launch_bounds__\(32(, \d+)?\)", "__launch_bounds__(%d)" % (32 * p), t)
    return t


orig = G.compile_gpu
def patched(text, *a, **k):
    if PACK["p"] > 1:
        text = rewrite(text, PACK["p"], PACK["size"])
    return orig(text, *a, **k)
G.compile_gpu = patched


def make(name, mode, sizes, c, p):
    tn = GpuTuning(**{a: int(b) for a, b in c.items() if a in TF})
    o = CodegenOptions(**{a: int(b) if b.isdigit() else b == "on" for a, b in c.items() if a in OPTS})
    sch = default_schedule(name, mode, ops.get(name).program(mode, **sizes), target="cuda", device=dev, tuning=tn, options=o)
    PL._KERNELS.clear()
    if p == 1:
        PACK["p"] = 1
        return PL.build(sch, "cuda", fp_contract=True, codegen=o), ""
    from polyfuse.emit_cpp.target import Target
    st = PL.stages(sch, Target("cuda", device=dev, options=o))
    ls = st.source.launches
    assert all(l.threads == 32 for l in ls), [(l.kernel, l.threads) for l in ls]
    size = max(-(-l.shared // 128) * 128 for l in ls)
    PACK.update(p=p, size=size)
    k = PL.build(sch, "cuda", fp_contract=True, codegen=o)
    from polyfuse.ir import dtypes as DT
    news, infos = [], []
    for l in k.kernel_source.launches:
        b = simplify(l.blocks)
        nb = int(b.value)
        assert nb % p == 0, (nb, p)
        news.append(Launch(l.kernel, Const(nb // p, DT.i32), 32 * p, size * p))
        infos.append(f"{nb} vblocks of {l.shared} B -> {nb // p} x {32 * p} thr, {size * p} B")
    object.__setattr__(k.kernel_source, "launches", tuple(news))
    k._functions.clear() if hasattr(k, "_functions") else None
    PACK["p"] = 1
    return k, "; ".join(infos)


preset = sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
configs = [dict(kv.split("=") for kv in c.split(",") if kv) for c in sys.argv[3].split(";")]
packs = [int(x) for x in sys.argv[4].split(",")]
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = dict(op.presets[preset])
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    runs, labels = [], []
    for c in configs:
        for p in ([1] if not c else [1] + packs):
            try:
                k, info = make(name, mode, sizes, c, p)
            except Exception as e:
                print(f"  {name} {c} P={p}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            fn = lambda k=k, ins=ins, out=out: k(*ins, *out)
            try:
                fn(); torch.cuda.synchronize()
            except Exception as e:
                print(f"  {name} {c} P={p}: run {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            runs.append((fn, out)); labels.append((",".join(f"{a}={b}" for a, b in c.items()) or "default") + (f" P={p}" if c else ""))
            if info:
                print(f"  {labels[-1]}: {info}", flush=True)
    for lab, fn in baselines.alternatives(name, inputs, mode, sizes).items():
        if isinstance(fn, str) or lab not in ("sdpa:CUDNN_ATTENTION", "sdpa:FLASH_ATTENTION"):
            continue
        try:
            fn(); torch.cuda.synchronize()
        except Exception:
            continue
        runs.append((fn, None)); labels.append(lab)
    times = [[] for _ in runs]
    for rnd in range(3):
        for i, (fn, _) in enumerate(runs):
            times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ref = runs[0][1]
    prev = None
    for i, lab in enumerate(labels):
        t = min(times[i]); d = ""
        if runs[i][1] is not None:
            d = f" d0={max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, runs[i][1])):.1e}"
            if lab.endswith("P=1"):
                prev = runs[i][1]
            elif " P=" in lab and prev is not None:
                same = all(torch.equal(a, b) for a, b in zip(prev, runs[i][1]))
                d += " same-bits-as-P1" if same else " DIFFERS-from-P1"
        print(f"{name} {preset}: [{lab}] {t*1e3:.1f}us x{min(times[0])/t:.3f}{d}", flush=True)
