"""Hopper primitives, each on its own before any kernel composes them: the 128-byte swizzle, the wgmma shared-memory
descriptor, the warpgroup accumulator layout, the mbarrier and the bulk tensor copy (TMA) with host-encoded tensor
maps (``polyfuse/runtime/include/polyfuse_gpu.h``, :mod:`polyfuse.emit_cpp.dotplan`, :mod:`polyfuse.runtime.tma`).

The first GPU test stages two random f16 tiles in swizzled shared memory with ``pf::swizzle128``, multiplies them
with four ``pf::wgmma_m64n64k16_f16`` steps (k = 64) and dumps every thread's raw accumulator registers; the host
maps them back with :class:`~polyfuse.emit_cpp.dotplan.WarpgroupFragment` and compares with NumPy in float64.  The
second brings the tiles by TMA instead, completing on an mbarrier, checks that they land where ``swizzle128`` says
and multiplies them the same way.  So descriptor, swizzle, fragment layout, tensor map, box and barrier phase are
checked against the hardware.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from polyfuse.emit_cpp.dotplan import WarpgroupFragment, swizzle128
from polyfuse.errors import BackendUnavailable
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu

KERNEL = r"""
#include "polyfuse_gpu.h"

// c[t * 32 + r] = register r of thread t after d = a · bᵀ (a, b: 64 × 64 f16, row-major, k fastest).
extern "C" __global__ void __launch_bounds__(128) wgmma_probe(const uint16_t* __restrict__ a,
                                                             const uint16_t* __restrict__ b, float* __restrict__ c)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sa = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sb = reinterpret_cast<uint16_t*>(pf_smem + 64 * 128);
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 64; e += 128) {
        const int at = pf::swizzle128(e / 64, (e % 64) * 2) / 2;
        sa[at] = a[e];
        sb[at] = b[e];
    }
    __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pf::fence_async_shared();
    float d[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) d[r] = 0.0f;
    pf::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)  // k steps of 16: 32 bytes further along the swizzled rows (+2 in the descriptor)
        pf::wgmma_m64n64k16_f16(d, pf::wgmma_desc_plus(pf::wgmma_desc_k128(sa), 32 * s),
                                pf::wgmma_desc_plus(pf::wgmma_desc_k128(sb), 32 * s), s > 0);
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 32; ++r) c[t * 32 + r] = d[r];
#endif
}
"""


DESC_KERNEL = r"""
#include "polyfuse_gpu.h"

// bad[0]: offsets (every 16 bytes of the block's shared memory) where a descriptor moved by pf::wgmma_desc_plus differs
// from the one built at the offset; bad[1]: threads whose pf::warp_uniform of their warp index differs from it.
extern "C" __global__ void __launch_bounds__(256) desc_probe(unsigned int* __restrict__ bad, long long shared)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    const int t = static_cast<int>(threadIdx.x);
    if (pf::warp_uniform(t / 32) != t / 32) atomicAdd(&bad[1], 1u);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const uint64_t base = pf::wgmma_desc_k128(pf_smem, 2048);
    for (unsigned int bytes = 16u * t; bytes < shared; bytes += 16u * blockDim.x)
        if (pf::wgmma_desc_plus(base, bytes) != pf::wgmma_desc_k128(pf_smem + bytes, 2048)) atomicAdd(&bad[0], 1u);
#endif
}
"""


TMA_KERNEL = r"""
#include <cuda.h>
#include "polyfuse_gpu.h"

// Two 64 x 64 f16 boxes brought by the bulk tensor copy into 128-byte-swizzled shared memory, completing on one
// mbarrier; raw = a's shared tile as it lies there, c[t * 32 + r] = register r of thread t of a · bᵀ by wgmma.
extern "C" __global__ void __launch_bounds__(128) tma_probe(const __grid_constant__ CUtensorMap ta,
                                                           const __grid_constant__ CUtensorMap tb,
                                                           uint16_t* __restrict__ raw, float* __restrict__ c)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sa = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sb = reinterpret_cast<uint16_t*>(pf_smem + 8192);
    uint64_t* bar = reinterpret_cast<uint64_t*>(pf_smem + 16384);
    const int t = static_cast<int>(threadIdx.x);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (t == 0) pf::mbarrier_init(bar, 1);
    __syncthreads();
    if (t == 0) {
        pf::mbarrier_expect_tx(bar, 2 * 8192);
        pf::tma_load_2d(sa, &ta, 0, 0, bar);
        pf::tma_load_2d(sb, &tb, 0, 0, bar);
    }
    pf::mbarrier_wait(bar, 0);
    for (int e = t; e < 64 * 64; e += 128) raw[e] = sa[e];
    float d[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) d[r] = 0.0f;
    pf::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s)
        pf::wgmma_m64n64k16_f16(d, pf::wgmma_desc_k128(sa) + 2 * s, pf::wgmma_desc_k128(sb) + 2 * s, s > 0);
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 32; ++r) c[t * 32 + r] = d[r];
#endif
}
"""


RS_KERNEL = r"""
#include "polyfuse_gpu.h"

