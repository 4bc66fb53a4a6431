// polyfuse_gpu.h: helpers included by the CUDA and HIP kernels polyfuse generates.
//
// The same semantics as polyfuse_host.h: low-precision floats are stored as raw bits (uint16_t
// for f16/bf16, uint8_t for fp8 e4m3fn), computed in float and rounded to nearest even exactly as
// NumPy and ml_dtypes round, so a GPU kernel rounds where the tile interpreter rounds.  On CUDA
// f16 and bf16 use the hardware conversions (one cvt each, the same rounding); HIP and fp8 use
// integer operations.
//
// On CUDA it adds the tensor-core path: ldmatrix fragment loads and mma.sync m16n8k16 with f16 or
// bf16 operands and f32 accumulators, and cp.async copies that stream tiles into shared memory
// (sm_80 and later, sm_90a included); and for sm_90a the warpgroup products (wgmma) on 128-byte-swizzled
// shared-memory tiles, each tested on its own (tests/test_hopper_primitives.py).
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define PF_WARP_SIZE 64
#else
#include <cuda_runtime.h>
#define PF_WARP_SIZE 32
#endif
#include <cmath>
#include <cstdint>

#define PF_DEV __device__ __forceinline__
#define PF_FN PF_DEV
#include "polyfuse_numpy.h"  // max, min, integer floordiv and mod

namespace pf {

// A gathered index (x[i, target[i]]) in 0 <= v < n, or false after recording the first fault as
// (site, value, extent) in fault[0..2] (site 0: none yet); the caller then skips the load.  The runtime
// zeroes the record before the launches and reads it after them.
PF_DEV bool gathered(int64_t v, int64_t n, int64_t* fault, int64_t site) {
    if (v >= 0 && v < n) return true;
    if (atomicCAS(reinterpret_cast<unsigned long long*>(fault), 0ull, static_cast<unsigned long long>(site)) == 0ull) {
        fault[1] = v;
        fault[2] = n;
    }
    return false;
}

PF_DEV uint32_t float_bits(float x) { return __float_as_uint(x); }
PF_DEV float bits_float(uint32_t u) { return __uint_as_float(u); }
}  // namespace pf

#include "polyfuse_round.h"  // f16 and bf16 bits rounded to nearest even (HIP, bf16 before sm_80)

