"""Floating-point contraction: off unless ``build(..., fp_contract=True)`` asks, on every backend.

``y = 1 / (a·b - c·d)`` with ``a = c`` and ``b = d``: the difference is exactly 0 when each product
is rounded (NumPy, both interpreters, a kernel without contraction: ``y = inf``), and the rounding
error of ``c·d`` when ``a·b - c·d`` is one fused multiply-subtract (``y`` finite, about 1e16).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polyfuse import tiling
from polyfuse.emit_cpp import CUDA, HIP, emit
from polyfuse.ir import ProgramBuilder, interpret
from polyfuse.pipeline import build
from polyfuse.runtime.compiler import CompileOptions, host_flags
from polyfuse.runtime.gpu_compiler import command

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")


def _cancelling(n: int = 64):
    p = ProgramBuilder("cancelling")
    a, b, c, d = (p.input(name, (n,), "f32") for name in "abcd")
    y = p.output("y", (n,), "f32")
    with p.nest("s_y", i=n) as (i,):
        y[i] = 1.0 / (a[i] * b[i] - c[i] * d[i])
    return p.build()


def _inputs(n: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.uniform(1.0, 2.0, n).astype(np.float32)
    b = rng.uniform(1.0, 2.0, n).astype(np.float32)
    assert np.all(a.astype(np.float64) * b != (a * b).astype(np.float64))  # every product rounds
    return {"a": a, "b": b, "c": a.copy(), "d": b.copy()}


def _fma_hardware() -> bool:
    if platform.machine() in ("aarch64", "arm64"):
        return True
    try:
        return " fma " in f" {Path('/proc/cpuinfo').read_text()} ".replace("\n", " ")
    except OSError:
        return False


@needs_gxx
def test_host_kernel_rounds_every_product_as_the_interpreters_do():
    program, inputs = _cancelling(), _inputs()
    plain = interpret(program, inputs)["y"]
    tiled = tiling.interpret(tiling.to_tiles(program), inputs)["y"]
    kernel = build(program, werror=True)
    assert kernel.options == CompileOptions(fp_contract=False, werror=True)
    got = kernel.run(inputs)["y"]
    assert np.all(np.isposinf(plain))
    assert np.array_equal(tiled, plain) and np.array_equal(got, plain)


@needs_gxx
@pytest.mark.skipif(not _fma_hardware(), reason="the host has no FMA instruction to contract into")
def test_host_kernel_contracts_only_when_asked():
    program, inputs = _cancelling(), _inputs()
    exact = build(program, werror=True)
    fused = build(program, werror=True, fp_contract=True)
    assert fused.options.fp_contract and fused.library != exact.library  # the option is part of the cache key
    y = fused.run(inputs)["y"]
    a, b = inputs["a"], inputs["b"]
    error = (a.astype(np.float64) * b - (a * b).astype(np.float64)).astype(np.float32)  # of one product, exact
    assert np.array_equal(np.abs(y), np.float32(1) / np.abs(error))  # 1 / (a·b - round(c·d)), either product fused


def test_flags_say_what_the_options_ask():
    assert "-ffp-contract=off" in host_flags(CompileOptions())
    assert "-ffp-contract=fast" in host_flags(CompileOptions(fp_contract=True))
    assert "-Werror" in host_flags(CompileOptions(werror=True)) and "-Werror" not in host_flags(CompileOptions())
    # no flag that lets the compiler change a value
    assert not {"-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-ffinite-math-only"} & set(
        host_flags(CompileOptions(fp_contract=True)))


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc on PATH")
def test_hipcc_contracts_only_when_asked():
    plain = command("hip", HIP.arch, Path("k.hip"), Path("k.hsaco"))
    asked = command("hip", HIP.arch, Path("k.hip"), Path("k.hsaco"), CompileOptions(fp_contract=True))
    assert "-ffp-contract=off" in plain and "-ffp-contract=fast" in asked


def _ptx(text: str, options: CompileOptions, tmp_path: Path) -> str:
    """PTX of CUDA ``text`` compiled as ``compile_gpu`` compiles it, but to PTX (readable) instead of a cubin."""
    src, out = tmp_path / "k.cu", tmp_path / "k.ptx"
    src.write_text(text)
    cmd = ["-ptx" if flag == "-cubin" else flag for flag in command("cuda", CUDA.arch, src, out, options)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out.read_text()


@pytest.mark.nvcc
def test_nvcc_contracts_only_when_asked(tmp_path):
    text = emit(tiling.to_tiles(_cancelling()), CUDA).text
    plain = _ptx(text, CompileOptions(werror=True), tmp_path)
    asked = _ptx(text, CompileOptions(fp_contract=True, werror=True), tmp_path)
    # PTX ISA: a mul.f32 or add/sub.f32 without a rounding modifier may be fused into an fma by ptxas; with .rn
    # it may not.
    assert "mul.rn.f32" in plain and "sub.rn.f32" in plain and "mul.f32" not in plain and "fma." not in plain
    assert "mul.rn.f32" not in asked and ("mul.f32" in asked or "fma.rn.f32" in asked)
    assert "-fmad=false" in command("cuda", CUDA.arch, Path("k.cu"), Path("k.cubin"))