// c[t * 32 + r] = register r of thread t after d = p · v: p (64 x 64 f16) read into registers as the A fragment,
// v (64 keys x 64 columns, row-major) staged N-major in 128-byte-swizzled shared memory.
extern "C" __global__ void __launch_bounds__(128) rs_probe(const uint16_t* __restrict__ p,
                                                          const uint16_t* __restrict__ v, float* __restrict__ c)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sv = reinterpret_cast<uint16_t*>(pf_smem);
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 64; e += 128) sv[pf::swizzle128(e / 64, (e % 64) * 2) / 2] = v[e];
    __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pf::fence_async_shared();
    const int row = 16 * (t / 32) + (t % 32) / 4, col = 2 * (t % 4);
    uint32_t a[4][4];  // (written before the fence: registers a wgmma reads must not change after it)
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int at = (row + 8 * (q % 2)) * 64 + 16 * s + col + 8 * (q / 2);
            a[s][q] = static_cast<uint32_t>(p[at]) | (static_cast<uint32_t>(p[at + 1]) << 16);
        }
    float d[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) d[r] = 0.0f;
    pf::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) pf::wgmma_m64n64k16_f16_rs<1>(d, a[s], pf::wgmma_desc_k128(sv) + 128 * s, s > 0);
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 32; ++r) c[t * 32 + r] = d[r];
#endif
}
"""


ACCUMULATORS_AS_A = r"""
// The accumulators of one product as the A operand of the next (attention's S = Q·Kᵀ into P·V): registers
// 8S..8S+7 of thread t hold its A fragment of k16 step S (columns 16S.. of the product are the next one's k),
// rounded to f16 in pairs (cvt.rn.f16x2.f32: the even column in the low half), as WarpgroupFragment.as_a_operand
// says.  (The code generator packs P from the values it computes: pf::pack_f16.)
template <int S> __device__ __forceinline__ void accumulators_as_a_f16(uint32_t (&a)[4], const float (&d)[32]) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(a[q]) : "f"(d[8 * S + 2 * q + 1]), "f"(d[8 * S + 2 * q]));
}""".lstrip("\n")
"""The probes' conversion of a product's accumulators into the next product's A operand (the code generator
packs P from the values it computes instead)."""


CHAIN_KERNEL = r"""
#include "polyfuse_gpu.h"

@ACCUMULATORS_AS_A@

// s = q · kᵀ (both operands from swizzled shared memory), then o = f16(s) · v with f16(s) taken from s's
// accumulators as the A operand in registers; dumps s and o, register r of thread t at t * 32 + r.
extern "C" __global__ void __launch_bounds__(128) chain_probe(const uint16_t* __restrict__ q,
                                                             const uint16_t* __restrict__ k,
                                                             const uint16_t* __restrict__ v,
                                                             float* __restrict__ s_out, float* __restrict__ o_out)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sq = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sk = reinterpret_cast<uint16_t*>(pf_smem + 8192);
    uint16_t* sv = reinterpret_cast<uint16_t*>(pf_smem + 16384);
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 64; e += 128) {
        const int at = pf::swizzle128(e / 64, (e % 64) * 2) / 2;
        sq[at] = q[e];
        sk[at] = k[e];
        sv[at] = v[e];
    }
    __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pf::fence_async_shared();
    float s[32], o[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) s[r] = o[r] = 0.0f;
    pf::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)
        pf::wgmma_m64n64k16_f16(s, pf::wgmma_desc_k128(sq) + 2 * j, pf::wgmma_desc_k128(sk) + 2 * j, j > 0);
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
    uint32_t p[4][4];
    accumulators_as_a_f16<0>(p[0], s);
    accumulators_as_a_f16<1>(p[1], s);
    accumulators_as_a_f16<2>(p[2], s);
    accumulators_as_a_f16<3>(p[3], s);
    pf::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j) pf::wgmma_m64n64k16_f16_rs<1>(o, p[j], pf::wgmma_desc_k128(sv) + 128 * j, j > 0);
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 32; ++r) {
        s_out[t * 32 + r] = s[r];
        o_out[t * 32 + r] = o[r];
    }
