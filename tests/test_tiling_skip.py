"""``skip_masked_tiles``: the key tiles a causal mask hides are skipped, and nothing else changes.

The tile interpreter is compared bitwise (``np.array_equal``, so +0.0 == -0.0) with the untruncated
program: the iterations that remain run exactly the same operations on the same values, and the
skipped ones left every carried value as it was (``max(m, -INF)`` is ``m``; the weights of masked
keys are exactly 0, their products with finite ``v`` too, and ``x + 0`` is ``x`` up to the sign of a
zero).  The host C++ backend is compared within the operator's tolerance: it sums in the same order,
but its ``exp`` is not NumPy's.
"""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

from polyfuse import ops, tiling
from polyfuse.emit_cpp import CUDA, HIP, emit
from polyfuse.errors import NoRepairFound
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Call, Const, Select, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import INPUT, OUTPUT, TEMP, Loop, Seq, Tensor
from polyfuse.ir.visit import substitute
from polyfuse.device import PRESETS
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.tiling.htile import Broadcast, Iota, Reduce, Slice, TileLoad, TileProgram, TileStore, walk_tile_stmts
from polyfuse.tiling.interpreter import _Runner
from polyfuse.tiling.skip import skip_masked_tiles

CAUSAL = ["attn_causal", "attn_alibi", "attn_gqa", "attn_softcap", "attn_window"]
SIZES = {"cpp": 72, "cuda": 200}
"""Query and key lengths per target: 16×16 host tiles, 32×64 GPU tiles, both with partial last tiles."""
FUSED = [(n, m) for n in ops.names() for m in ops.get(n).modes if has_default_schedule(n, m) and n != "quant_gemm_fp8"]


def _tiles(name: str, target: str, mode: str = "prefill", **sizes: int) -> tuple[TileProgram, dict[str, int]]:
    op = ops.get(name)
    sizes = op.sizes(mode, sizes)
    return tiling.to_tiles(default_schedule(name, mode, op.program(mode, **sizes), target=target).program), sizes


def _loop(program: TileProgram, var: str) -> Loop:
    return next(s for s in walk_tile_stmts(program.body) if isinstance(s, Loop) and s.var.name == var)


def _iterations(program: TileProgram) -> int:
    """Iterations of ``j_0`` over all ``i_0`` (the outer loops b, h aside)."""
    i_0, j_0 = _loop(program, "i_0"), _loop(program, "j_0")
    total = 0
    for i in range(int(i_0.extent.value)):
        run = _Runner({})
        total += int(run.expr(j_0.extent, {"i_0": np.int64(i)}).arr)
    return total


@pytest.mark.parametrize("target", ["cpp", "cuda"])
@pytest.mark.parametrize("name", CAUSAL)
def test_masked_key_tiles_are_skipped_and_results_do_not_change(name, target):
    program, sizes = _tiles(name, target, Sq=SIZES[target], Skv=SIZES[target])
    short = skip_masked_tiles(program)
    assert not isinstance(_loop(short, "j_0").extent, Const), "the key loop was not truncated"
    assert _iterations(short) < _iterations(program)
    op = ops.get(name)
    tolerance = op.tolerance("prefill", sizes)
    for seed, magnitude in ((0, 1.0), (1, op.magnitudes[-1])):
        inputs = op.inputs(seed, "prefill", sizes, magnitude)
        full, cut = tiling.interpret(program, inputs), tiling.interpret(short, inputs)
        assert all(np.array_equal(full[k], cut[k]) for k in full)
        comparison = ops.compare(cut, op.reference(inputs, "prefill", sizes), tolerance)
        assert comparison.ok, comparison.line()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")
@pytest.mark.parametrize("name", CAUSAL)
def test_host_cpp_runs_the_truncated_loop(name):
    op = ops.get(name)
    sizes = op.sizes("prefill", {"Sq": SIZES["cpp"], "Skv": SIZES["cpp"]})
    schedule = default_schedule(name, "prefill", op.program("prefill", **sizes))
    kernel = build(schedule, "cpp", sizes=sizes, werror=True)
    assert "j_0 < (i_0 + (1))" in kernel.source
    full = tiling.to_tiles(schedule.program)
    tolerance = op.tolerance("prefill", sizes)
    for seed in (0, 1):
        inputs = op.inputs(seed, "prefill", sizes)
        got = kernel.run(inputs)
        assert ops.compare(got, op.reference(inputs, "prefill", sizes), tolerance).ok
        assert ops.compare(got, tiling.interpret(full, inputs), tolerance).ok


