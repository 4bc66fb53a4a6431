"""Random schedules keep a program's meaning, and refused steps change nothing.

Hypothesis draws sequences of primitives — every primitive of :class:`Schedule`, reduction fusions
included — with random, legal or illegal, arguments (blocks, loops, factors, threads, scopes, tensors)
on small catalog operators and on the hand-written programs of ``ir_programs``: chains of two and
three reductions, with constant and symbolic sizes.  After every step the program must compute what the
original did on the same inputs; a step that is refused must raise a :class:`PolyfuseError` (never
another exception, nor an ``InternalError``) and leave the program and the trace as they were.

Results are compared bitwise, except once an ``rfactor`` or a reduction fusion has regrouped a float
reduction.  Then each regrouped f32 sum of at most K = 8 terms may differ by ``2·(K - 1)·u32·Σ|t|``
(u32 = 2^-24, about 8.3e-7·Σ|t|), which the few operations after it (exp of a difference, a division, a
square root, a repair's rescaling by one such factor per step) amplify by a small factor; f32 outputs
are compared to ``1e-5`` relative to the output's magnitude, and f16 outputs may in addition round to
the neighbouring f16 value (2^-10 relative).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ir_programs import prefix_sum, softmax_average, softmax_sum, softmax_sum_split, two_pass_variance
from polyfuse import ops
from polyfuse.errors import PolyfuseError
from polyfuse.ir import Block, Program, interpret
from polyfuse.ir.expr import Const
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars
from polyfuse.transforms import LoopRef, Schedule
from polyfuse.transforms.hoist_divisor import divided_sums
from polyfuse.transforms.schedule import _is_primitive

TINY_CAUSAL = {"B": 1, "Hq": 1, "Hkv": 1, "Sq": 2, "Skv": 4, "D": 2, "Dv": 2}


Sizes = dict[str, int] | None
Subject = tuple[Callable[[], Program], Callable[[int], dict], Sizes]


def _catalog(name: str, mode: str | None = None, **sizes: int) -> Subject:
    op = ops.get(name)
    return (lambda: op.program(mode, **sizes)), (lambda seed: op.inputs(seed, mode, sizes)), None


def _normal_inputs(build: Callable[[], Program], sizes: Sizes) -> Callable[[int], dict]:
    def make(seed: int) -> dict:
        rng = np.random.default_rng(seed)
        return {t.name: rng.standard_normal(tuple(int(d.value) if isinstance(d, Const) else sizes[d.name]  # type: ignore[index]
                                                  for d in t.shape)).astype(t.dtype.numpy)
                for t in build().inputs}
    return make


def _hand_written(build: Callable[[], Program], sizes: Sizes = None) -> Subject:
    return build, _normal_inputs(build, sizes), sizes


PROGRAMS = {
    "softmax_sum": _catalog("softmax_sum", N=2, M=8),
    "softmax": _catalog("softmax", N=2, M=6),
    "rmsnorm_amax": _catalog("rmsnorm_amax", N=2, M=4),
    "attn_causal": _catalog("attn_causal", "prefill", **TINY_CAUSAL),
    "attn_norm_inside": _catalog("attn_norm_inside", "prefill", **TINY_CAUSAL),
    "inertia": _catalog("inertia", B=2, N=6),
    "layernorm_stats": _catalog("layernorm_stats", N=2, M=6),
    "fig1a_split": _hand_written(lambda: softmax_sum_split(n=5, m=4, factor=2)),
    "fig1a": _hand_written(lambda: softmax_sum(symbolic=False, n=3, m=6)),
    "fig1a_symbolic": _hand_written(lambda: softmax_sum(symbolic=True), {"N": 2, "M": 7}),
    "fig1a_reversed": _hand_written(lambda: softmax_sum(symbolic=False, n=2, m=6, layout="reversed")),
    "softmax_average": _hand_written(lambda: softmax_average((2, 8))),
    "softmax_average_symbolic": _hand_written(lambda: softmax_average(("N", "M")), {"N": 2, "M": 7}),
    "variance_symbolic": _hand_written(lambda: two_pass_variance(("B", "L")), {"B": 2, "L": 6}),
    "prefix_sum": _hand_written(lambda: prefix_sum(n=6)),
}
CHAINS = sorted(name for name in PROGRAMS if name not in ("prefix_sum", "rmsnorm_amax"))
SEEDS = (0, 1)


@cache
def original(name: str) -> Program:
    return PROGRAMS[name][0]()


@cache
def inputs_of(name: str, seed: int) -> dict:
    return PROGRAMS[name][1](seed)


@cache
def expected(name: str, seed: int) -> dict:
    return interpret(original(name), inputs_of(name, seed), PROGRAMS[name][2])


def assert_same_meaning(name: str, program: Program, regrouped: bool) -> None:
    for seed in SEEDS:
        got = interpret(program, inputs_of(name, seed), PROGRAMS[name][2])
        for out, want in expected(name, seed).items():
            if not regrouped or not np.issubdtype(want.dtype, np.floating):
                np.testing.assert_array_equal(got[out], want, err_msg=f"{name}: output {out!r}")
                continue
            rtol = 1e-5 + (2.0 ** -10 if want.dtype == np.float16 else 0.0)
            scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0))
            np.testing.assert_allclose(got[out].astype(np.float64), want.astype(np.float64), rtol=rtol,
                                       atol=rtol * scale, err_msg=f"{name}: output {out!r}")


# ------------------------------------------------------------------ drawing one step

THREADS = ("blockIdx.x", "threadIdx.x", "threadIdx.y", "warp.x")
KINDS = ("unrolled", "vectorized", "parallel", "bound")
FACTORS = st.one_of(
    st.tuples(st.none(), st.integers(1, 4)).map(list),
    st.tuples(st.integers(1, 4), st.none()).map(list),
    st.tuples(st.integers(0, 5), st.integers(1, 5)).map(list),
    st.just([None, None]),
    st.tuples(st.integers(1, 3), st.none(), st.integers(1, 2)).map(list),
)


def _blocks(sch: Schedule) -> list[str]:
    return [b.name for b in sch.program.blocks()]


def _loop(data: st.DataObject, sch: Schedule, block: str) -> LoopRef:
    loops = sch.get_loops(block)
    if not loops:
        return LoopRef(block, "no_loop")
    return data.draw(st.sampled_from(loops))


def _reduce_loop_vars(block: Block) -> set[str]:
    return {v for iv, bnd in zip(block.iters, block.bindings, strict=True) if iv.is_reduce for v in free_vars(bnd)}


SCOPES = ("global", "shared", "local", "texture")
NAMES = st.sampled_from(["i", "j", "k", "j_0", "N", "M", "x", "a b"])  # loops, sizes, a tensor, no identifier
PRIMITIVES = ("split", "reorder", "fuse", "tile", "bind", "annotate", "warps", "decompose_reduction", "rfactor",
              "compute_at", "recompute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline",
              "cache_read", "cache_write", "set_scope", "compact_buffers", "fuse_siblings", "rolling_update",
              "split_k_update", "hoist_divisor")
FUSIONS = ("rolling_update", "split_k_update")
REGROUPING = ("rfactor", "hoist_divisor", *FUSIONS)


def draw_step(data: st.DataObject, sch: Schedule,
              primitives: tuple[str, ...] = PRIMITIVES) -> tuple[str, Callable[[], object]]:
    """A primitive and a call of it on ``sch`` with drawn arguments (legal or not)."""
    prim = data.draw(st.sampled_from(primitives))
    reductions = [b.name for b in sch.program.blocks() if b.reducer is not None]
    pool = reductions if prim in ("decompose_reduction", "rfactor", *FUSIONS) and reductions else _blocks(sch)
    if prim == "hoist_divisor" and divided_sums(sch.program) and data.draw(st.booleans()):
        pool = divided_sums(sch.program)
    if prim in FUSIONS and len(reductions) > 1 and data.draw(st.booleans()):
        pool = reductions[1:]  # the first reduction of a chain has no producer to fuse with
    block = data.draw(st.sampled_from(pool))
    loop = _loop(data, sch, block)
    if prim == "split":
        factors = data.draw(FACTORS)
        names = data.draw(st.one_of(st.none(), st.lists(NAMES, min_size=len(factors), max_size=len(factors))))
        return prim, lambda: sch.split(loop, factors, names)
    if prim in ("reorder", "fuse", "tile"):
        other = _loop(data, sch, block)
        if prim == "reorder":
            return prim, lambda: sch.reorder([loop, other])
        if prim == "fuse":
            name = data.draw(st.one_of(st.none(), NAMES))
            return prim, lambda: sch.fuse([loop, other], name)
        sizes = data.draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
        return prim, lambda: sch.tile([loop, other], sizes)
    if prim == "bind":
        thread = data.draw(st.sampled_from(THREADS))
        return prim, lambda: sch.bind(loop, thread)
    if prim == "annotate":
        kind = data.draw(st.sampled_from(KINDS))
        return prim, lambda: sch.annotate(loop, kind)
    if prim == "warps":
        warps = data.draw(st.integers(0, 40))  # (outside 1..32: refused)
        return prim, lambda: sch.warps(loop, warps)
    if prim == "decompose_reduction":
        return prim, lambda: sch.decompose_reduction(block, loop)
    if prim == "rfactor":
        reduce_loops = [r for r in sch.get_loops(block) if r.name in _reduce_loop_vars(sch.program.block(block))]
        if reduce_loops and data.draw(st.booleans()):
            loop = data.draw(st.sampled_from(reduce_loops))
        axis = data.draw(st.sampled_from([None, 0]))
        return prim, lambda: sch.rfactor(loop, factor_axis=axis)
    if prim in FUSIONS:
        return prim, _fusion(data, sch, prim, block)
    if prim in ("compute_inline", "reverse_compute_inline", "hoist_divisor"):
        return prim, lambda: getattr(sch, prim)(block)
    if prim in ("cache_write", "set_scope"):
        scope = data.draw(st.sampled_from(SCOPES))
        return prim, lambda: getattr(sch, prim)(block, scope)
    if prim == "cache_read":
        scope = data.draw(st.sampled_from(SCOPES))
        tensor = data.draw(st.one_of(st.integers(-1, 3), st.sampled_from([t.name for t in sch.program.tensors])))
        return prim, lambda: sch.cache_read(block, tensor, scope)
    if prim == "compact_buffers":
        return prim, sch.compact_buffers
    target = data.draw(st.sampled_from(_blocks(sch)))
    at = _loop(data, sch, target)
    return prim, lambda: getattr(sch, prim)(block, at)


def _fusion(data: st.DataObject, sch: Schedule, prim: str, consumer: str) -> Callable[[], object]:
    """A reduction fusion of ``consumer`` over a drawn loop: usually one binding another reduction, often
    with another reduce loop inside it (the outer loop of a split)."""
    reduce_loops, outer_loops = [], []
    for b in sch.program.blocks():
        if b.reducer is None or b.name == consumer:
            continue
        refs = [r for r in sch.get_loops(b.name) if r.name in _reduce_loop_vars(b)]
        reduce_loops += refs
        outer_loops += refs[:-1]
    pick = data.draw(st.integers(0, 3))
    if outer_loops and pick >= 2:
        loop = data.draw(st.sampled_from(outer_loops))
    elif reduce_loops and pick >= 1:
        loop = data.draw(st.sampled_from(reduce_loops))
    else:
        loop = _loop(data, sch, data.draw(st.sampled_from(_blocks(sch))))
    if prim == "rolling_update":
        return lambda: sch.rolling_update(consumer, loop)
    axis = data.draw(st.sampled_from([None, 0]))
    return lambda: sch.split_k_update(consumer, loop, factor_axis=axis)


def apply_step(name: str, sch: Schedule, prim: str, call: Callable[[], object], regrouped: bool) -> bool:
    """Run one drawn step: refused with a PolyfuseError and nothing changed, or the meaning is kept.
    Returns whether float reductions have been regrouped so far."""
    before, trace = sch.program, sch.trace.python()
    try:
        call()
    except PolyfuseError:
        event(f"{prim} refused")
        assert sch.program is before, f"refused {prim} changed the program"
        assert sch.trace.python() == trace, f"refused {prim} changed the trace"
        return regrouped
    event(f"{prim} applied")
    validate(sch.program)
    regrouped = regrouped or prim in REGROUPING
    assert_same_meaning(name, sch.program, regrouped)
    return regrouped


# ------------------------------------------------------------------ the properties

def test_every_schedule_primitive_is_drawn():
    assert set(PRIMITIVES) | {"unroll", "vectorize", "parallel"} == {
        n for n in dir(Schedule) if _is_primitive(n)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PROGRAMS)), steps=st.integers(1, 5), data=st.data())
def test_random_schedules_keep_the_meaning(name: str, steps: int, data: st.DataObject) -> None:
    sch = Schedule(original(name))
    regrouped = False
    for _ in range(steps):
        prim, call = draw_step(data, sch)
        regrouped = apply_step(name, sch, prim, call, regrouped)
    assert Schedule(original(name)).replay(sch.trace.to_json()).program == sch.program


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.integers(1, 4), data=st.data())
def test_random_schedules_after_hoisting_a_divisor_keep_the_meaning(steps: int, data: st.DataObject) -> None:
    """The divide-inside attention with its division hoisted out of the sum (a rounding-level change), then a few
    random steps, fusions included: the plain program's outputs within the regrouped tolerance."""
    sch = Schedule(original("attn_norm_inside"))
    sch.hoist_divisor("pv")
    assert_same_meaning("attn_norm_inside", sch.program, regrouped=True)
    regrouped = True
    for _ in range(steps):
        prim, call = draw_step(data, sch, PRIMITIVES + FUSIONS)
        regrouped = apply_step("attn_norm_inside", sch, prim, call, regrouped)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(CHAINS), before=st.integers(0, 2), fusions=st.integers(1, 2), after=st.integers(0, 2),
       data=st.data())