#endif
}
"""
CHAIN_KERNEL = CHAIN_KERNEL.replace("@ACCUMULATORS_AS_A@", ACCUMULATORS_AS_A)


A_FRAGMENTS = r"""    const int row = 16 * (t / 32) + (t % 32) / 4, col = 2 * (t % 4);
    uint32_t f[8][4];
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int at = (row + 8 * (q % 2)) * 128 + 16 * s + col + 8 * (q / 2);
            f[s][q] = static_cast<uint32_t>(a[at]) | (static_cast<uint32_t>(a[at + 1]) << 16);
        }"""
"""Thread t's A fragments of a (64 x 128, row-major) for the 8 k16 steps of an RS product (the mma.m16n8k16 A
layout per warp), read from global memory: the probes' register operand."""

PANEL_KERNEL = r"""
#include "polyfuse_gpu.h"

// The layout and the call forms the code generator composes (emit_cpp/fragments.py): a (64 x 128) and b (128 x
// 128), row-major, k fastest, staged K-major in panels of 64 columns (pf::swizzled_at); d = a · bᵀ into the
// fragment array float[16][4] by chunks of 64 columns (template C), both operands from shared memory (SS), and
// again with a's fragments from registers and a K-major b (RS, TB = 0).  c[t * 64 + r] = register r of thread t
// (d), then e's at 128 * 64 + t * 64 + r.  LOW: the 16-bit type (f16 or bf16), replaced before compiling.
extern "C" __global__ void __launch_bounds__(128) panel_probe(const uint16_t* __restrict__ a,
                                                             const uint16_t* __restrict__ b, float* __restrict__ c)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sa = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sb = sa + 64 * 128;
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 128; e += 128) sa[pf::swizzled_at(e / 128, e % 128, 64)] = a[e];
    for (int e = t; e < 128 * 128; e += 128) sb[pf::swizzled_at(e / 128, e % 128, 128)] = b[e];
    __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pf::fence_async_shared();
@A_FRAGMENTS@
    float d[16][4] = {}, e[16][4] = {};
    pf::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const int k = (s / 4) * 64 * 64 + (s % 4) * 16;  // panel of k step s, 32 bytes per step within it
        const uint64_t da = pf::wgmma_desc_k128(sa + k);
        const int kb = (s / 4) * 128 * 64 + (s % 4) * 16;
        pf::wgmma_m64n64k16_LOW<0, 0>(d, da, pf::wgmma_desc_k128(sb + kb), s > 0);
        pf::wgmma_m64n64k16_LOW<0, 1>(d, da, pf::wgmma_desc_k128(sb + kb + 64 * 64), s > 0);
        pf::wgmma_m64n64k16_LOW_rs<0, 0>(e, f[s], pf::wgmma_desc_k128(sb + kb), s > 0);
        pf::wgmma_m64n64k16_LOW_rs<0, 1>(e, f[s], pf::wgmma_desc_k128(sb + kb + 64 * 64), s > 0);
    }
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 64; ++r) {
        c[t * 64 + r] = d[r / 4][r % 4];
        c[128 * 64 + t * 64 + r] = e[r / 4][r % 4];
    }
#endif
}
"""

PANEL_KERNEL = PANEL_KERNEL.replace("@A_FRAGMENTS@", A_FRAGMENTS)
PANEL_TYPES = ("f16", "bf16")


WIDE_KERNEL = r"""
#include "polyfuse_gpu.h"

// The 128-column forms: a (64 x 128) and b (128 x 128) as in panel_probe, v (128 x 128, [k][n]) staged N-major in
// two panels of 64 n (pf::swizzled_at(k, n, 128): the second panel 128 * 64 elements = 16384 bytes further, the
// descriptor's lbo).  d = a · bᵀ by one m64n128k16 per k step (SS), e the same with a from registers (RS), o = a · v
// (RS, TB = 1): c[t * 64 + r] = d's register r of thread t, then e's, then o's.
extern "C" __global__ void __launch_bounds__(128) wide_probe(const uint16_t* __restrict__ a,
                                                            const uint16_t* __restrict__ b,
                                                            const uint16_t* __restrict__ v, float* __restrict__ c)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sa = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sb = sa + 64 * 128;
    uint16_t* sv = sb + 128 * 128;
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 128; e += 128) sa[pf::swizzled_at(e / 128, e % 128, 64)] = a[e];
    for (int e = t; e < 128 * 128; e += 128) {
        sb[pf::swizzled_at(e / 128, e % 128, 128)] = b[e];
        sv[pf::swizzled_at(e / 128, e % 128, 128)] = v[e];
    }
    __syncthreads();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    pf::fence_async_shared();
@A_FRAGMENTS@
    float d[16][4] = {}, e[16][4] = {}, o[16][4] = {};
    pf::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 8; ++s) {
        const uint64_t da = pf::wgmma_desc_k128(sa + (s / 4) * 64 * 64 + (s % 4) * 16);
        const uint64_t db = pf::wgmma_desc_k128(sb + (s / 4) * 128 * 64 + (s % 4) * 16);
        pf::wgmma_m64n128k16_f16<0, 0>(d, da, db, s > 0);
        pf::wgmma_m64n128k16_f16_rs<0, 0>(e, f[s], db, s > 0);
        pf::wgmma_m64n128k16_f16_rs<1, 0>(o, f[s], pf::wgmma_desc_k128(sv + s * 16 * 64, 128 * 64 * 2), s > 0);
    }
    pf::wgmma_commit();
    pf::wgmma_wait<0>();
#pragma unroll
    for (int r = 0; r < 64; ++r) {
        c[t * 64 + r] = d[r / 4][r % 4];
        c[128 * 64 + t * 64 + r] = e[r / 4][r % 4];
        c[2 * 128 * 64 + t * 64 + r] = o[r / 4][r % 4];
    }
#endif
}
"""
WIDE_KERNEL = WIDE_KERNEL.replace("@A_FRAGMENTS@", A_FRAGMENTS)



