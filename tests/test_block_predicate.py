"""Block predicates (``Block.where``): instances a box cannot describe, end to end.

Builder and printer, interpreter, ISL domains and dependences, validation, and the transforms that
create predicates: rfactor of a split that does not divide the reduction, and through it rolling update
and split-k update of attention at sizes the tiles do not divide (S = 40 with tiles of 16, 3 splits).
"""

from __future__ import annotations

import functools

import islpy as isl
import numpy as np
import pytest

from polyfuse import deps, ops
from polyfuse.errors import IRError, NonAffineIndex
from polyfuse.ir import NO_INIT, Block, Program, ProgramBuilder, Var, eq, interpret, maximum, ne, reduce, spatial
from polyfuse.ir.printer import print_program, program_from_source
from polyfuse.ir.validate import validate
from polyfuse.transforms.compute_at import reverse_compute_at
from polyfuse.transforms.decompose import decompose_reduction
from polyfuse.transforms.rfactor import rfactor
from polyfuse.transforms.rolling_update import rolling_update
from polyfuse.transforms.split import split
from polyfuse.transforms.split_k_update import split_k_update
from polyfuse.transforms.tile import tile
from polyfuse.transforms.tree import map_blocks

ATTENTION = ["attn_causal", "attn_window", "attn_norm_inside"]
SEEDS = (0, 1, 2)


def roundtrip(program: Program) -> str:
    text = print_program(program)
    assert program_from_source(text) == program, text
    return text


