// polyfuse_numpy.h: integer and comparison helpers with NumPy's semantics, shared by the host
// (polyfuse_host.h) and GPU (polyfuse_gpu.h) headers, which define PF_FN (how a helper is declared:
// inline on the host, __device__ __forceinline__ on GPUs) before including it.
#pragma once

#ifndef PF_FN
#error "include polyfuse_host.h or polyfuse_gpu.h, which define PF_FN"
#endif

namespace pf {

// max/min propagate NaN as NumPy's maximum/minimum do.
template <class T> PF_FN T max(T a, T b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
template <class T> PF_FN T min(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }

// Integer // and % round toward negative infinity (Python's); division by zero gives 0 as NumPy does.
template <class T> PF_FN T floordiv(T a, T b) {
    if (b == 0) return 0;
    T q = a / b;
    return ((a % b != 0) && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <class T> PF_FN T mod(T a, T b) {
    if (b == 0) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

}  // namespace pf