namespace pf {

// ---------------------------------------------------------------- f16 (IEEE binary16)
#if !defined(__HIPCC__)
// CUDA: the hardware conversions (cvt) round to nearest even with subnormals, as NumPy does; a NaN
// becomes the canonical f16 NaN (its payload is not kept, which no comparison can observe).
PF_DEV float f16_to_float(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

PF_DEV uint16_t float_to_f16(float x) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#else
PF_DEV float f16_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = static_cast<float>(man) * 5.9604644775390625e-08f;  // man * 2^-24, exact
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

PF_DEV uint16_t float_to_f16(float x) { return f16_bits_rne(x); }
#endif

// NumPy's maximum/minimum of f32 (NaN if either is NaN) in one instruction on sm_80+ (max.NaN / min.NaN)
// instead of two NaN tests and two selects; of +0 and -0 either may come back (the templates return the second).
#if !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <> PF_DEV float max<float>(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
template <> PF_DEV float min<float>(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
#endif

PF_DEV float round_f16(float x) { return f16_to_float(float_to_f16(x)); }

// 1/x rounded toward zero (|result| <= |1/x|): the reciprocal a row kernel multiplies by instead of dividing
// each element by x (emit_cpp/reciprocal.py: x_j·rcp_rz(d) never exceeds |x_j/d|, so it overflows nowhere the
// division does not). ±0, ±inf and NaN give 1/x exactly.
PF_DEV float rcp_rz(float x) {
#if defined(__HIPCC__)
    float r = 1.0f / x;
    // 1 - r·x is exact (FMA): below 0 where r was rounded away from zero; then one step toward zero
    if (r != 0.0f && isfinite(r) && fmaf(-r, x, 1.0f) < 0.0f) r = nextafterf(r, 0.0f);
    return r;
#else
    return __frcp_rz(x);
#endif
}

// Whether 1/x is a normal number (2^-126 <= |x| <= 2^126): a row kernel's guarded reciprocal (NaN: false).
PF_DEV bool rcp_normal(float x) {
    const float a = fabsf(x);
    return a >= 0x1p-126f && a <= 0x1p126f;
}

#if !defined(__HIPCC__)
// exp(x) as __expf computes it (ex2.approx of x·log2 e: at most 2 + 1.173·|x| ulp off), with results under 2^-126
// flushed to 0 (.ftz: one MUFU.EX2 instead of a scaled sequence for subnormal results): the code generator's
// fast_exp, used where every output is a 16-bit float, whose rounding is far coarser.
PF_DEV float exp_fast(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
    return r;
}
#endif

// ---------------------------------------------------------------- bf16
PF_DEV float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

PF_DEV uint16_t float_to_bf16(float x) {
#if !defined(__HIPCC__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    return bf16_bits_rne(x);
#endif
}

PF_DEV float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// The rest of f32 x after its 16-bit hi part (the lo part of an operand split hi + lo): 0 for an
// infinite x, whose hi part is x itself, so that hi + lo is x (x - hi would be inf - inf = NaN).
PF_DEV float split_rest(float x, float hi) { return isinf(x) ? 0.0f : x - hi; }

// ---------------------------------------------------------------- fp8 e4m3fn (no inf; NaN = 0x7f)
PF_DEV float fp8_to_float(uint8_t b) {
    uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 0xf && man == 0x7) v = __uint_as_float(0x7fc00000u);
    else if (exp == 0) v = ldexpf(static_cast<float>(man), -9);
    else v = ldexpf(static_cast<float>(8 + man), static_cast<int>(exp) - 10);
    return (b & 0x80u) ? -v : v;
}

PF_DEV uint8_t float_to_fp8(float x) {
    uint8_t sign = signbit(x) ? 0x80u : 0u;
    float a = fabsf(x);
    if (isnan(a) || a > 464.0f) return sign | 0x7fu;
    if (a < 0.015625f) return sign | static_cast<uint8_t>(rintf(a * 512.0f));
    int e;
    float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int q = static_cast<int>(rintf((m * 2.0f - 1.0f) * 8.0f));
    e -= 1;
    if (q == 8) { q = 0; e += 1; }
    uint32_t bits = (static_cast<uint32_t>(e + 7) << 3) | static_cast<uint32_t>(q);
    return sign | static_cast<uint8_t>(bits > 0x7eu ? 0x7fu : bits);
}

PF_DEV float round_fp8(float x) { return fp8_to_float(float_to_fp8(x)); }

// ---------------------------------------------------------------- arithmetic with NumPy semantics (float overloads; the templates are in polyfuse_numpy.h)
PF_DEV float floordiv(float a, float b) { return floorf(a / b); }
PF_DEV double floordiv(double a, double b) { return floor(a / b); }
PF_DEV float mod(float a, float b) {
    float r = fmodf(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
PF_DEV double mod(double a, double b) {
    double r = fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <class T> PF_DEV T iabs(T a) { return a < 0 ? -a : a; }

// ---------------------------------------------------------------- warp shuffles
template <class T> PF_DEV T shfl_xor(T v, int lane_mask) {
#if defined(__HIPCC__)
    return __shfl_xor(v, lane_mask);
#else
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}
#if !defined(__HIPCC__)
// ``v`` (the same in every lane) as lane 0 holds it: the compiler then knows it is uniform across the warp and can
// keep what is computed from it in uniform registers (a warpgroup's wgmma descriptors, built from its index).
PF_DEV int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }
#endif
// Orders the shared and global memory accesses of a warp's (wavefront's) lanes; every lane must call it.
PF_DEV void syncwarp() {
#if defined(__HIPCC__)
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
    __syncwarp();
#endif
}
#if !defined(__HIPCC__)
// A barrier of some warps of the block (named barrier ``id``, ``threads`` of them, a multiple of the warp: the
// computing warps while the producer warpgroup goes on copying, or one group of a loop run by warp groups).
PF_DEV void named_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory"); }
#endif

// A load of data the kernel reads once (emit_cpp/streaming.py): cache-streaming, evicted first from L1 and L2
// (ld.global.cs); HIP: a plain load.
template <class T> PF_DEV T load_once(const T* p) {
#if defined(__HIPCC__)
    return *p;
#else
    return __ldcs(p);
#endif
}

// ---------------------------------------------------------------- tensor cores (CUDA, sm_80+)
#if !defined(__HIPCC__)
PF_DEV uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Four 8x8 b16 matrices; lane l gives the address of one row of matrix l / 8.
PF_DEV void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
PF_DEV void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
PF_DEV void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
PF_DEV void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

// 16 bytes global -> shared without registers (cp.async, sm_80+); a false predicate writes zeros
// and reads nothing.  Copies issued before a commit form one group; wait<N> returns once at most N
// groups are still in flight (the barrier that follows makes the copied data visible to the block).
PF_DEV void cp_async16(void* dst, const void* src, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(pred ? 16 : 0) : "memory");
}
PF_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> PF_DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// Two f32 as one register of two 16-bit values (the first in the low half: the lower column of an A fragment
// pair), each rounded to nearest even (cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 take the high half first).
PF_DEV uint32_t pack_f16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
PF_DEV uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// d += a * b for a 16x16 (row) by 16x8 (col) product, f32 accumulators.
PF_DEV void mma_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
PF_DEV void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// ---------------------------------------------------------------- Hopper warpgroup products (sm_90a)
// A K-major 16-bit operand tile of rows of 64 elements (128 bytes) lies in 128-byte-swizzled shared memory:
// the 16-byte chunk c of row r is stored at chunk c ^ (r % 8) of that row (atoms of 8 rows, 1024 bytes,
// 1024-byte aligned).  Its wgmma descriptor: start address >> 4, leading byte offset unused (1), stride
// byte offset 1024 >> 4 (from one 8-row atom to the next), swizzle mode 1 (128 B) at bits 62-63; the k16
// step s of the tile starts 32 bytes further (+2 in the descriptor).
PF_DEV int swizzle128(int row, int byte) { return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15); }
// A 16-bit tile [outer][inner] (inner a multiple of 64) as panels of 64 columns, each panel [outer][64] swizzled
// as above and outer * 128 bytes long: the element offset of (o, i).
PF_DEV int swizzled_at(int o, int i, int outer) {
    return (i >> 6) * outer * 64 + o * 64 + ((((i >> 3) ^ o) & 7) << 3) + (i & 7);
}
#if !defined(__HIPCC__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// An N-major operand (TB = 1) wider than one 64-element panel has its next panel of 64 n ``lbo`` bytes further
// (the leading byte offset); a K-major one never needs it (its n rows follow each other in 8-row atoms).
PF_DEV uint64_t wgmma_desc_k128(const void* tile, uint32_t lbo = 16) {
    return (uint64_t((smem_addr(tile) & 0x3FFFF) >> 4)) | (uint64_t((lbo >> 4) & 0x3FFF) << 16)
           | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
// The descriptor of the tile ``bytes`` (a multiple of 16) after ``desc``'s: its start address field (bits 0-13,
// address >> 4) plus bytes >> 4.  Both tiles lie in the block's shared memory (addresses below 2^18), so the sum
// stays inside the field and only the low word changes: one add where a k step or chunk moves along a tile.
PF_DEV uint64_t wgmma_desc_plus(uint64_t desc, uint32_t bytes) {
    return (desc & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(desc) + (bytes >> 4));
}
// Ordinary stores to shared memory become visible to the async proxy (wgmma, bulk copies) after this fence.
PF_DEV void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
PF_DEV void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
PF_DEV void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> PF_DEV void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// A wgmma reads its A-fragment registers and writes its accumulators after it is issued, until the wait that retires
// it; the compiler sees neither.  Holding them after that wait (an empty asm that reads and writes each) keeps
// their values where they are until then: no later write of the A fragments (the next iteration's P) and no read of
// the accumulators is moved above the wait.  Needed where other code runs between a wgmma and its wait.
template <int N> PF_DEV void wgmma_hold(uint32_t (&a)[N][4]) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3]) :: "memory");
}
template <int N> PF_DEV void wgmma_hold(float (&d)[N][4]) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]) :: "memory");
}
// d (+)= a * b over k16 for a warpgroup: a 64x16 (K-major, descriptor da), b 64x16 (K-major: the n rows of
// b^T, descriptor db), f32 accumulators; accumulate = false starts from zero.  Register 4i+q of thread t
// (warp w = t / 32, lane l) holds row 16w + l/4 + 8(q/2), column 8i + 2(l%4) + q%2.
// mbarrier (one 64-bit word of shared memory): init with the number of arrivals a phase needs; a thread that
// issues bulk copies announces their bytes (arrive + expect_tx); waiting on the phase's parity returns once the
// arrivals and the bytes are complete.  A bulk tensor copy (TMA) brings one box of a 2-D tensor map into shared
// memory (swizzled as the map says), completing its bytes on the barrier.
PF_DEV void mbarrier_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n"
                 "fence.mbarrier_init.release.cluster;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