def chunk_sums(n: int = 40, tile: int = 16, reducer: str = "sum") -> Program:
    """``y[i, t]`` reduces ``x[i, 16·t + r]`` over the ``r`` with ``16·t + r < n``: a partial-result block."""
    p = ProgramBuilder("chunks")
    x = p.input("x", (2, n), "f32")
    y = p.output("y", (2, -(-n // tile)), "f32")
    with p.loop("i", 2) as i:
        with p.loop("t", -(-n // tile)) as t:
            with p.loop("r", tile) as r:
                with p.block("s", i=spatial(2, i), t=spatial(-(-n // tile), t), r=reduce(tile, r)) as (ii, tt, rr):
                    p.where(tt * tile + rr < n)
                    if reducer == "sum":
                        y[ii, tt] = y[ii, tt] + x[ii, tt * tile + rr]
                    else:
                        y[ii, tt] = maximum(y[ii, tt], x[ii, tt * tile + rr])
    return p.build()


def lower_triangle(n: int = 5) -> Program:
    """``y[i, j] = x[i, j]`` for ``j <= i`` only (a nest with a predicate), and a row sum of it."""
    p = ProgramBuilder("tri")
    x = p.input("x", (n, n), "f32")
    y = p.output("y", (n, n), "f32")
    s = p.output("s", (n,), "f32")
    with p.nest("copy", i=n, j=n) as (i, j):
        p.where(j <= i)
        y[i, j] = x[i, j]
    with p.nest("rowsum", i=n, j=reduce(n)) as (i, j):
        p.where(j <= i)
        s[i] = s[i] + y[i, j]
    return p.build()


def reduction(n: int, m: int, reducer: str = "sum", symbolic: bool = False) -> Program:
    p = ProgramBuilder(f"row_{reducer}")
    N, M = p.sizes("N", "M") if symbolic else (n, m)
    x = p.input("x", (N, M), "f32")
    y = p.output("y", (N,), "f32")
    with p.nest("s", i=N, j=reduce(M)) as (i, j):
        y[i] = y[i] + x[i, j] if reducer == "sum" else maximum(y[i], x[i, j])
    return p.build()


def with_infinities(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Small integers (sums of them are exact in any order) with some ±inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-8, 9, shape).astype(np.float32)
    x[rng.random(shape) < 0.15] = -np.inf
    x[rng.random(shape) < 0.05] = np.inf
    return x


def assert_same(before: Program, after: Program, inputs: dict[str, np.ndarray]) -> None:
    want, got = interpret(before, inputs), interpret(after, inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}")


# ------------------------------------------------------------------ builder and printer

def test_builder_records_the_predicate_and_the_printer_round_trips_it():
    prog = chunk_sums()
    assert str(prog.block("s").where) == "t * 16 + r < 40"
    text = roundtrip(prog)
    assert ('with p.nest("s", i=2, t=3, r=reduce(16)) as (i, t, r):\n        p.where(t * 16 + r < 40)\n'
            '        y[i, t] = y[i, t] + x[i, t * 16 + r]') in text
    assert 'with p.nest("copy", i=5, j=5) as (i, j):\n        p.where(j <= i)' in roundtrip(lower_triangle())


def test_several_where_calls_conjoin_and_equalities_print():
    p = ProgramBuilder("conj")
    x = p.input("x", (6, 6), "f32")
    y = p.output("y", (6, 6), "f32")
    with p.nest("b", i=6, j=6) as (i, j):
        p.where(j <= i)
        p.where(eq(i % 2, 0) & (i + j >= 2))
        y[i, j] = x[i, j]
    prog = p.build()
    assert str(prog.block("b").where) == "(j <= i) & (eq(i % 2, 0) & (i + j >= 2))"
    roundtrip(prog)
    got = interpret(prog, {"x": np.ones((6, 6), np.float32)})["y"]
    i, j = np.indices((6, 6))
    np.testing.assert_array_equal(~np.isnan(got), (j <= i) & (i % 2 == 0) & (i + j >= 2))


def test_block_without_a_predicate_is_unchanged():
    assert all(b.where is None for b in reduction(3, 4).blocks())
    assert "p.where" not in roundtrip(reduction(3, 4))


# ------------------------------------------------------------------ interpreter

def test_interpreter_runs_only_the_instances_where_the_predicate_holds():
    x = np.arange(25, dtype=np.float32).reshape(5, 5)
    out = interpret(lower_triangle(), {"x": x})
    i, j = np.indices((5, 5))
    np.testing.assert_array_equal(out["y"][j <= i], x[j <= i])
    assert np.isnan(out["y"][j > i]).all()  # never written: outputs start as NaN
    np.testing.assert_array_equal(out["s"], np.tril(x).sum(axis=1))


def test_interpreter_partial_results_by_hand():
    x = with_infinities((2, 40))
    y = interpret(chunk_sums(reducer="max"), {"x": x})["y"]
    np.testing.assert_array_equal(y, np.stack([x[:, :16].max(1), x[:, 16:32].max(1), x[:, 32:].max(1)], axis=1))


# ------------------------------------------------------------------ ISL domains and dependences

def test_domain_is_the_box_intersected_with_the_predicate():
    dom = deps.domains(chunk_sums())["s"]
    assert dom.is_equal(isl.Set("{ s[i, t, r] : 0 <= i < 2 and 0 <= t < 3 and 0 <= r < 16 and 16t + r < 40 }"))
    assert dom.count_val().to_python() == 2 * 40


def test_dependences_follow_the_predicate():
    """``rowsum`` reads ``y[i, j]`` only for ``j <= i``, all written by ``copy``: the flow relation says exactly that,
    and the reduction's first instances (its init) are those at ``j = 0``."""
    info = deps.analyze(lower_triangle())
    (flow,) = info.between("copy", "rowsum", "flow")
    assert flow.relation.is_equal(isl.Map("{ copy[i, j] -> rowsum[i, j] : 0 <= j <= i < 5 }"))
    init_free = info.access("rowsum__r0").relation.domain()
    assert init_free.is_equal(isl.Set("{ rowsum[i, j] : 0 < j <= i < 5 }"))


def test_symbolic_predicate_in_the_domain():
    p = ProgramBuilder("sym")
    N = p.size("N")
    x = p.input("x", (N,), "f32")
    y = p.output("y", (N,), "f32")
    with p.nest("b", i=N) as (i,):
        p.where(2 * i + 1 < N)
        y[i] = x[i]
    prog = p.build()
    assert deps.domains(prog)["b"].is_equal(isl.Set("[N] -> { b[i] : 0 <= i and 2i + 1 < N }"))
    bound = prog.bind(N=7)
    assert str(bound.block("b").where) == "2 * i + 1 < 7"
    assert deps.domains(bound)["b"].count_val().to_python() == 3


# ------------------------------------------------------------------ validation

def _masked(cond) -> Program:
    p = ProgramBuilder("bad")
    x = p.input("x", (4, 8), "f32")
    y = p.output("y", (4,), "f32")
    with p.loop("i", 4) as i:
        with p.loop("k", 8) as k:
            with p.block("acc", i=spatial(4, i), j=reduce(8, k)) as (ii, jj):
                p.where(cond(ii, jj, k))
                y[ii] = y[ii] + x[ii, jj]
    return p.build()


@pytest.mark.parametrize(("cond", "error", "message"), [
    (lambda i, j, k: j * j < 3, NonAffineIndex, r"block 'acc', where j \* j < 3: j \* j is not affine"),
    (lambda i, j, k: j + 0.5 < 3.0, NonAffineIndex, r"block 'acc', where .*is not affine: it has dtype f32"),
    (lambda i, j, k: ne(i, 2), IRError, r"block 'acc', where: ne\(i, 2\) is not a comparison"),
    (lambda i, j, k: (j < 3) | (i < 2), IRError, r"block 'acc', where: \(j < 3\) \| \(i < 2\) is not a comparison"),
    (lambda i, j, k: k < 3, NonAffineIndex, r"block 'acc', where k < 3: k uses k, which is not a variable in "
                                            r"scope here \(in scope: i, j\)"),
    (lambda i, j, k: j >= i, IRError, r"block 'acc': its where j >= i excludes the first reduce instance \(j = 0\) of "
                                      r"spatial points that have other instances, e.g. i = \d"),
])
def test_validation_names_the_block(cond, error, message):
    with pytest.raises(error, match=message):
        _masked(cond)


def test_non_boolean_predicates_are_refused():
    with pytest.raises(IRError, match=r"block 'acc': p.where\(j \+ 1\) needs a boolean condition"):
        _masked(lambda i, j, k: j + 1)
    prog = reduction(4, 8)
    bad = prog.replace(body=map_blocks(prog.body, lambda b: b.replace(where=Var("i") + 1)))
    with pytest.raises(IRError, match=r"block 's', where: the predicate i \+ 1 is a i32, not a boolean condition"):
        validate(bad)
    with pytest.raises(IRError, match="outside of a block"):
        ProgramBuilder("x").where(Var("i") < 2)


def test_init_origin_rule_holds_for_every_size():
    p = ProgramBuilder("sym_bad")
    N = p.size("N")
    x = p.input("x", (N, 40), "f32")
    y = p.output("y", (N,), "f32")
    with p.nest("acc", i=N, j=reduce(40)) as (i, j):
        p.where(j + 3 >= N)
        y[i] = y[i] + x[i, j]
    with pytest.raises(IRError, match=r"block 'acc': .*e.g. i = \d+, N = \d+"):
        p.build()


def test_a_reduction_without_init_may_skip_its_first_instance():
    p = ProgramBuilder("no_init")
    x = p.input("x", (4, 8), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("zero", i=4) as (i,):
        y[i] = 0.0
    with p.nest("acc", init=NO_INIT, i=4, j=reduce(8)) as (i, j):
        p.where(j >= i)
        y[i] = y[i] + x[i, j]
    prog = p.build()
    roundtrip(prog)
    xs = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(interpret(prog, {"x": xs})["y"], [xs[k, k:].sum() for k in range(4)])


# ------------------------------------------------------------------ rfactor and decompose with predicates

@pytest.mark.parametrize("reducer", ["sum", "max"])
@pytest.mark.parametrize(("m", "factors"), [(10, [None, 4]), (5, [4, None]), (40, [None, 16]), (40, [3, None])])
def test_rfactor_of_a_split_that_does_not_divide(reducer, m, factors):
    prog = reduction(3, m, reducer)
    q = split(prog, block="s", loop="j", factors=factors)
    q, rf = rfactor(q, block="s", loop="j_0")
    inner = q.block(rf).iters[-1].extent.value  # type: ignore[attr-defined]
    assert str(q.block(rf).where) == f"j_0 * {inner} + j_1 < {m}"
    roundtrip(q)
    for seed in SEEDS:
        assert_same(prog, q, {"x": with_infinities((3, m), seed)})


def test_rfactor_combine_skips_partials_without_elements():
    """``split(j, [4, None])`` of 5 makes chunks of 2: chunk 3 (j = 6, 7) is empty, so the combine has a predicate."""
    q, rf = rfactor(split(reduction(2, 5), block="s", loop="j", factors=[4, None]), block="s", loop="j_0")
    assert str(q.block("s").where) == "j_0 * 2 < 5"
    assert deps.domains(q)["s"].count_val().to_python() == 2 * 3


@pytest.mark.parametrize("reducer", ["sum", "max"])
def test_rfactor_combine_takes_the_identity_where_a_predicate_would_skip_its_init(reducer):
    """Over ``j = jj - 1`` with ``j <= i``, no partial has ``jj = 0``: a predicate on the combine would drop its
    first instance (where its init runs), so its term is the reducer's identity for missing partials instead."""
    p = ProgramBuilder("offset")
    x = p.input("x", (4, 4), "f32")
    y = p.output("y", (4,), "f32")
    with p.loop("i", 4) as i:
        with p.loop("jj", 5) as jj:
            with p.block("s", i=spatial(4, i), j=reduce(4, jj - 1)) as (ii, j):
                p.where(j <= ii)
                y[ii] = y[ii] + x[ii, j] if reducer == "sum" else maximum(y[ii], x[ii, j])
    prog = p.build()
    q, rf = rfactor(prog, block="s", loop="jj")
    assert str(q.block(rf).where) == "(jj - 1 >= 0) & (jj - 1 <= i)"
    combine = q.block("s")
    assert combine.where is None
    identity = "0.0" if reducer == "sum" else "-INF"
    assert f"select((jj - 1 >= 0) & (jj - 1 <= i), y_rf[i, jj], {identity})" in str(combine.store.value)
    roundtrip(q)
    for seed in SEEDS:
        assert_same(prog, q, {"x": with_infinities((4, 4), seed)})


def test_decompose_reduction_gives_the_init_the_elements_the_update_has():
    prog = lower_triangle()
    q, init = decompose_reduction(prog, block="rowsum", loop="j")
    assert q.block(init).where is None  # j <= i at j = 0 holds for every row
    q2 = split(reduction(2, 40), block="s", loop="j", factors=[None, 16])
    q2, rf = rfactor(q2, block="s", loop="j_0")
    q2, rf_init = decompose_reduction(q2, block=rf, loop="j_1")
    assert q2.block(rf_init).where is None  # 16·j_0 < 40 for j_0 < 3: implied by the box, left out
    x = np.arange(25, dtype=np.float32).reshape(5, 5)
    assert_same(prog, q, {"x": x})

    p = ProgramBuilder("rows")
    x_ = p.input("x", (6, 4), "f32")
    y = p.output("y", (6,), "f32")
    with p.nest("acc", i=6, j=reduce(4)) as (i, j):
        p.where(i < 4)
        y[i] = y[i] + x_[i, j]
    rows = p.build()
    q3, init3 = decompose_reduction(rows, block="acc", loop="j")
    assert str(q3.block(init3).where) == "i < 4"
    roundtrip(q3)
    assert_same(rows, q3, {"x": with_infinities((6, 4)).clip(-8, 8)})


# ------------------------------------------------------------------ attention at sizes the tiles do not divide

def _rolling(program: Program) -> Program:
    q, loops = tile(program, block="qk", loops=["i", "j"], sizes=[16, 16])  # S = 40: not divided
    q = reverse_compute_at(q, block="score", loop_block="qk", loop=loops[1])
    for blk in ["row_max", "row_sum", "pv"]:
        q, _ = rolling_update(q, block=blk, loop_block="qk", loop=loops[1])
    return reverse_compute_at(q, block="out", loop_block="qk", loop=loops[0])


def _split_k(program: Program) -> Program:
    q = split(program, block="qk", loop="j", factors=[3, None])  # Skv = 40 in 3 splits of 14: not divided
    q = reverse_compute_at(q, block="score", loop_block="qk", loop="j_0")
    for blk in ["row_sum", "pv"]:
        q, _ = split_k_update(q, block=blk, loop_block="qk", loop="j_0")
    return q


@functools.cache
def _fused(name: str, mode: str) -> tuple[Program, Program]:
    op = ops.get(name)
    program = op.program(mode)
    return program, (_rolling if mode == "prefill" else _split_k)(program)


ATTENTION_CASES = [(name, mode, seed, mag) for name in ATTENTION for mode in ("prefill", "decode")
                   for mag in ops.get(name).magnitudes for seed in SEEDS]


@pytest.mark.parametrize(("name", "mode", "seed", "mag"), ATTENTION_CASES,
                         ids=[f"{n}-{m}-s{s}-m{x:g}" for n, m, s, x in ATTENTION_CASES])
def test_attention_fused_at_sizes_the_tiles_do_not_divide(name, mode, seed, mag):
    op = ops.get(name)
    sizes = op.sizes(mode)
    assert sizes["Skv"] % 16 and sizes["Skv"] % 3, "the sizes must not be divisible by the tiles"
    program, fused = _fused(name, mode)
    inputs = op.inputs(seed, mode, magnitude=mag)
    got = interpret(fused, inputs)
    cmp = ops.compare(got, op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
    assert cmp.ok, cmp.line()
    # Against the unfused program: the same up to f32 reassociation, i.e. one rounding of the f16 output.
    want = interpret(program, inputs)["out"]
    out = got["out"]
    assert np.array_equal(np.isnan(out), np.isnan(want))
    ulp = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(out.astype(np.float64) - want.astype(np.float64)) <= ulp + 1e-30)


@pytest.mark.parametrize("name", ATTENTION)
def test_fused_attention_carries_the_partial_predicates(name):
    _, prefill = _fused(name, "prefill")
    rf = [b for b in prefill.blocks() if b.name.endswith("_rf")]
    assert rf and all(str(b.where).startswith("j_0 * 16 + ") and str(b.where).endswith(" < 40") for b in rf)
    _, decode = _fused(name, "decode")
    rf = [b for b in decode.blocks() if b.name.endswith("_rf")]
    assert rf and all(str(b.where).startswith("j_0 * 14 + ") and str(b.where).endswith(" < 40") for b in rf)
    roundtrip(decode)  # (the rolling update's repaired ``G(X) + term`` is not builder syntax: prefill is not printed)


def test_block_fields_keep_positional_construction():
    b = reduction(2, 3).block("s")
    again = Block(b.name, b.iters, b.bindings, b.store, b.reducer, b.init)
    assert again == b and again.where is None
