"""The host C++ backend against the NumPy reference: every fused catalog operator, several seeds.

Kernels are built with ``-Wall -Wextra -Werror`` (generated code must be warning-free) and cached
on disk, so a second run of the suite compiles nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from polyfuse import ops
from polyfuse.pipeline import build, stages
from polyfuse.cli.stages import BACKENDS, STAGES, Subject
from polyfuse.emit_cpp import Target, emit
from polyfuse.errors import BackendUnavailable, NoRepairFound
from polyfuse.tiling import to_tiles

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")


def _subjects() -> list[tuple[str, str]]:
    out = []
    for name in ops.names():
        op = ops.get(name)
        for mode in getattr(op, "modes", None) or [None]:
            out.append((name, mode))
    return out


@pytest.mark.parametrize(("name", "mode"), _subjects(), ids=lambda x: str(x))
def test_every_fused_operator_matches_numpy_on_the_host(name, mode):
    subject = Subject.of(name, mode, {})
    try:
        schedule = subject.schedule()
    except NoRepairFound:
        pytest.skip(f"{name} does not fuse exactly (refused by the repair solver)")
    kernel = build(schedule, sizes=subject.sizes, werror=True)
    tolerance = subject.op.tolerance(subject.mode, subject.sizes)
    for seed in (0, 1, 2):
        inputs = subject.op.inputs(seed, subject.mode, subject.sizes)
        comparison = ops.compare(kernel.run(inputs), subject.op.reference(inputs, subject.mode, subject.sizes),
                                 tolerance)
        assert comparison.ok, f"{subject} seed {seed}: {comparison.line()} worst {comparison.worst}"


def test_cpp_is_a_stage_and_a_backend():
    assert "cpp" in STAGES and "cpp" in BACKENDS


def test_cli_check_and_show_cpp():
    done = subprocess.run([sys.executable, "-m", "polyfuse", "check", "softmax", "--backend", "cpp", "--seed", "5"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("OK")
    shown = subprocess.run([sys.executable, "-m", "polyfuse", "show", "softmax", "--stage", "cpp"],
                           capture_output=True, text=True, check=False)
    assert shown.returncode == 0 and 'extern "C" int polyfuse_softmax(' in shown.stdout


def test_cli_check_cpp_exits_4_without_a_compiler(monkeypatch, capsys):
    from polyfuse.cli import main

    monkeypatch.setenv("CXX", "no-such-compiler-polyfuse")
    code = main(["check", "softmax", "--backend", "cpp"])
    assert code == 4 and "no-such-compiler-polyfuse" in capsys.readouterr().err


def test_emit_signature_and_parallel_loops():
    subject = Subject.of("softmax", None, {})
    source = emit(to_tiles(subject.schedule().program), Target("cpp"))
    assert [a.name for a in source.args] == ["inp", "y"]
    assert source.args[0].shape == (8, 40) and str(source.args[0].dtype) == "f32"
    assert source.signature == "polyfuse_softmax(inp: f32[8, 40] (input), y: f32[8, 40] (output))"
    assert "#pragma omp parallel for" in source.text  # rows are independent


def test_unknown_backend_is_unavailable():
    subject = Subject.of("softmax", None, {})
    with pytest.raises(BackendUnavailable, match="no emitter for backend 'opencl'"):
        emit(to_tiles(subject.schedule().program), Target("opencl"))


def test_stages_are_dumpable():
    built = stages(Subject.of("softmax", None, {}).schedule())
    assert "tile program softmax" in built.dump("tile")
    assert built.dump("source") == built.source.text


# ------------------------------------------------------------------ low-precision conversions
_CONVERSIONS = r"""
#include "polyfuse_host.h"
#define MAP(NAME, IN, OUT, FN) extern "C" void NAME(const IN* x, OUT* y, int64_t n) { \
    for (int64_t i = 0; i < n; ++i) y[i] = pf::FN(x[i]); }
MAP(f16_to_f32, uint16_t, float, f16_to_float)
MAP(f32_to_f16, float, uint16_t, float_to_f16)
MAP(f32_to_bf16, float, uint16_t, float_to_bf16)
MAP(f32_to_fp8, float, uint8_t, float_to_fp8)
MAP(fp8_to_f32, uint8_t, float, fp8_to_float)
"""


@pytest.fixture(scope="module")
def conversions():
    import ctypes

    from polyfuse.runtime import CompileOptions, compile_host

    return ctypes.CDLL(str(compile_host(_CONVERSIONS, "conversions", options=CompileOptions(werror=True))))


def _call(lib, fn, x, out_dtype):
    import ctypes

    x = np.ascontiguousarray(x)
    y = np.empty(x.shape, dtype=out_dtype)
    getattr(lib, fn)(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(x.size))
    return y


def _floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.9, 65520, 1e-8, 6e-8, 448, 464, 465, 1e30],
                       dtype=np.float32)
    wide = (rng.standard_normal(200_000) * np.exp2(rng.integers(-30, 20, 200_000))).astype(np.float32)
    return np.concatenate([special, -special, wide])


def test_f16_conversions_match_numpy(conversions):
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = _call(conversions, "f16_to_f32", bits, np.float32)
    np.testing.assert_array_equal(got, bits.view(np.float16).astype(np.float32))
    x = _floats()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(_call(conversions, "f32_to_f16", x, np.uint16), want)


def test_bf16_and_fp8_conversions_match_ml_dtypes(conversions):
    x = _floats()
    np.testing.assert_array_equal(_call(conversions, "f32_to_bf16", x, np.uint16),
                                  x.astype(ml_dtypes.bfloat16).view(np.uint16))
    want = x.astype(ml_dtypes.float8_e4m3fn)
    got = _call(conversions, "f32_to_fp8", x, np.uint8).view(ml_dtypes.float8_e4m3fn)
    same = (got.astype(np.float32) == want.astype(np.float32)) | (np.isnan(got.astype(np.float32))
                                                                   & np.isnan(want.astype(np.float32)))
    assert same.all(), x[~same][:10]
    bits = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(_call(conversions, "fp8_to_f32", bits, np.float32),
                                  bits.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


def test_a_bool_temporary_on_the_heap_compiles_and_runs():
    # Temporaries not allocated at a loop (and large local ones) live on the heap: a bool one too, which a
    # std::vector<bool> (bits, no data()) could not hold.
    from polyfuse.ir import ProgramBuilder
    from polyfuse.ir.expr import select
    from polyfuse.pipeline import build

    p = ProgramBuilder("positive_part")
    n = p.size("N")
    x = p.input("x", (n,), "f32")
    m = p.temp("m", (n,), "bool")
    y = p.output("y", (n,), "f32")
    with p.nest("s_m", i=n) as (i,):
        m[i] = x[i] > 0.0
    with p.nest("s_y", i=n) as (i,):
        y[i] = select(m[i], x[i], 0.0)
    kernel = build(p.build(), "cpp")
    assert "std::make_unique<bool[]>" in kernel.source
    xs = np.array([-1.0, 2.0, 0.0, 3.5], dtype=np.float32)
    np.testing.assert_array_equal(kernel.run({"x": xs})["y"], np.maximum(xs, 0.0))
