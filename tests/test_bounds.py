"""Every access is proven in bounds when a program is built and when it is compiled (``polyfuse.deps.bounds``).

Refusals name the block, the reference, the dimension with its index and a witness instance (with the sizes
when they are symbolic); the verdict is the interpreter's, for every size, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import polyfuse
from ir_programs import softmax_sum
from polyfuse import ops
from polyfuse.deps.bounds import out_of_bounds
from polyfuse.errors import OutOfBounds, PolyfuseError
from polyfuse.ir import ProgramBuilder, const, interpret, reduce, spatial, te
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import Expr, Var
from polyfuse.ir.stmt import INPUT, OUTPUT, Block, IterVar, Loop, Program, Store, Tensor
from polyfuse.ir.validate import validate
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.pipeline import stages
from polyfuse.transforms import Schedule


def _shift(symbolic: bool, *, read: int = 1, write: int = 0) -> ProgramBuilder:
    """``y[i, j + write] = x[i, j + read]`` over ``x, y: (N, M)`` (``N, M = 2, 3`` unless ``symbolic``)."""
    p = ProgramBuilder("shift")
    N, M = p.sizes("N", "M") if symbolic else (2, 3)
    x = p.input("x", (N, M), "f32")
    y = p.output("y", (N, M), "f32")
    with p.nest("s", i=N, j=M) as (i, j):
        y[i, j + write] = x[i, j + read]
    return p


# ------------------------------------------------------------------ refusals at build


@pytest.mark.parametrize(("symbolic", "witness"), [
    (False, "at i = 0, j = 2 it is 3, so the block reads x[0, 3]"),
    (True, "at i = 0, j = 0 with N = 1, M = 1 it is 1, so the block reads x[0, 1]"),
])
def test_a_read_past_the_end_is_refused_at_build(symbolic, witness):
    with pytest.raises(OutOfBounds) as err:
        _shift(symbolic).build()
    msg = str(err.value)
    assert msg.startswith("block 's' reads tensor 'x' out of bounds: index 1 of x[i, j + 1] is j + 1")
    assert ("0 <= j + 1 < M" if symbolic else "0 <= j + 1 < 3") in msg
    assert witness in msg


@pytest.mark.parametrize(("symbolic", "witness"), [
    (False, "at i = 0, j = 1 it is 3, so the block writes y[0, 3]"),
    (True, "at i = 0, j = 0 with N = 1, M = 1 it is 2, so the block writes y[0, 2]"),
])
def test_a_write_past_the_end_is_refused_at_build(symbolic, witness):
    with pytest.raises(OutOfBounds) as err:
        _shift(symbolic, read=0, write=2).build()
    msg = str(err.value)
    assert msg.startswith("block 's' writes tensor 'y' out of bounds: index 1 of y[i, j + 2] is j + 2")
    assert witness in msg


def test_a_read_before_the_start_gives_the_negative_index():
    p = ProgramBuilder("previous")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    y = p.output("y", (N, M), "f32")
    with p.nest("s", i=N, j=M) as (i, j):
        y[i, j] = x[i, j - 1]
    with pytest.raises(OutOfBounds, match=r"x\[i, j - 1\] is j - 1, .* at i = 0, j = 0 with N = 1, M = 1 it is -1"):
        p.build()


def test_an_init_load_out_of_bounds_is_named_as_such():
    p = ProgramBuilder("with_init")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    b = p.input("b", (N,), "f32")
    y = p.output("y", (N,), "f32")
    row = Var("i")  # the init is in the block's spatial iteration variables
    with p.nest("acc", i=N, j=reduce(M), init=b[N - 1 - row] + b[row + 1]) as (i, j):
        y[i] = y[i] + x[i, j]
    with pytest.raises(OutOfBounds, match=r"block 'acc' reads tensor 'b' out of bounds in its init: index 0 of "
                                          r"b\[i \+ 1\] is i \+ 1, .* at i = 0, j = 0 with N = 1, M = 1 it is 1"):
        p.build()


def test_the_tensor_expression_layer_refuses_too():
    N = te.size_var("N")
    x = te.placeholder((N,), "f32", name="x")
    y = te.compute((N,), lambda i: x(i + 1) * 2.0, name="y")
    with pytest.raises(OutOfBounds, match=r"block 'y' reads tensor 'x' out of bounds: index 0 of x\[i \+ 1\]"):
        te.create_program([y], "next")


# ------------------------------------------------------------------ accepted: in bounds for every size


def test_reversed_and_guarded_accesses_are_in_bounds_for_every_size():
    p = ProgramBuilder("ok")
    N, M = p.sizes("N", "M")
    x = p.input("x", (N, M), "f32")
    y = p.output("y", (N, M), "f32")
    z = p.output("z", (N, M), "f32")
    with p.nest("rev", i=N, j=M) as (i, j):
        y[i, j] = x[N - 1 - i, M - 1 - j]
    with p.nest("next", i=N, j=M) as (i, j):
        p.where(j + 1 < M)
        z[i, j] = x[i, j + 1] + x[i, (j + 1) // 2] + x[i, j - j % 2]
    assert out_of_bounds(p.build()) is None


def _chunks(symbolic: bool, guarded: bool) -> ProgramBuilder:
    """Partial sums of 16-element chunks (an ``rfactor`` of a split that need not divide ``M``)."""
    p = ProgramBuilder("chunks")
    N, M = p.sizes("N", "M") if symbolic else (2, 40)
    x = p.input("x", (N, M), "f32")
    acc = p.output("acc", (N, (M + 15) // 16), "f32")
    with p.loop("i", N) as li, p.loop("j_0", (M + 15) // 16) as l0, p.loop("j_1", 16) as l1:
        with p.block("s_rf", i=spatial(N, li), j_0=spatial((M + 15) // 16, l0), j_1=reduce(16, l1)) as (i, j0, j1):
            if guarded:
                p.where(j0 * 16 + j1 < M)
            acc[i, j0] = acc[i, j0] + x[i, j0 * 16 + j1]
    return p


@pytest.mark.parametrize(("symbolic", "witness"), [
    (False, "at i = 0, j_0 = 2, j_1 = 8 it is 40"),
    (True, "at i = 0, j_0 = 0, j_1 = 1 with N = 1, M = 1 it is 1"),
])
def test_a_partial_chunk_needs_its_where(symbolic, witness):
    assert out_of_bounds(_chunks(symbolic, guarded=True).build()) is None
    with pytest.raises(OutOfBounds, match="index 1 of x\\[i, j_0 \\* 16 \\+ j_1\\]") as err:
        _chunks(symbolic, guarded=False).build()
    assert witness in str(err.value)


def _symbolic_schedules():
    def roll(s: Schedule) -> None:
        _, j = s.get_loops("s_max")
        s.rolling_update("s_sum", j)
        s.compact_buffers()

    def split_k(s: Schedule) -> None:
        _, j = s.get_loops("s_max")
        j0, _ = s.split(j, [None, 16])
        s.split_k_update("s_sum", j0)

    def caches(s: Schedule) -> None:
        s.cache_read("s_exp", "inp", "local")
        s.cache_write("s_sum", "local")
        _, j = s.get_loops("s_exp")
        s.split(j, [None, 8])
        s.compact_buffers()

    return [roll, split_k, caches]


@pytest.mark.parametrize("plan", _symbolic_schedules(), ids=lambda f: f.__name__)
def test_schedules_over_symbolic_sizes_stay_in_bounds(plan):
    sch = Schedule(softmax_sum(symbolic=True))
    plan(sch)
    assert out_of_bounds(sch.program) is None
    stages(sch, "cpp")


CATALOG = [(n, m) for n in ops.names() for m in ops.get(n).modes]


@pytest.mark.parametrize(("name", "mode"), CATALOG)
def test_catalog_programs_and_their_default_schedules_are_in_bounds(name, mode):
    """The plain program, and its fused schedule for the host and for CUDA (split tiles, where guards,
    padded and compacted buffers): no false refusal."""
    program = ops.get(name).program(mode)
    assert out_of_bounds(program) is None
    if not has_default_schedule(name, mode) or name == "quant_gemm_fp8":  # fp8 rounding: refused on purpose
        return
    for target in ("cpp", "cuda"):
        assert out_of_bounds(default_schedule(name, mode, program, target=target).program) is None, target


# ------------------------------------------------------------------ compile time: the scheduled program


Index = Callable[[Var, Var], Expr]


def _by_hand(read: tuple[Index, Index], extents: tuple[Expr, Expr], shape: tuple[Expr, Expr],
             params: tuple[Var, ...] = (), where: Index | None = None) -> Program:
    """``y[i, j] = x[read(i, j)]`` assembled without the builder (so without its bounds proof), as a transform
    could; ``where(i, j)`` is the block's predicate."""
    x = Tensor("x", shape, dt.f32, INPUT)
    y = Tensor("y", extents, dt.f32, OUTPUT)
    i, j, li, lj = Var("i"), Var("j"), Var("li"), Var("lj")
    block = Block("s", (IterVar(i, extents[0]), IterVar(j, extents[1])), (li, lj),
                  Store(y, (i, j), x[read[0](i, j), read[1](i, j)]), where=None if where is None else where(i, j))
    return validate(Program("by_hand", params, (x, y), Loop(li, extents[0], Loop(lj, extents[1], block))))