def test_extent_is_one_past_the_last_key_tile_a_query_tile_sees():
    # GPU tiles of 128 query rows and 64 keys (sm_80's schedule): query tile i_0 sees key tiles 0 … 2·i_0 + 1
    op = ops.get("attn_causal")
    sizes = {**op.sizes("prefill"), "Sq": 512, "Skv": 512}
    gpu = tiling.to_tiles(default_schedule("attn_causal", "prefill", op.program("prefill", **sizes), target="cuda",
                                           device=PRESETS["sm_80"]).program)
    host, _ = _tiles("attn_causal", "cpp", Sq=256, Skv=256)
    i_0 = Var("i_0", dt.i32)
    extent = _loop(skip_masked_tiles(gpu), "j_0").extent
    assert [simplify(substitute(extent, {"i_0": Const(i, dt.i32)})) for i in range(4)] == [
        Const(2 * i + 2, dt.i32) for i in range(4)]
    assert _loop(skip_masked_tiles(host), "j_0").extent == BinOp("+", i_0, Const(1, dt.i32))


def test_half_the_key_tiles_are_skipped_at_4096():
    program, _ = _tiles("attn_causal", "cuda", Sq=4096, Skv=4096)
    assert _iterations(program) == 32 * 32  # query tiles of 128 rows, key tiles of 128 (sm_90a)
    assert _iterations(skip_masked_tiles(program)) == 528  # Σ (i_0 + 1): 1 - 528/1024, 48.4% skipped


def test_the_pass_is_idempotent_and_shown_in_the_tile_stage():
    from polyfuse.cli.stages import STAGES, Subject

    program, _ = _tiles("attn_causal", "cpp", Sq=64, Skv=64)
    once = skip_masked_tiles(program)
    assert skip_masked_tiles(once) is once
    assert "for j_0 in range(i_0 + 1):" in STAGES["tile"](Subject.of("attn_causal", "prefill", {"Sq": 64, "Skv": 64}))


@pytest.mark.parametrize("target", ["cpp", "cuda"])
@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_other_operators_are_unchanged(name, mode, target):
    if name in CAUSAL and mode == "prefill":
        pytest.skip("truncated (tested above)")
    try:
        program, _ = _tiles(name, target, mode)
    except NoRepairFound:
        pytest.skip(f"{name} does not fuse")
    assert skip_masked_tiles(program) is program


@pytest.mark.parametrize("name", ["attn_global", "attn_norm_inside"])
def test_unmasked_attention_is_unchanged_at_larger_sizes(name):
    for target in ("cpp", "cuda"):
        program, _ = _tiles(name, target, Sq=256, Skv=256)
        assert skip_masked_tiles(program) is program


@pytest.mark.nvcc
@pytest.mark.parametrize("name", CAUSAL)
def test_truncated_cuda_kernels_compile(name):
    from polyfuse.runtime.gpu_compiler import compile_gpu

    source = emit(_tiles(name, "cuda", Sq=256, Skv=256)[0], CUDA)
    assert re.search(r"for \(int j_0 = 0; j_0 < \([^;]*i_0", source.text)  # the extent depends on the query tile
    compile_gpu(source.text, f"{name}_skip", "cuda", source.target.arch, options=CompileOptions(werror=True),
                compile_only=True)


@pytest.mark.skipif(shutil.which("hipcc") is None, reason="needs hipcc")
def test_truncated_hip_kernel_compiles():
    from polyfuse.runtime.gpu_compiler import compile_gpu

    source = emit(_tiles("attn_causal", "hip", Sq=256, Skv=256)[0], HIP)
    assert re.search(r"for \(int j_0 = 0; j_0 < \([^;]*i_0", source.text)
    compile_gpu(source.text, "attn_causal_skip", "hip", source.target.arch, options=CompileOptions(werror=True),
                compile_only=True)


# ---------------------------------------------------------------- hand-built programs
T, N = 8, 32
I32, F32 = dt.i32, dt.f32


