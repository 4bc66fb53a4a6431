"""A size of 0 at run time: an empty reduction is its init, an empty output is empty, nothing crashes.

The plain program means ``init ⊕ (no terms)``: an empty sum is 0, an empty max -inf, a product 1, and
a non-identity init stays itself.  Both interpreters and the host kernel give that
(:mod:`polyfuse.ir.empty`), for the plain program and for a fused one; a spatial size of 0 gives
empty outputs everywhere, the CUDA runtime included (through a loader that records launches).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from ir_programs import softmax_sum
from test_emit_gpu import RecordingLoader

from polyfuse import tiling
from polyfuse.emit_cpp import CUDA, emit
from polyfuse.errors import UnboundSize
from polyfuse.ir import ProgramBuilder, interpret, maximum, minimum, reduce
from polyfuse.ir.empty import init_empty_reductions
from polyfuse.ir.stmt import Block, walk_stmts
from polyfuse.pipeline import build
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu import GpuKernel
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.transforms import Schedule
from polyfuse.transforms.rolling_update import rolling_update

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")

EMPTY = {"total": 0.0, "top": -np.inf, "bottom": np.inf, "product": 1.0, "offset": 2.5}
"""What each reduction of :func:`_reductions` is over no elements."""


def _reductions():
    """Row reductions of ``x[N, M]``: a sum, max, min and product with their identities, and a sum from 2.5."""
    p = ProgramBuilder("reductions")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    out = {name: p.output(name, (N,), "f32") for name in EMPTY}
    with p.nest("s_total", i=N, j=reduce(M)) as (i, j):
        out["total"][i] = out["total"][i] + x[i, j]
    with p.nest("s_top", i=N, j=reduce(M)) as (i, j):
        out["top"][i] = maximum(out["top"][i], x[i, j])
    with p.nest("s_bottom", i=N, j=reduce(M)) as (i, j):
        out["bottom"][i] = minimum(out["bottom"][i], x[i, j])
    with p.nest("s_product", i=N, j=reduce(M)) as (i, j):
        out["product"][i] = out["product"][i] * x[i, j]
    with p.nest("s_offset", i=N, j=reduce(M), init=2.5) as (i, j):
        out["offset"][i] = out["offset"][i] + x[i, j]
    return p.build()


def _runs(program, x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Outputs of ``program`` on ``x`` by the plain interpreter, the tile interpreter and the host kernel."""
    runs = {"ir": interpret(program, {program.inputs[0].name: x}),
            "tile": tiling.interpret(tiling.to_tiles(program), {program.inputs[0].name: x})}
    if shutil.which("g++") is not None:
        runs["cpp"] = build(program, werror=True).run({program.inputs[0].name: x})
    return runs


def test_empty_reductions_are_their_init_everywhere():
    x = np.zeros((3, 0), np.float32)
    for where, outputs in _runs(_reductions(), x).items():
        for name, value in EMPTY.items():
            assert np.array_equal(outputs[name], np.full(3, value, np.float32)), (where, name, outputs[name])


def test_nonempty_reductions_are_unchanged():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (3, 7)).astype(np.float32)
    expected = {"total": x.sum(1), "top": x.max(1), "bottom": x.min(1), "product": x.prod(1), "offset": 2.5 + x.sum(1)}
    for where, outputs in _runs(_reductions(), x).items():
        for name, value in expected.items():
            np.testing.assert_allclose(outputs[name], value, rtol=1e-6, err_msg=f"{where} {name}")


@pytest.mark.parametrize("shape", [(0, 4), (0, 0)])
def test_an_empty_spatial_dimension_gives_empty_outputs(shape):
    for where, outputs in _runs(_reductions(), np.zeros(shape, np.float32)).items():
        assert all(a.shape == (0,) for a in outputs.values()), where


def test_a_fused_program_at_size_0_is_the_plain_one():
    plain = softmax_sum()
    fused, _ = rolling_update(plain, block="s_sum", loop_block="s_max", loop="j")
    for shape in ((3, 0), (0, 5), (2, 6)):
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        expected = interpret(plain, {"inp": x})["xsum"]
        assert not np.isnan(expected).any()
        for where, outputs in _runs(fused, x).items():
            np.testing.assert_allclose(outputs["xsum"], expected, rtol=1e-6, err_msg=f"{where} {shape}")


