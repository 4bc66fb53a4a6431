// polyfuse_host.h: helpers included by the host C++ kernels polyfuse generates.
//
// Low-precision floats are stored as raw bits (uint16_t for f16/bf16, uint8_t for fp8 e4m3fn)
// and computed in float; every conversion rounds to nearest even exactly as NumPy and ml_dtypes
// do, so a generated kernel rounds where the tile interpreter rounds.
//
// The helpers are branch-free where a loop of them should vectorize (f16_to_float, exp, select)
// and gemm keeps its accumulators in vector registers; kernels are built with -fno-trapping-math
// (polyfuse/runtime/compiler.py), which lets the compiler turn selects of float values into blends.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define PF_FN inline
#include "polyfuse_numpy.h"  // max, min, integer floordiv and mod

namespace pf {

// A gathered index (x[i, target[i]]) in 0 <= v < n, or false after recording the first fault as
// (site, value, extent) in fault[0..2] (site 0: none yet); the caller then skips the load.
inline bool gathered(int64_t v, int64_t n, int64_t* fault, int64_t site) {
    if (v >= 0 && v < n) return true;
    int64_t none = 0;
    if (__atomic_compare_exchange_n(&fault[0], &none, site, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        fault[1] = v;
        fault[2] = n;
    }
    return false;
}

inline uint32_t float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
}  // namespace pf

#include "polyfuse_round.h"  // f16 and bf16 bits rounded to nearest even

namespace pf {

// ---------------------------------------------------------------- f16 (IEEE binary16)
inline float f16_to_float(uint16_t h) {
    // Exact and branch-free, so that loops of conversions vectorize; subnormals come out of a
    // subtraction of normal floats (exact), so a denormals-are-zero mode cannot flush them.
    uint32_t x = h;
    uint32_t o = (x & 0x7fffu) << 13;                           // exponent and mantissa in place
    uint32_t exp = o & 0x0f800000u;
    o += 0x38000000u;                                            // exponent bias 15 -> 127
    o += exp == 0x0f800000u ? 0x38000000u : 0u;                  // inf/NaN: exponent 255
    float sub = bits_float(o + 0x00800000u) - 0x1p-14f;          // zero/subnormal: man·2^-24
    o = exp == 0u ? float_bits(sub) : o;
    return bits_float(o | ((x & 0x8000u) << 16));
}

inline uint16_t float_to_f16(float x) { return f16_bits_rne(x); }

inline float round_f16(float x) { return f16_to_float(float_to_f16(x)); }

// ---------------------------------------------------------------- bf16
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float x) { return bf16_bits_rne(x); }

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

// ---------------------------------------------------------------- exp
// exp(x) for float without a call or a table, so that loops of it vectorize: evaluated in double (x = n·ln2 + r, |r| <= ln2/2, a degree-8 Taylor polynomial, times 2^n made from bits) and
// rounded once to float.  The double value is within 2^-31 of exp(x) relatively, so the float is
// the correctly rounded exp(x) or, rarely, its neighbour: at most 1 ulp off (NumPy's float32 exp
// is up to 2 ulp off).  Overflow gives inf, underflow 0 or a subnormal; exp(-inf) = 0; NaN stays NaN.
inline uint64_t double_bits(double x) { uint64_t u; std::memcpy(&u, &x, 8); return u; }
inline double bits_double(uint64_t u) { double x; std::memcpy(&x, &u, 8); return x; }

inline float exp(float x) {
    float c = x < -104.0f ? -104.0f : x;                          // exp is 0 below -104 after rounding
    c = c > 89.0f ? 89.0f : c;                                    // and inf above 89
    double shifted = static_cast<double>(c) * 0x1.71547652b82fep0 + 0x1.8p52;  // round(c/ln2) in the low bits
    double n = shifted - 0x1.8p52;
    double r = static_cast<double>(c) - n * 0x1.62e42fefa39efp-1;
    double p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720
               + r * (1.0 / 5040 + r * (1.0 / 40320))))))));
    double scale = bits_double((double_bits(shifted) + 1023u) << 52);  // 2^n, n in [-150, 128]
    float y = static_cast<float>(p * scale);
    return x != x ? x : y;
}
inline double exp(double x) { return std::exp(x); }