def _masked_sum(term, *, masked_at_start: bool = False, finite: bool = True) -> TileProgram:
    """``acc[i] = Σ_j term(s)`` with ``s = select(j > i, -INF, x)`` over 8×8 tiles, rolling over key tiles
    (``x`` declared finite unless ``finite`` is false)."""
    i_0, j_0 = Var("i_0", I32), Var("j_0", I32)
    x = Tensor("x", (Const(N, I32), Const(N, I32)), F32, INPUT, finite=finite)
    s = Tensor("s", (Const(T, I32), Const(T, I32)), F32, TEMP)
    acc = Tensor("acc", (Const(N, I32),), F32, OUTPUT)
    both = (("a", T), ("b", T))
    rows = Broadcast(BinOp("+", BinOp("*", i_0, Const(T, I32)), Iota("a", T)), both)
    cols = Broadcast(BinOp("+", BinOp("*", j_0, Const(T, I32)), Iota("b", T)), both)
    mask = BinOp("<" if masked_at_start else ">", cols, rows)
    at_x = (Slice(BinOp("*", i_0, Const(T, I32)), T, "a"), Slice(BinOp("*", j_0, Const(T, I32)), T, "b"))
    at_s = (Slice(Const(0, I32), T, "a"), Slice(Const(0, I32), T, "b"))
    at_acc = (Slice(BinOp("*", i_0, Const(T, I32)), T, "a"),)
    score = TileStore("s", s, at_s, Select(mask, Const(-math.inf, F32), TileLoad(x, at_x)))
    previous = Select(BinOp("==", j_0, Const(0, I32)), Const(0.0, F32), TileLoad(acc, at_acc))
    update = TileStore("acc", acc, at_acc, BinOp("+", previous, Reduce("sum", term(TileLoad(s, at_s)), "b")))
    inner = Loop(j_0, Const(N // T, I32), Seq((score, update)), annotations=(("alloc", "s"),))
    return TileProgram("masked_sum", (), (x, s, acc), Loop(i_0, Const(N // T, I32), inner))


def _exp(t):
    return Call("exp", (t,))


def test_masked_exponentials_are_skipped():
    program = _masked_sum(_exp)
    short = skip_masked_tiles(program)
    assert _loop(short, "j_0").extent == BinOp("+", Var("i_0", I32), Const(1, I32))
    x = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    full, cut = tiling.interpret(program, {"x": x}), tiling.interpret(short, {"x": x})
    assert np.array_equal(full["acc"], cut["acc"])


def test_data_not_declared_finite_keep_the_loop():
    """An infinite x at a masked position makes the plain program's exp(-INF)·… a NaN the skip would lose
    (0·inf); without finite=True on x the proof's assumption is not given, and the loop stays."""
    program = _masked_sum(_exp, finite=False)
    assert skip_masked_tiles(program) is program


@pytest.mark.parametrize("term", [
    lambda t: t,  # -INF summed without an exp: the masked tiles make the sum -INF
    lambda t: BinOp("+", _exp(t), Const(1.0, F32)),  # a masked position contributes 1
    lambda t: Call("abs", (t,)),  # |-INF| = INF
], ids=["raw", "plus-one", "abs"])
def test_contributing_masked_positions_keep_the_loop(term):
    program = _masked_sum(term)
    assert skip_masked_tiles(program) is program


def test_masked_prefix_is_not_a_suffix():
    program = _masked_sum(_exp, masked_at_start=True)
    assert skip_masked_tiles(program) is program


def test_a_masked_store_that_is_read_after_the_loop_keeps_it():
    """Here ``s`` is an output: its last tile (masked) is observable, so no iteration may be skipped."""
    program = _masked_sum(_exp)
    tensors = tuple(Tensor(t.name, t.shape, t.dtype, OUTPUT) if t.name == "s" else t for t in program.tensors)
    body = program.body

    def retarget(stmt):
        if isinstance(stmt, Loop):
            return stmt.replace(body=retarget(stmt.body), annotations=())
        if isinstance(stmt, Seq):
            return Seq(tuple(retarget(c) for c in stmt.stmts))
        return TileStore(stmt.block, tensors[1], stmt.index, stmt.value) if stmt.tensor.name == "s" else stmt

    observed = TileProgram("masked_sum", (), tensors, retarget(body))
    assert skip_masked_tiles(observed) is observed


def test_symbolic_sizes_give_an_extent_in_the_size_parameters():
    """With ``m`` query and ``n`` key rows unbound: ``min(n // 8, min(i_0, n // 8 - 1) + 1)``, empty when n < 8."""
    program = _masked_sum(_exp)
    m, n = Var("m", I32), Var("n", I32)

    def unbind(stmt, depth=0):
        if not isinstance(stmt, Loop):
            return stmt
        return stmt.replace(extent=BinOp("//", m if depth == 0 else n, Const(T, I32)), body=unbind(stmt.body, 1))

    shapes = {"x": (m, n), "acc": (m,)}
    tensors = tuple(Tensor(t.name, shapes.get(t.name, t.shape), t.dtype, t.role, finite=t.finite)
                    for t in program.tensors)
    symbolic = TileProgram("masked_sum", (m, n), tensors, unbind(program.body))
    short = skip_masked_tiles(symbolic)
    extent = _loop(short, "j_0").extent
    assert isinstance(extent, BinOp) and extent.op == "min"
    for rows, cols in ((40, 24), (24, 40), (40, 40), (8, 0)):
        x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
        full, cut = tiling.interpret(symbolic, {"x": x}), tiling.interpret(short, {"x": x})
        assert np.array_equal(full["acc"], cut["acc"], equal_nan=True)
