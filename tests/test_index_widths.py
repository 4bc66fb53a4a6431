"""Index widths: 64-bit counters and index arithmetic wherever a value can pass 2^31 - 1.

A kernel over more than 2^31 elements is too big to run here, so the emitted text is checked
(counter types, index casts) and compiled with warnings as errors (g++ warns that a 32-bit counter
compared with a larger extent is always true); a moderately sized symbolic program runs.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from ir_programs import softmax_sum

from polyfuse import tiling
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.emit_cpp.widths import index_widths
from polyfuse.tiling.gpu import lower_for_gpu
from polyfuse.ir import ProgramBuilder, interpret
from polyfuse.pipeline import build
from polyfuse.runtime.compiler import CompileOptions, compile_host
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.transforms import Schedule

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")
WERROR = CompileOptions(werror=True)
BIG = 2 ** 31 + 1024
"""An extent just above 2^31 - 1 (a multiple of 1024, so the split below has no partial tile)."""


def _scaled(n: int, tile: int | None = None):
    """``y[i] = 2·x[i]`` over ``n`` elements, the loop split into tiles of ``tile`` if given."""
    p = ProgramBuilder("scaled")
    x = p.input("x", (n,), "f32")
    y = p.output("y", (n,), "f32")
    with p.nest("s_y", i=n) as (i,):
        y[i] = x[i] * 2.0
    sch = Schedule(p.build())
    if tile is not None:
        outer, _ = sch.split(sch.loop("s_y", "i"), [None, tile])
        sch.bind(outer, "blockIdx.x")  # a loop over tiles (unbound, both loops would be axes of one tile)
    return sch.program


def _split_softmax_sum():
    sch = Schedule(softmax_sum())
    sch.split(sch.loop("s_sum", "j"), [None, 16])
    return sch.program


def _counters(text: str, prefix: str = "") -> set[str]:
    """The types of the loop counters declared in ``text`` whose names start with ``prefix``."""
    return set(re.findall(rf"for \((\w+) {prefix}\w* = ", text))


def test_constant_programs_below_2_31_stay_32_bit():
    widths = index_widths(tiling.to_tiles(_scaled(4096, 1024)))
    assert (widths.loop, widths.tile) == ("int", "int")
    assert "below 2^31" in widths.reason


def test_a_symbolic_size_makes_loops_and_index_arithmetic_64_bit():
    program = _split_softmax_sum()
    widths = index_widths(tiling.to_tiles(program))
    assert (widths.loop, widths.tile) == ("int64_t", "int") and "N, M" in widths.reason
    host = emit(tiling.to_tiles(program), "cpp").text
    assert "for (int64_t i = 0; i < N; ++i)" in host and "for (int64_t j_0 = 0; j_0 < " in host
    assert _counters(host, "i") == _counters(host, "j") == {"int64_t"}  # program loops
    assert _counters(host, "x_") == {"int"}  # tile axes of 16
    assert "int32_t" not in host
    assert "pf::floordiv(static_cast<int64_t>((M + (15)))" in host  # the extent of j_0 in 64 bits
    cuda = emit(tiling.to_tiles(program), CUDA).text
    assert "const int64_t i = static_cast<int64_t>(pf_bid % N);" in cuda
    assert "static_cast<int32_t>" not in cuda


def test_an_extent_of_2_31_makes_the_tile_counters_64_bit():
    widths = index_widths(tiling.to_tiles(_scaled(BIG)))  # one tile over the whole loop
    assert widths.tile == widths.loop == "int64_t" and "tile axis i may reach 2^31" in widths.reason
    host = emit(tiling.to_tiles(_scaled(BIG)), "cpp").text
    assert f"for (int64_t x_i = 0; x_i < {BIG}; ++x_i)" in host


def test_an_index_expression_past_2_31_makes_the_loops_64_bit():
    """Tiles of 1024: the tile loop has 2^21 + 1 iterations, but ``1024·i_0 + x_i`` passes 2^31 - 1."""
    tiles = tiling.to_tiles(_scaled(BIG, 1024))
    widths = index_widths(tiles)
    assert (widths.loop, widths.tile) == ("int64_t", "int")
    assert "block 's_y'" in widths.reason and "i_0" in widths.reason
    host = emit(tiles, "cpp").text
    assert "for (int64_t i_0 = 0; i_0 < (2097153); ++i_0)" in host
    assert "for (int x_i_1 = 0; x_i_1 < 1024; ++x_i_1)" in host
    assert "const int64_t i_0 = static_cast<int64_t>(pf_bid % (2097153));" in emit(tiles, CUDA).text


@needs_gxx
@pytest.mark.parametrize("program", [_split_softmax_sum, lambda: _scaled(BIG), lambda: _scaled(BIG, 1024)],
                         ids=["symbolic", "one_tile", "tiled"])
def test_wide_host_kernels_compile_without_warnings(program):
    source = emit(tiling.to_tiles(program()), "cpp")
    compile_host(source.text, f"widths_{source.entry}", options=WERROR)


@pytest.mark.nvcc
@pytest.mark.parametrize("program", [_split_softmax_sum, lambda: _scaled(BIG, 1024)], ids=["symbolic", "tiled"])
def test_wide_cuda_kernels_compile_without_warnings(program):
    tiles = tiling.to_tiles(program())
    assert index_widths(lower_for_gpu(tiles).program).loop == "int64_t"
    source = emit(tiles, CUDA)
    compile_gpu(source.text, f"widths_{source.entry}", "cuda", CUDA.arch, options=WERROR, compile_only=True)


@needs_gxx
def test_a_symbolic_program_runs_with_64_bit_indices():
    program = _split_softmax_sum()
    kernel = build(program, werror=True)
    x = np.random.default_rng(0).standard_normal((3, 5000)).astype(np.float32)
    expected = interpret(program, {"inp": x})["xsum"]
    np.testing.assert_allclose(kernel(x), expected, rtol=5000 * 2 ** -24)