def _panel_kernel(low: str) -> str:
    return PANEL_KERNEL.replace("_LOW", f"_{low}")


PIPELINE_KERNEL = r"""
#include <cuda.h>
#include "polyfuse_gpu.h"

// d = Σ_j q · k_jᵀ over the TILES 64-row tiles k_j of k: a producer warpgroup (one thread) brings k_j by TMA into
// a ring of two stages, a consumer warpgroup multiplies; full[s] completes with the copy's bytes, empty[s] when
// the consumer is done with stage s; the phase of stage s at tile j is (j / 2) & 1.
extern "C" __global__ void __launch_bounds__(256, 1) pipeline_probe(const __grid_constant__ CUtensorMap tk,
                                                                   const uint16_t* __restrict__ q,
                                                                   float* __restrict__ c, const int64_t tiles)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sq = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sk = reinterpret_cast<uint16_t*>(pf_smem + 8192);  // two stages of 8192 bytes
    uint64_t* full = reinterpret_cast<uint64_t*>(pf_smem + 3 * 8192);
    uint64_t* empty = full + 2;
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 64; e += 256) sq[pf::swizzle128(e / 64, (e % 64) * 2) / 2] = q[e];
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (t == 0) {
        for (int s = 0; s < 2; ++s) {
            pf::mbarrier_init(&full[s], 1);
            pf::mbarrier_init(&empty[s], 1);
        }
    }
    pf::fence_async_shared();
    __syncthreads();
    if (t < 128) {
        pf::setmaxnreg_dec<40>();
        if (t == 0) {
            for (int j = 0; j < tiles; ++j) {
                const int s = j % 2;
                if (j >= 2) pf::mbarrier_wait(&empty[s], ((j / 2) & 1) ^ 1);
                pf::mbarrier_expect_tx(&full[s], 8192);
                pf::tma_load_2d(sk + s * 4096, &tk, 0, 64 * j, &full[s]);
            }
        }
    } else {
        pf::setmaxnreg_inc<232>();
        float d[32];
#pragma unroll
        for (int r = 0; r < 32; ++r) d[r] = 0.0f;
        for (int j = 0; j < tiles; ++j) {
            const int s = j % 2;
            pf::mbarrier_wait(&full[s], (j / 2) & 1);
            pf::wgmma_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k)
                pf::wgmma_m64n64k16_f16(d, pf::wgmma_desc_k128(sq) + 2 * k, pf::wgmma_desc_k128(sk + s * 4096) + 2 * k,
                                        true);
            pf::wgmma_commit();
            pf::wgmma_wait<0>();
            if (t == 128) pf::mbarrier_arrive(&empty[s]);
        }
#pragma unroll
        for (int r = 0; r < 32; ++r) c[(t - 128) * 32 + r] = d[r];
    }
#endif
}
"""