def test_the_rewrite_adds_guarded_inits_after_loops_that_may_not_run():
    rewritten = init_empty_reductions(softmax_sum())
    added = {b.name: b for b in walk_stmts(rewritten.body) if isinstance(b, Block) and "_empty_" in b.name}
    assert set(added) == {"s_max_empty_j", "s_sum_empty_j"}  # s_exp is no reduction
    assert str(added["s_sum_empty_j"].where) == "M <= 0" and added["s_sum_empty_j"].store.value.value == 0.0
    assert str(added["s_max_empty_j"].store.value) == "-INF"
    assert "xsum[i] = 0.0" in str(rewritten) and 'p.where(M <= 0)' in str(rewritten)
    constant = softmax_sum(symbolic=False)
    assert init_empty_reductions(constant) is constant  # every loop runs at least once
    bound = softmax_sum().bind(N=2, M=0)
    assert "p.where" not in str(init_empty_reductions(bound))  # a constant 0: the init is unconditional


def test_the_inits_keep_the_loops_that_enumerate_outputs_and_drop_the_others():
    """The reduce loop split and moved outside the row loop: the init loops over rows, not over j_1."""
    sch = Schedule(softmax_sum())
    sch.reorder([sch.loop("s_sum", "j"), sch.loop("s_sum", "i")])
    sch.split(sch.loop("s_sum", "j"), [None, 4])
    rewritten = str(init_empty_reductions(sch.program))
    assert '''    with p.nest("s_sum_empty_j_0", i=N) as (i,):
        p.where((M + 3) // 4 <= 0)
        xsum[i] = 0.0''' in rewritten
    assert "s_sum_empty_j_1" not in rewritten and "s_exp_empty" not in rewritten
    for where, outputs in _runs(sch.program, np.zeros((3, 0), np.float32)).items():
        assert np.array_equal(outputs["xsum"], np.zeros(3, np.float32)), where


def test_sizes_may_be_0_but_not_negative():
    assert softmax_sum().bind(M=0).params == softmax_sum().bind(M=1).params
    with pytest.raises(UnboundSize, match="size M must be a non-negative integer, got -1"):
        softmax_sum().bind(M=-1)


@needs_gxx
def test_host_kernel_accepts_zero_sized_arrays():
    kernel = build(_reductions(), werror=True)
    outs = kernel(np.zeros((0, 3), np.float32))
    assert len(outs) == 5 and all(o.shape == (0,) for o in outs)
    given = [np.empty(0, np.float32) for _ in range(5)]
    assert kernel(np.zeros((0, 3), np.float32), *given)[0] is given[0]
    assert np.array_equal(kernel(np.zeros((2, 0), np.float32))[0], np.zeros(2, np.float32))


def test_gpu_kernel_skips_empty_grids(tmp_path):
    source = emit(tiling.to_tiles(_reductions()), CUDA)
    image = tmp_path / "k.cubin"
    image.write_bytes(b"")
    loader = RecordingLoader()
    kernel = GpuKernel(source, image, loader)
    outs = kernel(np.zeros((0, 3), np.float32))
    assert all(o.shape == (0,) for o in outs) and loader.launches == []  # every grid is N blocks: none launched
    kernel(np.zeros((2, 0), np.float32))
    assert loader.launches and all(blocks == 2 for _, blocks, *_ in loader.launches)


@pytest.mark.nvcc
def test_cuda_sources_with_empty_inits_compile_without_warnings():
    fused, _ = rolling_update(softmax_sum(), block="s_sum", loop_block="s_max", loop="j")
    for program in (_reductions(), fused):
        source = emit(tiling.to_tiles(program), CUDA)
        assert "_empty_j" in source.text
        compile_gpu(source.text, f"empty_{source.entry}", "cuda", CUDA.arch, options=CompileOptions(werror=True),
                    compile_only=True)