def test_compiling_a_program_that_skipped_the_builder_is_refused():
    N, M = Var("N"), Var("M")
    program = _by_hand((lambda i, j: i, lambda i, j: j + 1), (N, M), (N, M), (N, M))
    with pytest.raises(OutOfBounds, match="block 's' reads tensor 'x' out of bounds"):
        polyfuse.build(program)
    with pytest.raises(OutOfBounds, match="with N = 1, M = 1"):
        stages(program, "cuda")


# ------------------------------------------------------------------ the interpreter's verdict, for every size

_COEF = st.integers(-1, 2)
_INDEX = st.tuples(_COEF, _COEF, st.integers(-2, 2), st.sampled_from(["", "//", "%"]), st.integers(2, 3))
_ROWS = st.one_of(st.just((1, 0, 0, "", 2)), _INDEX)  # i itself, often: both verdicts come up
_COLS = st.one_of(st.just((0, 1, 0, "", 2)), _INDEX)


def _index(form):
    a, b, c, op, q = form

    def index(i, j):
        e = i * a + j * b + c
        return e // q if op == "//" else e % q if op == "%" else e
    return index


def _runs_in_bounds(program: Program, sizes: dict[str, int], shape: tuple[int, int]) -> bool:
    try:
        interpret(program, {"x": np.zeros(shape, np.float32)}, sizes)
    except PolyfuseError as err:
        assert "out of bounds" in str(err)
        return False
    return True