ATTENTION_KERNEL = r"""
#include "polyfuse_gpu.h"

@ACCUMULATORS_AS_A@

// One warpgroup, 64 query rows, keys in tiles of 64 (d = dv = 64, f16): S = Q·Kᵀ by wgmma, the online softmax on
// S's accumulators in registers (a row's 16 values in a thread, the other 48 in the 3 lanes of its quad: two
// xor shuffles), P rounded once to f16 straight into P·V's A operand, O rescaled in its accumulators.
extern "C" __global__ void __launch_bounds__(128) attention_probe(const uint16_t* __restrict__ q,
                                                                 const uint16_t* __restrict__ k,
                                                                 const uint16_t* __restrict__ v,
                                                                 float* __restrict__ out, const int64_t tiles)
{
    extern __shared__ __align__(1024) unsigned char pf_smem[];
    uint16_t* sq = reinterpret_cast<uint16_t*>(pf_smem);
    uint16_t* sk = reinterpret_cast<uint16_t*>(pf_smem + 8192);
    uint16_t* sv = reinterpret_cast<uint16_t*>(pf_smem + 16384);
    const int t = static_cast<int>(threadIdx.x);
    for (int e = t; e < 64 * 64; e += 128) sq[pf::swizzle128(e / 64, (e % 64) * 2) / 2] = q[e];
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const float scale = 0.125f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, s[32], o[32];
#pragma unroll
    for (int r = 0; r < 32; ++r) o[r] = 0.0f;
    for (int j = 0; j < tiles; ++j) {
        for (int e = t; e < 64 * 64; e += 128) {
            const int at = pf::swizzle128(e / 64, (e % 64) * 2) / 2;
            sk[at] = k[j * 4096 + e];
            sv[at] = v[j * 4096 + e];
        }
        pf::fence_async_shared();
        __syncthreads();
        pf::wgmma_fence();
#pragma unroll
        for (int c = 0; c < 4; ++c)
            pf::wgmma_m64n64k16_f16(s, pf::wgmma_desc_k128(sq) + 2 * c, pf::wgmma_desc_k128(sk) + 2 * c, c > 0);
        pf::wgmma_commit();
        pf::wgmma_wait<0>();
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // row g (+8 for h = 1) of the warp's strip: registers 4i + 2h, 4i + 2h + 1
            float top = m[h];
#pragma unroll
            for (int i = 0; i < 8; ++i) top = fmaxf(top, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]) * scale);
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
            const float rescale = expf(m[h] - top);
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float p = expf(s[4 * i + 2 * h + c] * scale - top);
                    s[4 * i + 2 * h + c] = p;
                    sum += p;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[h] = l[h] * rescale + sum;
            m[h] = top;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                o[4 * i + 2 * h] *= rescale;
                o[4 * i + 2 * h + 1] *= rescale;
            }
        }
        uint32_t p[4][4];
        accumulators_as_a_f16<0>(p[0], s);
        accumulators_as_a_f16<1>(p[1], s);
        accumulators_as_a_f16<2>(p[2], s);
        accumulators_as_a_f16<3>(p[3], s);
        pf::wgmma_fence();
#pragma unroll
        for (int c = 0; c < 4; ++c) pf::wgmma_m64n64k16_f16_rs<1>(o, p[c], pf::wgmma_desc_k128(sv) + 128 * c, true);
        pf::wgmma_commit();
        pf::wgmma_wait<0>();
        __syncthreads();  // every warp is done with this tile before the next one overwrites it
    }
#pragma unroll
    for (int r = 0; r < 32; ++r) out[t * 32 + r] = o[r] / l[(r % 4) / 2];
#endif
}
"""
ATTENTION_KERNEL = ATTENTION_KERNEL.replace("@ACCUMULATORS_AS_A@", ACCUMULATORS_AS_A)


def _sm90_driver():
    from polyfuse.runtime.loaders import loader

    try:
        driver = loader("cuda")
    except BackendUnavailable as err:
        pytest.skip(str(err))
    if driver.device_spec().arch != "sm_90a":
        pytest.skip(f"wgmma needs sm_90a; the device is {driver.device_spec().arch}")
    return driver


def _upload(driver, *arrays):
    pointers, owners = [], []
    for host in arrays:
        pointer, owner = driver.alloc(host.nbytes)
        driver.to_device(pointer, host.ctypes.data, host.nbytes)
        pointers.append(pointer)
        owners.append(owner)
    return pointers, owners


def _product(raw: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """The warpgroup's registers mapped back by WarpgroupFragment equal a · bᵀ (64 × n) within f32 accumulation."""
    layout = WarpgroupFragment(b.shape[0])
    c = np.full((64, b.shape[0]), np.nan)
    for t, r in itertools.product(range(128), range(layout.registers)):
        c[layout.element(t, r)] = raw[t * layout.registers + r]
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    # Products of 16-bit values are exact in f32; k additions in f32 round each partial sum by at most 2^-24.
    bound = a.shape[1] * 2.0 ** -24 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T) + 2.0 ** -126
    assert np.all(np.abs(c - exact) <= bound), float(np.max(np.abs(c - exact) - bound))


