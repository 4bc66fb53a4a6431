"""Experiment (not polyfuse code): decode with each warp rolling over its own key tiles (its own copies, cp.async
ring per warp, statistics and P.V in registers, no block barrier in the loop), one in-block combine of the warps,
then the split-k fold (last block of a head combines). Measures what that structure reaches on attn_global decode
beside polyfuse's kernel and cuDNN, same inputs, one process, rounds alternating.
usage: wdec.py PRESET "WARPS,NST,SPLITS,TK;..."  (attn_global decode presets; rows = B * Hq)"""
import sys, math
import numpy as np, torch, cupy as cp
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader

SRC = r"""
#define NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ float h2f(unsigned short x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short x; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f)); return x; }
__device__ __forceinline__ void cp16(void* dst, const void* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(d), "l"(src) : "memory"); }
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

#define KP (D + 8)
#define KBYTES (TK * KP * 2)
#define VBYTES (TK * D * 2)
#define STAGE (KBYTES + VBYTES)
#define KEYS (S / SPLITS)
#define NT (KEYS / TK)
#define CPL (D / 32)

extern "C" __global__ void __launch_bounds__(WARPS * 32) wdec(
    const unsigned short* __restrict__ q, const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
    unsigned short* __restrict__ out, float* __restrict__ pm, float* __restrict__ pl, float* __restrict__ po,
    int* __restrict__ tickets, float scale)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int h = blockIdx.x / SPLITS, sp = blockIdx.x % SPLITS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
    unsigned char* ring = smem + warp * NST * STAGE;
    float qf[D];
    #pragma unroll
    for (int j = 0; j < D; ++j) qf[j] = h2f(q[h * D + j]) * scale;
    const unsigned short* kb = k + ((long long)h * S + (long long)sp * KEYS) * D;
    const unsigned short* vb = v + ((long long)h * S + (long long)sp * KEYS) * D;
    const int mine = (NT - warp + WARPS - 1) / WARPS;
    auto issue = [&](int t) {
        if (t < mine) {
            const int tile = warp + t * WARPS;
            unsigned char* st = ring + (t % NST) * STAGE;
            const unsigned short* ks = kb + (long long)tile * TK * D;
            const unsigned short* vs = vb + (long long)tile * TK * D;
            #pragma unroll
            for (int g = lane; g < TK * D / 8; g += 32) {
                const int r = g / (D / 8), c = g % (D / 8);
                cp16(st + (r * KP + c * 8) * 2, ks + g * 8);
                cp16(st + KBYTES + g * 16, vs + g * 8);
            }
        }
        commit();
    };
    #pragma unroll
    for (int s = 0; s < NST - 1; ++s) issue(s);
    float m = NEG_INF, l = 0.f, acc[CPL];
    #pragma unroll
    for (int c = 0; c < CPL; ++c) acc[c] = 0.f;
    for (int t = 0; t < mine; ++t) {
        issue(t + NST - 1);
        wait_group<NST - 1>();
        __syncwarp();
        const unsigned char* st = ring + (t % NST) * STAGE;
        float sc[TK / 32];
        #pragma unroll
        for (int r = 0; r < TK / 32; ++r) {
            const uint4* kr = reinterpret_cast<const uint4*>(st + ((r * 32 + lane) * KP) * 2);
            float a = 0.f;
            #pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                uint4 x = kr[j];
                unsigned w[4] = {x.x, x.y, x.z, x.w};
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    a = fmaf(qf[j * 8 + 2 * e], h2f((unsigned short)(w[e] & 0xffff)), a);
                    a = fmaf(qf[j * 8 + 2 * e + 1], h2f((unsigned short)(w[e] >> 16)), a);
                }
            }
            sc[r] = a;
        }
        float mt = sc[0];
        #pragma unroll
        for (int r = 1; r < TK / 32; ++r) mt = fmaxf(mt, sc[r]);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
        const float mn = fmaxf(m, mt);
        const float alpha = ex2(m - mn);
        float ps = 0.f;
        #pragma unroll
        for (int r = 0; r < TK / 32; ++r) { sc[r] = ex2(sc[r] - mn); ps += sc[r]; }
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
        #pragma unroll
        for (int c = 0; c < CPL; ++c) acc[c] *= alpha;
        const unsigned short* vt = reinterpret_cast<const unsigned short*>(st + KBYTES);
        #pragma unroll
        for (int r = 0; r < TK / 32; ++r) {
            #pragma unroll 8
            for (int kk = 0; kk < 32; ++kk) {
                const float p = __shfl_sync(0xffffffffu, sc[r], kk);
                const unsigned short* row = vt + (r * 32 + kk) * D;
                #pragma unroll
                for (int c = 0; c < CPL; c += 2) {
                    const unsigned w = *reinterpret_cast<const unsigned*>(row + c * 32 + 2 * lane);
                    acc[c] = fmaf(p, h2f((unsigned short)(w & 0xffff)), acc[c]);
                    acc[c + 1] = fmaf(p, h2f((unsigned short)(w >> 16)), acc[c + 1]);
                }
            }
        }
        m = mn;
        __syncwarp();
    }
    wait_group<0>();
    __syncthreads();
    float* cm = reinterpret_cast<float*>(smem);          // the rings are free now
    float* cl = cm + WARPS;
    float* co = cl + WARPS;                              // [WARPS][D]
    if (lane == 0) { cm[warp] = m; cl[warp] = l; }
    #pragma unroll
    for (int c = 0; c < CPL; c += 2) { co[warp * D + c * 32 + 2 * lane] = acc[c]; co[warp * D + c * 32 + 2 * lane + 1] = acc[c + 1]; }
    __syncthreads();
    for (int d = tid; d < D; d += WARPS * 32) {
        float M = NEG_INF;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, cm[w]);
        float L = 0.f, O = 0.f;
        for (int w = 0; w < WARPS; ++w) { const float f = ex2(cm[w] - M); L += f * cl[w]; O += f * co[w * D + d]; }
        po[((long long)h * SPLITS + sp) * D + d] = O;
        if (d == 0) { pm[h * SPLITS + sp] = M; pl[h * SPLITS + sp] = L; }
    }
    __threadfence();
    __syncthreads();
    int ticket = 0;
    if (tid == 0) { ticket = atomicAdd(&tickets[h], 1); __threadfence(); }
    if (!__syncthreads_or(tid == 0 && ticket == SPLITS - 1)) return;
    if (tid == 0) tickets[h] = 0;
    for (int d = tid; d < D; d += WARPS * 32) {
        float M = NEG_INF;
        for (int s = 0; s < SPLITS; ++s) M = fmaxf(M, __ldcg(&pm[h * SPLITS + s]));
        float L = 0.f, O = 0.f;
        for (int s = 0; s < SPLITS; ++s) {
            const float f = ex2(__ldcg(&pm[h * SPLITS + s]) - M);
            L += f * __ldcg(&pl[h * SPLITS + s]); O += f * __ldcg(&po[((long long)h * SPLITS + s) * D + d]);
        }
        out[h * D + d] = f2h(O / L);
    }
}
"""