def test_random_fusions_keep_the_meaning(name: str, before: int, fusions: int, after: int,
                                        data: st.DataObject) -> None:
    """Chains of reductions: a few random steps, maybe a split, one or two rolling or split-k updates over
    (mostly) a loop binding a reduction, then a few more random steps."""
    sch = Schedule(original(name))
    regrouped = False
    plan = [PRIMITIVES] * before + [("split",)] * min(data.draw(st.integers(0, 3)), 1) + [FUSIONS] * fusions
    for primitives in plan + [PRIMITIVES] * after:
        if primitives == ("split",):
            prim, call = "split", _split_a_reduction(data, sch)
        else:
            prim, call = draw_step(data, sch, primitives)
        regrouped = apply_step(name, sch, prim, call, regrouped)
    assert Schedule(original(name)).replay(sch.trace.to_json()).program == sch.program


def _split_a_reduction(data: st.DataObject, sch: Schedule) -> Callable[[], object]:
    """A split of a loop binding some reduction (the usual set-up of a split-k or a rolling update over tiles)."""
    reduce_loops = [r for b in sch.program.blocks() if b.reducer is not None
                    for r in sch.get_loops(b.name) if r.name in _reduce_loop_vars(b)]
    loop = data.draw(st.sampled_from(reduce_loops)) if reduce_loops else LoopRef("none", "none")
    factors = data.draw(FACTORS)
    return lambda: sch.split(loop, factors)
