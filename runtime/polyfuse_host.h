// polyfuse_host.h: helpers included by the host C++ kernels polyfuse generates.
//
// Low-precision floats are stored as raw bits (uint16_t for f16/bf16, uint8_t for fp8 e4m3fn)
// and computed in float; every conversion rounds to nearest even exactly as NumPy and ml_dtypes
// do, so a generated kernel rounds where the tile interpreter rounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pf {

inline uint32_t float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

// ---------------------------------------------------------------- f16 (IEEE binary16)
inline float f16_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = std::ldexp(static_cast<float>(man), -24);
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_f16(float x) {
    uint32_t u = float_bits(x);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN / inf
    if (a >= 0x477ff000u) return sign | 0x7c00u;                                 // rounds past 65504
    if (a < 0x38800000u) {                                                        // subnormal or zero
        float v = bits_float(a) * 16777216.0f;                                    // exact: scale by 2^24
        return sign | static_cast<uint16_t>(std::nearbyint(v));
    }
    uint32_t m = a + 0xfffu + ((a >> 13) & 1u);                                   // round to nearest even
    return sign | static_cast<uint16_t>((m - 0x38000000u) >> 13);
}

inline float round_f16(float x) { return f16_to_float(float_to_f16(x)); }

// ---------------------------------------------------------------- bf16
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// ---------------------------------------------------------------- fp8 e4m3fn (no inf; NaN = 0x7f)
inline float fp8_to_float(uint8_t b) {
    uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 0xf && man == 0x7) v = NAN;
    else if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);
    else v = std::ldexp(static_cast<float>(8 + man), static_cast<int>(exp) - 10);
    return (b & 0x80u) ? -v : v;
}

inline uint8_t float_to_fp8(float x) {
    uint8_t sign = std::signbit(x) ? 0x80u : 0u;
    float a = std::fabs(x);
    if (std::isnan(a) || a > 464.0f) return sign | 0x7fu;
    if (a < 0.015625f) return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
    int e;
    float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int q = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
    e -= 1;
    if (q == 8) { q = 0; e += 1; }
    uint32_t bits = (static_cast<uint32_t>(e + 7) << 3) | static_cast<uint32_t>(q);
    return sign | static_cast<uint8_t>(bits > 0x7eu ? 0x7fu : bits);
}

inline float round_fp8(float x) { return fp8_to_float(float_to_fp8(x)); }

// ---------------------------------------------------------------- arithmetic with NumPy semantics
template <class T> inline T max(T a, T b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
template <class T> inline T min(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }

template <class T> inline T floordiv(T a, T b) {
    if (b == 0) return 0;
    T q = a / b;
    return ((a % b != 0) && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <class T> inline T mod(T a, T b) {
    if (b == 0) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline float floordiv(float a, float b) { return std::floor(a / b); }
inline double floordiv(double a, double b) { return std::floor(a / b); }
inline float mod(float a, float b) {
    float r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline double mod(double a, double b) {
    double r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

}  // namespace pf
