"""The runtime: argument checks before launch, DLPack, output arrays, compiler warnings (the cache: test_cache)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from polyfuse.pipeline import build
from polyfuse.cli.stages import Subject
from polyfuse.errors import LaunchError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")


@pytest.fixture(scope="session")
def softmax():
    subject = Subject.of("softmax", None, {})
    return build(subject.schedule(), sizes=subject.sizes, werror=True)


def _x(shape=(8, 40), dtype=np.float32):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _reference(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_kernel_returns_outputs_and_fills_given_ones(softmax):
    x = _x()
    np.testing.assert_allclose(softmax(x), _reference(x), rtol=1e-5)
    out = np.zeros((8, 40), np.float32)
    softmax(x, out)
    np.testing.assert_allclose(out, _reference(x), rtol=1e-5)
    assert "polyfuse_softmax" in softmax.source and softmax.signature.startswith("polyfuse_softmax(inp: f32[8, 40]")


class _DLPackOnly:
    """An array known only through the DLPack protocol."""

    def __init__(self, arr, device=(1, 0)):
        self.arr, self.device = arr, device

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


def test_dlpack_inputs_are_accepted(softmax):
    x = _x()
    np.testing.assert_allclose(softmax(_DLPackOnly(x)), _reference(x), rtol=1e-5)


@pytest.mark.parametrize(("args", "message"), [
    ((), r"kernel polyfuse_softmax takes 1 input array\(s\) \(inp\), or those followed by its output\(s\) \(y\); "
         r"got 0 argument\(s\)"),
    ((_x(dtype=np.float64),), r"argument 'inp' has dtype float64; expected f32 \(float32\)"),
    ((_x((8, 41)),), r"argument 'inp' has shape \(8, 41\); expected \(8, 40\)"),
    ((np.asfortranarray(_x()),), r"argument 'inp' is not C-contiguous"),
    (([[1.0]],), r"argument 'inp' must be a NumPy array or support __dlpack__; got list"),
    ((_DLPackOnly(_x(), device=(2, 0)),), r"argument 'inp' lives on DLPack device \(2, 0\); the host kernel needs a "
                                          r"CPU array"),
    ((_x(), np.zeros((8, 40), np.float16)), r"argument 'y' has dtype float16; expected f32"),
])
def test_bad_launches_name_the_argument(softmax, args, message):
    with pytest.raises(LaunchError, match=message):
        softmax(*args)


def test_read_only_output_and_unknown_size_are_refused(softmax):
    out = np.zeros((8, 40), np.float32)
    out.flags.writeable = False
    with pytest.raises(LaunchError, match="output argument 'y' is read-only"):
        softmax(_x(), out)
    with pytest.raises(LaunchError, match="kernel polyfuse_softmax has no size parameter\\(s\\) N2"):
        softmax(_x(), N2=3)


_WARNS = ('#include <cstdint>\nextern "C" int polyfuse_warns(void* const*, const int64_t*) { int unused; return 0; }\n')
"""A source g++ warns about (-Wunused-variable)."""


def test_compiler_warnings_are_surfaced_or_errors(tmp_path, monkeypatch):
    from polyfuse.errors import CompilerWarning, InternalError
    from polyfuse.runtime import CompileOptions, compile_host

    monkeypatch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path))  # an empty cache: built now, so it warns
    with pytest.warns(CompilerWarning, match=r"(?s)kernel 'warns'.*unused"):
        compile_host(_WARNS, "warns")
    with pytest.raises(InternalError, match=r"(?s)g\+\+ failed on the generated kernel 'warns'.*unused"):
        compile_host(_WARNS, "warns", options=CompileOptions(werror=True))
