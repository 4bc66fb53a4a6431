// polyfuse_round.h: f32 rounded to the bits of f16 and bf16 with integer operations, to nearest even as NumPy
// and ml_dtypes round, shared by the host header (polyfuse_host.h) and the GPU header's paths without a
// hardware conversion (polyfuse_gpu.h: HIP, and bf16 before sm_80).  The including header defines PF_FN and
// pf::float_bits / pf::bits_float (its own bit casts) before it.
#pragma once

#ifndef PF_FN
#error "include polyfuse_host.h or polyfuse_gpu.h, which define PF_FN"
#endif

namespace pf {

PF_FN uint16_t f16_bits_rne(float x) {
    uint32_t u = float_bits(x);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN / inf
    if (a >= 0x477ff000u) return sign | 0x7c00u;                                 // rounds past 65504
    if (a < 0x38800000u) {                                                        // subnormal or zero
        float v = bits_float(a) * 16777216.0f;                                    // exact: scale by 2^24
        return sign | static_cast<uint16_t>(rintf(v));                            // (to nearest even)
    }
    uint32_t m = a + 0xfffu + ((a >> 13) & 1u);                                   // round to nearest even
    return sign | static_cast<uint16_t>((m - 0x38000000u) >> 13);
}

PF_FN uint16_t bf16_bits_rne(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace pf