PF_DEV void mbarrier_expect_tx(uint64_t* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
PF_DEV void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}
// One arrival on the barrier once every cp.async this thread issued before has landed (the barrier's count
// includes it: noinc).
PF_DEV void cp_async_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(smem_addr(bar)) : "memory");
}
// Warp specialisation: a warpgroup hands registers back (a producer that only issues copies) or takes them
// (the consumers that hold accumulators); every warp of the warpgroup executes it.
template <int N> PF_DEV void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N)); }
template <int N> PF_DEV void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N)); }
// Warpgroups taking turns (named barriers 1.., ``threads`` = the waiting warpgroup and the one that gives it its
// turn): wait until the previous warpgroup has issued its products, and give the next one its turn.
PF_DEV void turn_wait(int id, int threads) { named_sync(id, threads); }
PF_DEV void turn_give(int id, int threads) { asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory"); }
PF_DEV void mbarrier_wait(uint64_t* bar, int parity) {
    asm volatile("{\n.reg .pred done;\nwait:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait;\n}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// Bring a tensor map (a kernel parameter) into the copy engine's cache before its first copy needs it.
PF_DEV void tma_prefetch(const void* tensor_map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(tensor_map) : "memory");
}
PF_DEV void tma_load_2d(void* dst, const void* tensor_map, int x, int y, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(smem_addr(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(smem_addr(bar)) : "memory");
}
// The same for a map of 3, 4 or 5 dimensions (coordinates innermost first): a tile of a tensor whose other
// dimensions (heads, batch) are boxes of one, so that a box past the end of its own dimension is zero-filled
// instead of reading the next head's rows.
PF_DEV void tma_load_3d(void* dst, const void* tensor_map, int x, int y, int z, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(smem_addr(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(smem_addr(bar)) : "memory");
}
PF_DEV void tma_load_4d(void* dst, const void* tensor_map, int x, int y, int z, int w, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(smem_addr(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_addr(bar)) : "memory");
}
PF_DEV void tma_load_5d(void* dst, const void* tensor_map, int x, int y, int z, int w, int v, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
                 :: "r"(smem_addr(dst)), "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(v), "r"(smem_addr(bar))
                 : "memory");
}
// The accumulators of one wgmma (32 f32 per thread) as a flat float[32], or as 8 consecutive 8-column tiles
// [8C .. 8C + 7] of a fragment array float[NT][4] (the m16n8 accumulator layout: tile i, register q).
PF_DEV float& acc_at(float (&d)[32], int i) { return d[i]; }
template <int NT> PF_DEV float& acc_at(float (&d)[NT][4], int i) { return d[i / 4][i % 4]; }
#define PF_ACC4(d, i) "+f"(pf::acc_at(d, i)), "+f"(pf::acc_at(d, i + 1)), "+f"(pf::acc_at(d, i + 2)), \
    "+f"(pf::acc_at(d, i + 3))
#define PF_ACC32(d, i) PF_ACC4(d, i), PF_ACC4(d, i + 4), PF_ACC4(d, i + 8), PF_ACC4(d, i + 12), PF_ACC4(d, i + 16), \
    PF_ACC4(d, i + 20), PF_ACC4(d, i + 24), PF_ACC4(d, i + 28)
#define PF_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define PF_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define PF_ACC64(d, i) PF_ACC32(d, i), PF_ACC32(d, i + 32)
// d (+)= a * b over k16 for a warpgroup, 64 x N f32 accumulators (N = 64: tiles 8C .. 8C + 7 of d; N = 128:
// tiles 16C .. 16C + 15), operands of TYPE:
//   SS form (wgmma_m64nNk16_TYPE): a 64x16 K-major at descriptor da, b from descriptor db;
//   RS form (..._rs): a from registers, four of two 16-bit values each, as mma.m16n8k16's A per warp (warp w:
//   rows 16w + l/4 (+8), k 2(l%4) (+1) (+8)) -- attention's P never touches shared memory.
// b is K-major (the n rows of b^T, rows of 64 k: the next k16 step +2 in the descriptor) with TB = 0, or N-major
// with TB = 1 (rows of 64 n, 128-byte swizzled, 8-row atoms 1024 bytes apart: attention's value tile [key][dv];
// the next k16 step 2048 bytes further, +128; at N = 128 the descriptor's lbo is the distance between its two
// panels of 64 n).  One product of N = 128 reads a once where two of N = 64 read it twice.
// accumulate = false starts from zero.
#define PF_WGMMA_M64N64K16(NAME, TYPE)                                                                         \
    template <int TB = 0, int C = 0, typename D>                                                                 \
    PF_DEV void NAME(D& d, uint64_t da, uint64_t db, bool accumulate) {                                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " PF_D32                   \
                     "%32, %33, p, 1, 1, 0, %35;\n}\n"                                                            \
                     : PF_ACC32(d, 32 * C) : "l"(da), "l"(db), "r"(accumulate ? 1 : 0), "n"(TB));             \
    }                                                                                                            \
    template <int TB = 0, int C = 0, typename D>                                                                 \
    PF_DEV void NAME##_rs(D& d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " PF_D32                   \
                     "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                            \
                     : PF_ACC32(d, 32 * C)                                                                       \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate ? 1 : 0), "n"(TB));  \
    }
PF_WGMMA_M64N64K16(wgmma_m64n64k16_f16, "f16")
PF_WGMMA_M64N64K16(wgmma_m64n64k16_bf16, "bf16")
#undef PF_WGMMA_M64N64K16
#define PF_WGMMA_M64N128K16(NAME, TYPE)                                                                         \
    template <int TB = 0, int C = 0, typename D>                                                                 \
    PF_DEV void NAME(D& d, uint64_t da, uint64_t db, bool accumulate) {                                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " PF_D64                   \
                     "%64, %65, p, 1, 1, 0, %67;\n}\n"                                                            \
                     : PF_ACC64(d, 64 * C) : "l"(da), "l"(db), "r"(accumulate ? 1 : 0), "n"(TB));             \
    }                                                                                                            \
    template <int TB = 0, int C = 0, typename D>                                                                 \
    PF_DEV void NAME##_rs(D& d, const uint32_t (&a)[4], uint64_t db, bool accumulate) {                          \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                               \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " PF_D64                   \
                     "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                            \
                     : PF_ACC64(d, 64 * C)                                                                       \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate ? 1 : 0), "n"(TB));  \
    }
PF_WGMMA_M64N128K16(wgmma_m64n128k16_f16, "f16")
PF_WGMMA_M64N128K16(wgmma_m64n128k16_bf16, "bf16")
#undef PF_WGMMA_M64N128K16
#undef PF_D32
#undef PF_D64
#undef PF_ACC64
#undef PF_ACC32
#undef PF_ACC4
#endif

}  // namespace pf
