"""Experiment (not polyfuse code): time stamps inside a decode kernel's blocks (text rewrite before nvcc).
Thread 0 of each block records globaltimer/clock64 at entry, %smid, clock64 after each iteration's key-tile and
value-tile waits (first 8 iterations), at the loop's end, before the partial results' fence, and at exit (the last
block of a row: after its combine), into a __device__ array read back with cuModuleGetGlobal.
usage: dstamps.py OPS PRESET TUNING [SIZE=N ...]  (TUNING: a=1,b=2 GpuTuning fields, or -)"""
import re, sys
import numpy as np, torch
import polyfuse.pipeline as P
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
import polyfuse.runtime.gpu_compiler as G
from triton.testing import do_bench

NS = 32
GT = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(pf_S[{k}]));'
WAIT = "pf::cp_async_wait<1>();  // this iteration's tiles (later copies may be in flight)"


def rewrite(t):
    t = t.replace('#include "polyfuse_gpu.h"', '#include "polyfuse_gpu.h"\n__device__ unsigned long long pf_stamps[16384 * %d];' % NS, 1)
    t = t.replace("int64_t pf_bid = blockIdx.x;", "int64_t pf_bid = blockIdx.x;\n    unsigned long long* pf_S = pf_stamps + (unsigned long long)blockIdx.x * %d;\n"
                  "    if (threadIdx.x == 0) { %s pf_S[1] = clock64(); unsigned pf_sm; asm volatile(\"mov.u32 %%0, %%%%smid;\" : \"=r\"(pf_sm)); pf_S[2] = pf_sm; }" % (NS, GT.format(k=0)), 1)
    parts = t.split(WAIT)
    out = parts[0]
    for n, p in enumerate(parts[1:]):
        slot = 4 + (n % 2) * 8
        # after the wait's barrier
        p = p.replace("__syncthreads();", "__syncthreads(); if (pf_tid == 0 && j_1 < 8) pf_S[%d + j_1] = clock64();" % slot, 1)
        out += WAIT + p
    t = out
    t = t.replace("pf::cp_async_wait<0>();\n        __syncthreads();", "pf::cp_async_wait<0>();\n        __syncthreads(); if (pf_tid == 0) pf_S[3] = clock64();", 1)
    t = t.replace("__threadfence();  // this block's partials", "if (pf_tid == 0) pf_S[20] = clock64();\n    __threadfence();  // this block's partials", 1)
    m = re.search(r"if \(!__syncthreads_or\((.*?)\)\) return;", t)
    if m:
        t = t.replace(m.group(0), "const bool pf_last = __syncthreads_or(%s); if (pf_tid == 0) { pf_S[21] = clock64(); %s pf_S[23] = pf_last; pf_S[24] = clock64(); }\n    if (!pf_last) return;" % (m.group(1), GT.format(k=22)), 1)
        head, tail = t.split("    if (!pf_last) return;", 1)
        pieces = tail.split("__syncthreads();")
        tail = pieces[0]
        for k, piece in enumerate(pieces[1:]):
            tail += "__syncthreads();" + (" if (pf_tid == 0) pf_S[%d] = clock64();" % (25 + k) if k < 7 else "") + piece
        t = head + "    if (!pf_last) return;" + tail
        i = t.rindex("}")
        t = t[:i] + "    if (pf_tid == 0) { pf_S[21] = clock64(); %s }\n" % GT.format(k=22) + t[i:]
    return t


orig = G.compile_gpu
def patched(text, *a, **k):
    return orig(rewrite(text), *a, **k)


dev = loader("cuda").device_spec()
preset = sys.argv[2]
mode = "decode" if preset.startswith("decode") else preset
from polyfuse.ops.gpu_tuning import GpuTuning
tn = GpuTuning(**{a: int(b) for a, b in (kv.split("=") for kv in sys.argv[3].split(",") if "=" in kv)})
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[4:])}
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets[preset], **extra}
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    res = {}
    for variant in ("plain", "stamped"):
        G.compile_gpu = patched if variant == "stamped" else orig
        P._KERNELS.clear()
        k = P.build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev, tuning=tn), "cuda", fp_contract=True)
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
        fn = lambda: k(*ins, *out)
        fn(); torch.cuda.synchronize()
        res[variant] = do_bench(fn, warmup=50, rep=300)
        if variant == "stamped":
            fn(); torch.cuda.synchronize()
            ld = k.loader
            mod = k._modules[ld.ordinal]
            ptr, size = ld.check(ld.cu.cuModuleGetGlobal(mod, b"pf_stamps"), "cuModuleGetGlobal")
            host = np.zeros(int(size) // 8, np.uint64)
            ld.to_host(host.ctypes.data, int(ptr), host.nbytes)
            st = host.reshape(-1, NS).astype(np.int64)
            st = st[st[:, 0] > 0]
    print(f"== {name} {preset} {sizes}: do_bench plain {res['plain']*1e3:.1f} us, stamped {res['stamped']*1e3:.1f} us; {len(st)} blocks on {len(set(st[:, 2].tolist()))} SMs")
    GHZ = float(np.median((st[:, 21] - st[:, 1]) / np.maximum(st[:, 22] - st[:, 0], 1)))  # clocks per ns, from each block's span
    print(f'   SM clock {GHZ:.3f} GHz (clock64 over globaltimer per block)'); GHZ *= 1e3
    t0 = st[:, 0].min()
    span = (st[:, 22].max() - t0) / 1e3
    print(f"   kernel span (globaltimer) {span:.1f} us; block starts spread {(st[:, 0].max() - t0) / 1e3:.2f} us; block ends p10/p50/p90/max "
          + " ".join(f"{np.percentile((st[:, 22] - t0) / 1e3, q):.1f}" for q in (10, 50, 90, 100)))
    c = st[:, 1]
    def show(label, a):
        a = a / GHZ
        print(f"   {label:28s} p10 {np.percentile(a, 10):7.2f} p50 {np.median(a):7.2f} p90 {np.percentile(a, 90):7.2f} max {a.max():7.2f} us")
    show("entry -> first K tile", st[:, 4] - c)
    iters = [j for j in range(8) if (st[:, 4 + j] > 0).all()]
    for j in iters:
        if j + 1 in iters:
            show(f"iter {j}: K wait -> next K wait", st[:, 5 + j] - st[:, 4 + j])
        if (st[:, 12 + j] > 0).all():
            show(f"iter {j}: K wait -> V wait", st[:, 12 + j] - st[:, 4 + j])
    last = max(iters)
    show(f"K wait {last} -> loop end", st[:, 3] - st[:, 4 + last])
    show("loop end -> fence", st[:, 20] - st[:, 3])
    show("fence -> ticket/exit", st[:, 21] - st[:, 20])
    lastb = st[st[:, 23] == 1]
    if len(lastb):
        print(f"   {len(lastb)} combining blocks: combine (clock) median {np.median((lastb[:, 21] - lastb[:, 20]) / GHZ):.2f} us; their ends (gt) p50 "
              f"{np.median((lastb[:, 22] - t0) / 1e3):.1f} max {(lastb[:, 22].max() - t0) / 1e3:.1f} us")
    show("block total (clock)", st[:, 21] - c)
    if len(lastb):
        for k in range(25, 32):
            if (lastb[:, k] > 0).all():
                print(f"   combine barrier {k - 24}: median {np.median((lastb[:, k] - lastb[:, 24]) / GHZ):.2f} us after the ticket")
    per_sm = np.bincount(st[:, 2].astype(int))
    print(f"   blocks per SM: {np.bincount(per_sm)[1:].tolist()} (count of SMs with 1,2,... blocks)")
