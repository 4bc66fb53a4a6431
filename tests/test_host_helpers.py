"""The vectorizable helpers of polyfuse_host.h (exp, gemm) against NumPy, and how the host emitter uses them."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from polyfuse.pipeline import stages
from polyfuse.cli.stages import Subject

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")

_HELPERS = r"""
#include "polyfuse_host.h"
extern "C" void exp_f32(const float* x, float* y, int64_t n) { for (int64_t i = 0; i < n; ++i) y[i] = pf::exp(x[i]); }
#define GEMM(NAME, T, M, N, K) \
    extern "C" void NAME(const T* a, const T* b, T* c) { pf::gemm<T, M, N, K>(a, b, c); }
GEMM(gemm_f32_16x16x64, float, 16, 16, 64)
GEMM(gemm_f32_16x64x16, float, 16, 64, 16)
GEMM(gemm_f32_5x19x7, float, 5, 19, 7)
GEMM(gemm_f32_1x3x1, float, 1, 3, 1)
GEMM(gemm_f64_6x12x5, double, 6, 12, 5)
GEMM(gemm_i32_3x10x4, int32_t, 3, 10, 4)
"""


@pytest.fixture(scope="module")
def helpers():
    from polyfuse.runtime import CompileOptions, compile_host

    return ctypes.CDLL(str(compile_host(_HELPERS, "helpers", options=CompileOptions(werror=True))))


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 arrays of one sign (or zero)."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_exp_is_within_one_ulp_of_the_correctly_rounded_value(helpers):
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 88.72283, 88.72284, 89.0, 100.0, -87.33654, -103.97,
               -103.98, -104.0, -200.0, 1e-30, -1e-30, 2.0 ** -149]
    x = np.concatenate([special, rng.uniform(-110.0, 95.0, 400_000), rng.uniform(-1.0, 1.0, 100_000),
                        rng.standard_normal(100_000) * 1e-6]).astype(np.float32)
    y = np.empty_like(x)
    helpers.exp_f32(_ptr(x), _ptr(y), ctypes.c_int64(x.size))
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(y[~finite], want[~finite])  # overflow to inf
    assert _ulps(y[finite], want[finite]).max() <= 1
    assert (y == want).mean() > 0.999  # almost always correctly rounded
    assert y[5] == 0.0 and y[0] == 1.0  # exp(-inf), exp(0)
    nan = np.array([np.nan, -np.nan], np.float32)
    out = np.empty_like(nan)
    helpers.exp_f32(_ptr(nan), _ptr(out), ctypes.c_int64(2))
    assert np.isnan(out).all()


@pytest.mark.parametrize(("name", "dtype", "m", "n", "k"), [
    ("gemm_f32_16x16x64", np.float32, 16, 16, 64), ("gemm_f32_16x64x16", np.float32, 16, 64, 16),
    ("gemm_f32_5x19x7", np.float32, 5, 19, 7), ("gemm_f32_1x3x1", np.float32, 1, 3, 1),
    ("gemm_f64_6x12x5", np.float64, 6, 12, 5), ("gemm_i32_3x10x4", np.int32, 3, 10, 4),
])
def test_gemm_matches_numpy(helpers, name, dtype, m, n, k):
    """Every shape, with column counts that are and are not multiples of the vector width."""
    rng = np.random.default_rng(1)
    a = rng.integers(-8, 8, (m, k)).astype(dtype)
    b = rng.integers(-8, 8, (k, n)).astype(dtype)
    c = np.full((m, n), 7, dtype)
    getattr(helpers, name)(_ptr(a), _ptr(b), _ptr(c))
    np.testing.assert_array_equal(c, a @ b)  # small integers: exact in any summation order


def test_host_attention_uses_the_vectorizable_helpers():
    subject = Subject.of("attn_causal", "prefill", {})
    text = stages(subject.schedule(), "cpp").source.text
    assert "pf::gemm<float, 16, 16, 16>(" in text  # q·kᵀ of one 16×16 tile pair, d = 16
    assert "pf::exp(" in text and "std::exp(" not in text
    assert "pf::select(" in text