def test_swizzle128_permutes_the_chunks_of_each_row():
    for row in range(16):
        offsets = [swizzle128(row, byte) for byte in range(128)]
        assert sorted(offsets) == list(range(row * 128, row * 128 + 128))
        assert [swizzle128(row, 16 * c) // 16 % 8 for c in range(8)] == [c ^ (row % 8) for c in range(8)]
        assert all(swizzle128(row, 16 * c + b) == swizzle128(row, 16 * c) + b for c in range(8) for b in range(16))


def test_accumulators_are_the_next_products_a_fragments():
    # Register pair (8s + 2q, +1) of a thread holds, as this product's (row, column), the (row, k) that PTX's A
    # fragment of k16 step s puts in its register q: rows g (+8 for odd q), k 16s + 2(l%4) (+8 for q >= 2).
    layout = WarpgroupFragment(64)
    for t, step, q in itertools.product(range(128), range(4), range(4)):
        lo, hi = layout.as_a_operand(step)[q]
        row = 16 * (t // 32) + (t % 32) // 4 + 8 * (q % 2)
        k = 16 * step + 2 * (t % 4) + 8 * (q // 2)
        assert (layout.element(t, lo), layout.element(t, hi)) == ((row, k), (row, k + 1))


def test_the_warpgroup_fragment_covers_the_tile_once():
    layout = WarpgroupFragment(64)
    seen = [layout.element(t, r) for t, r in itertools.product(range(128), range(layout.registers))]
    assert sorted(seen) == sorted(itertools.product(range(64), range(64)))


@pytest.mark.nvcc
@pytest.mark.parametrize("kernel", [KERNEL, DESC_KERNEL, TMA_KERNEL, RS_KERNEL, CHAIN_KERNEL, PIPELINE_KERNEL,
                                    ATTENTION_KERNEL, WIDE_KERNEL, *map(_panel_kernel, PANEL_TYPES)],
                         ids=["wgmma", "desc", "tma", "rs", "chain", "pipeline", "attention", "wide", *PANEL_TYPES])
def test_the_hopper_primitives_compile_for_sm_90a(kernel):
    compile_gpu(kernel, "hopper_probe", "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)


@pytest.mark.gpu
def test_wgmma_m64n64k16_matches_numpy():
    driver = _sm90_driver()
    image = compile_gpu(KERNEL, "wgmma_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    function = driver.function(driver.load(image.read_bytes()), "wgmma_probe", 2 * 64 * 128)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    raw = np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, a, b, raw)
    driver.launch(function, 1, 128, 2 * 64 * 128, pointers, [])
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[2], raw.nbytes)
    _product(raw, a, b)


@pytest.mark.gpu
def test_descriptors_moved_by_an_offset_equal_those_built_there():
    """``wgmma_desc_plus`` (the code generator's k steps and chunks) against ``wgmma_desc_k128`` at every 16-byte
    offset of the largest shared memory a block may have, and ``warp_uniform`` of each warp's index."""
    driver = _sm90_driver()
    image = compile_gpu(DESC_KERNEL, "desc_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    shared = 227 * 1024
    function = driver.function(driver.load(image.read_bytes()), "desc_probe", shared)
    bad = np.zeros(2, np.uint32)
    pointers, _owners = _upload(driver, bad)
    driver.launch(function, 1, 256, shared, pointers, [shared])  # (sizes travel as 64-bit integers)
    driver.synchronize()
    driver.to_host(bad.ctypes.data, pointers[0], bad.nbytes)
    assert bad.tolist() == [0, 0]


@pytest.mark.gpu
@pytest.mark.parametrize("low", PANEL_TYPES)
def test_swizzled_panels_and_chunked_accumulators_match_numpy(low):
    """Operands of two 64-column panels (pf::swizzled_at), two 64-column chunks of one float[16][4] accumulator
    array, the SS form and the RS form with a K-major b, in f16 and bf16: each equals a · bᵀ."""
    import ml_dtypes

    driver = _sm90_driver()
    numpy_type = np.float16 if low == "f16" else ml_dtypes.bfloat16
    image = compile_gpu(_panel_kernel(low), f"panel_probe_{low}", "cuda", "sm_90a", options=CompileOptions(werror=True))
    shared = (64 + 128) * 128 * 2
    function = driver.function(driver.load(image.read_bytes()), "panel_probe", shared)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((64, 128)).astype(numpy_type)
    b = rng.standard_normal((128, 128)).astype(numpy_type)
    raw = np.zeros(2 * 128 * 64, np.float32)
    pointers, _owners = _upload(driver, a, b, raw)
    driver.launch(function, 1, 128, shared, pointers, [])
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[2], raw.nbytes)
    _product(raw[:128 * 64], a, b)
    _product(raw[128 * 64:], a, b)


@pytest.mark.gpu
def test_wgmma_m64n128k16_forms_match_numpy():
    """One 128-column product per k step: SS and RS with a K-major b, and RS with an N-major b of two 64-column
    panels (the descriptor's leading byte offset): each equals its product (a · bᵀ, a · v)."""
    driver = _sm90_driver()
    image = compile_gpu(WIDE_KERNEL, "wide_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    shared = (64 + 2 * 128) * 128 * 2
    function = driver.function(driver.load(image.read_bytes()), "wide_probe", shared)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((64, 128)).astype(np.float16)
    b = rng.standard_normal((128, 128)).astype(np.float16)
    v = rng.standard_normal((128, 128)).astype(np.float16)
    raw = np.zeros(3 * 128 * 64, np.float32)
    pointers, _owners = _upload(driver, a, b, v, raw)
    driver.launch(function, 1, 128, shared, pointers, [])
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[3], raw.nbytes)
    _product(raw[:128 * 64], a, b)
    _product(raw[128 * 64:2 * 128 * 64], a, b)
    _product(raw[2 * 128 * 64:], a, v.T.copy())


@pytest.mark.gpu
def test_tma_boxes_land_swizzled_and_feed_wgmma():
    """Two boxes by the bulk tensor copy (tensor maps from polyfuse.runtime.tma), completed on an mbarrier: a's
    tile lies in shared memory exactly as pf::swizzle128 says, and wgmma reads both tiles into a · bᵀ."""
    import ctypes

    from polyfuse.runtime.tma import encode_2d

    driver = _sm90_driver()
    if not hasattr(driver, "cu"):
        pytest.skip("passing a tensor map by value needs the cuda-python loader's cuLaunchKernel")
    image = compile_gpu(TMA_KERNEL, "tma_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    shared = 2 * 8192 + 8
    function = driver.function(driver.load(image.read_bytes()), "tma_probe", shared)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    raw = np.zeros(64 * 64, np.uint16)
    out = np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, a, b, raw, out)
    maps = [(ctypes.c_uint8 * 128).from_buffer_copy(encode_2d(p, "f16", 64, 64, 128, 64, 64)) for p in pointers[:2]]
    values = [*maps, ctypes.c_void_p(pointers[2]), ctypes.c_void_p(pointers[3])]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in values])
    driver.check(driver.cu.cuLaunchKernel(function, 1, 1, 1, 128, 1, 1, shared, 0, ctypes.addressof(params), 0),
                 "cuLaunchKernel")
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[2], raw.nbytes)
    driver.to_host(out.ctypes.data, pointers[3], out.nbytes)
    bits = a.view(np.uint16)
    for row, col in itertools.product(range(64), range(64)):
        assert raw[swizzle128(row, 2 * col) // 2] == bits[row, col], (row, col)
    _product(out, a, b)


@pytest.mark.gpu
def test_wgmma_with_a_from_registers_and_an_n_major_b_matches_numpy():
    """The RS form for P·V: P's fragment in registers, V [key][column] N-major with the transpose bit."""
    driver = _sm90_driver()
    image = compile_gpu(RS_KERNEL, "rs_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    function = driver.function(driver.load(image.read_bytes()), "rs_probe", 64 * 128)
    rng = np.random.default_rng(2)
    p = rng.random((64, 64)).astype(np.float16)
    v = rng.standard_normal((64, 64)).astype(np.float16)
    raw = np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, p, v, raw)
    driver.launch(function, 1, 128, 64 * 128, pointers, [])
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[2], raw.nbytes)
    _product(raw, p, v.T.copy())


def _fragments(raw: np.ndarray) -> np.ndarray:
    layout = WarpgroupFragment(64)
    out = np.full((64, 64), np.nan)
    for t, r in itertools.product(range(128), range(layout.registers)):
        out[layout.element(t, r)] = raw[t * 32 + r]
    return out


@pytest.mark.gpu
def test_accumulators_feed_the_next_product_from_registers():
    """S = Q·Kᵀ by wgmma, P = f16(S) straight from S's accumulators into the A fragments of P·V (RS form): S matches
    NumPy within the f32 bound, and O matches f16(S as computed)·V within it."""
    driver = _sm90_driver()
    image = compile_gpu(CHAIN_KERNEL, "chain_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    function = driver.function(driver.load(image.read_bytes()), "chain_probe", 3 * 8192)
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((64, 64)).astype(np.float16) * np.float16(0.25) for _ in range(3))
    s_raw, o_raw = np.zeros(128 * 32, np.float32), np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, q, k, v, s_raw, o_raw)
    driver.launch(function, 1, 128, 3 * 8192, pointers, [])
    driver.synchronize()
    driver.to_host(s_raw.ctypes.data, pointers[3], s_raw.nbytes)
    driver.to_host(o_raw.ctypes.data, pointers[4], o_raw.nbytes)
    _product(s_raw, q, k)
    p = _fragments(s_raw).astype(np.float32).astype(np.float16)  # (the kernel's rounding: to nearest even)
    _product(o_raw, p, v.T.copy())


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [1, 2, 7])
def test_a_producer_warpgroup_feeds_a_consumer_through_a_two_stage_ring(tiles):
    """Warp specialisation with setmaxnreg, TMA into a ring of two stages, full/empty mbarriers whose phases flip
    every two tiles: d = Σ_j q·k_jᵀ matches NumPy within the f32 bound of its 64·tiles additions."""
    import ctypes

    from polyfuse.runtime.tma import encode_2d

    driver = _sm90_driver()
    if not hasattr(driver, "cu"):
        pytest.skip("passing a tensor map by value needs the cuda-python loader's cuLaunchKernel")
    image = compile_gpu(PIPELINE_KERNEL, "pipeline_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    shared = 3 * 8192 + 32
    function = driver.function(driver.load(image.read_bytes()), "pipeline_probe", shared)
    rng = np.random.default_rng(4)
    k = rng.standard_normal((64 * tiles, 64)).astype(np.float16)
    q = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, k, q, out)
    tensor_map = (ctypes.c_uint8 * 128).from_buffer_copy(encode_2d(pointers[0], "f16", 64 * tiles, 64, 128, 64, 64))
    values = [tensor_map, ctypes.c_void_p(pointers[1]), ctypes.c_void_p(pointers[2]), ctypes.c_int64(tiles)]
    params = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in values])
    driver.check(driver.cu.cuLaunchKernel(function, 1, 1, 1, 256, 1, 1, shared, 0, ctypes.addressof(params), 0),
                 "cuLaunchKernel")
    driver.synchronize()
    driver.to_host(out.ctypes.data, pointers[2], out.nbytes)
    c = _fragments(out)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    exact = sum(q64 @ k64[64 * j:64 * j + 64].T for j in range(tiles))
    bound = 64 * tiles * 2.0 ** -24 * sum(np.abs(q64) @ np.abs(k64[64 * j:64 * j + 64]).T for j in range(tiles))
    assert np.all(np.abs(c - exact) <= bound + 2.0 ** -126), float(np.max(np.abs(c - exact) - bound))


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [1, 3])
def test_online_softmax_on_the_accumulators_matches_attention(tiles):
    """The register-resident step the Hopper prefill path composes: O = softmax(Q·Kᵀ/8)·V over 64·tiles keys, the
    statistics on S's fragment rows and P rounded once to f16 into P·V's registers.  Bound (GPU.md, numerics of
    rounding P once): (2⁻¹¹ + Skv·2⁻²⁵)·max|v| for P, plus the f32 exp and sums, (4 + 2·Skv)·2⁻²⁴·max|v|, and
    the f32 error of the scores."""
    driver = _sm90_driver()
    image = compile_gpu(ATTENTION_KERNEL, "attention_probe", "cuda", "sm_90a", options=CompileOptions(werror=True))
    function = driver.function(driver.load(image.read_bytes()), "attention_probe", 3 * 8192)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((64, 64)).astype(np.float16)
    k = rng.standard_normal((64 * tiles, 64)).astype(np.float16)
    v = rng.standard_normal((64 * tiles, 64)).astype(np.float16)
    raw = np.zeros(128 * 32, np.float32)
    pointers, _owners = _upload(driver, q, k, v, raw)
    driver.launch(function, 1, 128, 3 * 8192, pointers, [tiles])
    driver.synchronize()
    driver.to_host(raw.ctypes.data, pointers[3], raw.nbytes)
    scores = q.astype(np.float64) @ k.astype(np.float64).T / 8
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    exact = weights @ v.astype(np.float64) / weights.sum(axis=1, keepdims=True)
    keys = 64 * tiles
    # S's f32 sums are off by at most δ = 64·2⁻²⁴·Σ|q||k| / 8, which moves the weighted mean by at most 2δ·max|v|.
    delta = 64 * 2.0 ** -24 * (np.abs(q.astype(np.float64)) @ np.abs(k.astype(np.float64)).T).max() / 8
    terms = 2.0 ** -11 + keys * 2.0 ** -25 + (4 + 2 * keys) * 2.0 ** -24 + 2 * delta
    bound = terms * np.abs(v.astype(np.float64)).max()
    err = np.abs(_fragments(raw) - exact).max()
    assert err <= bound, (err, bound)