// ---------------------------------------------------------------- gemm
// c[M][N] = Σ_k a[M][K]·b[K][N] (row-major, each c summed in k order from zero): blocks of MB rows ×
// NV vectors of columns accumulate in vector registers (GCC/Clang vector extensions, so the
// compiler keeps them there), the rest of the columns in scalars.
#if defined(__AVX__)
#define PF_VECTOR_BYTES 32
#else
#define PF_VECTOR_BYTES 16
#endif
#if defined(__AVX512VL__) || defined(__aarch64__)
#define PF_VECTOR_REGISTERS 32
#else
#define PF_VECTOR_REGISTERS 16
#endif

template <class T> struct vector_of { typedef T type; };  // other types: one lane
template <> struct vector_of<float> { typedef float type __attribute__((vector_size(PF_VECTOR_BYTES))); };
template <> struct vector_of<double> { typedef double type __attribute__((vector_size(PF_VECTOR_BYTES))); };

constexpr int largest_divisor(int n, int at_most) {
    int d = at_most < n ? at_most : n;
    while (d > 1 && n % d != 0) --d;
    return d < 1 ? 1 : d;
}

template <class T, int MB, int NV, int N, int K>
inline void gemm_block(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c) {
    using V = typename vector_of<T>::type;
    constexpr int L = sizeof(V) / sizeof(T);
    V acc[MB][NV] = {};
    for (int k = 0; k < K; ++k) {
        V bv[NV];
        for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * N + v * L, sizeof(V));
        for (int r = 0; r < MB; ++r) {
            const T x = a[r * K + k];
            for (int v = 0; v < NV; ++v) acc[r][v] += x * bv[v];
        }
    }
    for (int r = 0; r < MB; ++r)
        for (int v = 0; v < NV; ++v) std::memcpy(c + r * N + v * L, &acc[r][v], sizeof(V));
}

template <class T, int M, int N, int K>
inline void gemm(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c) {
    constexpr int L = sizeof(typename vector_of<T>::type) / sizeof(T);
    constexpr int vectors = N / L;
    constexpr int budget = PF_VECTOR_REGISTERS * 3 / 4;      // accumulators; the rest hold b and a
    constexpr int NV = largest_divisor(vectors, budget / 2 > 0 ? budget / 2 : 1);
    constexpr int MB = largest_divisor(M, budget / (NV > 0 ? NV : 1));
    if constexpr (vectors > 0) {
        for (int m = 0; m < M; m += MB)
            for (int n = 0; n < vectors * L; n += NV * L)
                gemm_block<T, MB, NV, N, K>(a + m * K, b + n, c + m * N + n);
    }
    for (int m = 0; m < M; ++m)
        for (int n = vectors * L; n < N; ++n) {
            T acc = 0;
            for (int k = 0; k < K; ++k) acc += a[m * K + k] * b[k * N + n];
            c[m * N + n] = acc;
        }
}

// ---------------------------------------------------------------- arithmetic with NumPy semantics (float overloads; the templates are in polyfuse_numpy.h)
// select(c, a, b): both values are evaluated (as in NumPy's where), so that no load or float
// operation sits in a branch of its own and loops of selects vectorize.  Floats are blended
// through a bit mask: a compiler vectorizes that even when c is a bool loaded from memory.
template <class A, class B> inline std::common_type_t<A, B> select(bool c, A a, B b) { return c ? a : b; }
inline float select(bool c, float a, float b) {
    uint32_t m = 0u - static_cast<uint32_t>(c);
    return bits_float((float_bits(a) & m) | (float_bits(b) & ~m));
}
inline double select(bool c, double a, double b) {
    uint64_t m = 0u - static_cast<uint64_t>(c);
    return bits_double((double_bits(a) & m) | (double_bits(b) & ~m));
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