@settings(max_examples=120, deadline=None)
@given(rows=_ROWS, cols=_COLS, extents=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       shape=st.tuples(st.integers(1, 5), st.integers(1, 5)), guard=st.integers(-1, 4))
def test_literal_sizes_get_the_interpreters_verdict(rows, cols, extents, shape, guard):
    where = None if guard < 0 else (lambda i, j: i + j < guard + 1)
    program = _by_hand((_index(rows), _index(cols)), tuple(map(const, extents)), tuple(map(const, shape)),
                       where=where)
    found = out_of_bounds(program)
    event("in bounds" if found is None else "refused")
    assert (found is None) == _runs_in_bounds(program, {}, shape)
    if found is not None:  # the witness is an instance, and its element lies outside
        inst = dict(found.instance)
        i, j = inst["i"], inst["j"]
        assert 0 <= i < extents[0] and 0 <= j < extents[1] and (guard < 0 or i + j < guard + 1)
        assert found.element == (_index(rows)(i, j), _index(cols)(i, j))
        assert not 0 <= found.element[found.dim] < shape[found.dim]


@settings(max_examples=80, deadline=None)
@given(rows=_ROWS, cols=_COLS, pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       tries=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=3, max_size=3))
def test_symbolic_sizes_get_the_interpreters_verdict_at_every_size(rows, cols, pad, tries):
    """Accepted: the interpreter runs at any sizes; refused: it fails at the witness's sizes."""
    N, M = Var("N"), Var("M")
    program = _by_hand((_index(rows), _index(cols)), (N, M), (N + pad[0], M + pad[1]), (N, M))
    found = out_of_bounds(program)
    event("in bounds" if found is None else "refused")
    if found is None:
        for n, m in tries:
            assert _runs_in_bounds(program, {"N": n, "M": m}, (n + pad[0], m + pad[1]))
    else:
        sizes = dict(found.sizes)
        assert not _runs_in_bounds(program, sizes, (sizes["N"] + pad[0], sizes["M"] + pad[1]))