def main():
    preset = sys.argv[1]
    cfgs = [tuple(int(x) for x in c.split(",")) for c in sys.argv[2].split(";")]
    name = "attn_global"
    op = ops.get(name)
    sizes = dict(op.presets[preset])
    H, S, D = sizes["B"] * sizes["Hq"], sizes["Skv"], sizes["D"]
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, "decode", sizes, 1.0).items()}
    dev = loader("cuda").device_spec()
    k = build(default_schedule(name, "decode", op.program("decode", **sizes), target="cuda", device=dev), "cuda",
              fp_contract=True)
    ins = [inputs[a.name] for a in k.inputs]
    ref = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    runs = [("polyfuse", lambda: k(*ins, *ref), None)]
    q, kk, vv = (cp.asarray(inputs[n].contiguous()) for n in ("q", "k", "v"))
    scale = 1.0 / math.sqrt(D) * 1.4426950408889634
    for (W, NST, SPLITS, TK) in cfgs:
        mod = cp.RawModule(code=SRC, options=("-std=c++17", f"-DWARPS={W}", f"-DNST={NST}", f"-DSPLITS={SPLITS}",
                                              f"-DTK={TK}", f"-DS={S}", f"-DD={D}"))
        fn = mod.get_function("wdec")
        shared = max(W * NST * (TK * (D + 8) * 2 + TK * D * 2), (2 * W + W * D) * 4)
        fn.max_dynamic_shared_size_bytes = shared
        out = cp.empty((H * D,), cp.uint16)
        pm = cp.empty((H * SPLITS,), cp.float32); pl = cp.empty_like(pm); po = cp.empty((H * SPLITS * D,), cp.float32)
        tickets = cp.zeros((H,), cp.int32)
        args = (q, kk, vv, out, pm, pl, po, tickets, np.float32(scale))
        launch = (lambda fn=fn, args=args, shared=shared, W=W, SPLITS=SPLITS:
                  fn((H * SPLITS,), (W * 32,), args, shared_mem=shared))
        launch(); cp.cuda.runtime.deviceSynchronize()
        t_out = torch.as_tensor(out, device="cuda").view(torch.float16)
        runs.append((f"warps={W} stages={NST} splits={SPLITS} tile={TK} ({shared} B)", launch, t_out))
    for lab, fn in baselines.alternatives(name, inputs, "decode", sizes).items():
        if isinstance(fn, str) or lab not in ("sdpa:CUDNN_ATTENTION", "sdpa:FLASH_ATTENTION"):
            continue
        fn(); torch.cuda.synchronize()
        runs.append((lab, fn, None))
    runs[0][1](); torch.cuda.synchronize()
    base = ref[0].float().flatten()
    times = [[] for _ in runs]
    for _ in range(3):
        for i, (_, fn, _) in enumerate(runs):
            times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    t0 = min(times[0])
    for (lab, _, o), t in zip(runs, times):
        d = f" maxdiff vs polyfuse {float((o.float() - base).abs().max()):.2e}" if o is not None else ""
        print(f"{name} {preset} {H}x{S}x{D}: [{lab}] {min(t)*1e3:.1f} us x{t0/min(t):.3f}{d}", flush=True)


main()
