"""Random schedules keep a program's meaning, and refused steps change nothing.

Hypothesis draws sequences of 1-5 primitives with random, legal or illegal, arguments (loops, factors,
threads, blocks) on small catalog operators and on the hand-written programs of ``ir_programs``.  After
every step the program must compute what the original did on the same inputs; a step that is refused must
raise a :class:`PolyfuseError` (never another exception) and leave the program and the trace as they were.

Results are compared bitwise, except once an ``rfactor`` has regrouped a float reduction.  Then each
regrouped f32 sum of at most K = 8 terms may differ by ``2·(K - 1)·u32·Σ|t|`` (u32 = 2^-24, about
8.3e-7·Σ|t|), which the few operations after it (exp of a difference, a division, a square root)
amplify by a small factor; f32 outputs are compared to ``1e-5`` relative to the output's magnitude, and
f16 outputs may in addition round to the neighbouring f16 value (2^-10 relative).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ir_programs import prefix_sum, softmax_sum, softmax_sum_split
from polyfuse import ops
from polyfuse.errors import PolyfuseError
from polyfuse.ir import Block, Program, interpret
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import free_vars
from polyfuse.transforms import LoopRef, Schedule

TINY_CAUSAL = {"B": 1, "Hq": 1, "Hkv": 1, "Sq": 2, "Skv": 4, "D": 2, "Dv": 2}


def _catalog(name: str, mode: str | None = None, **sizes: int) -> tuple[Callable[[], Program], Callable[[int], dict]]:
    op = ops.get(name)
    return (lambda: op.program(mode, **sizes)), (lambda seed: op.inputs(seed, mode, sizes))


def _normal_inputs(build: Callable[[], Program]) -> Callable[[int], dict]:
    def make(seed: int) -> dict:
        rng = np.random.default_rng(seed)
        return {t.name: rng.standard_normal(tuple(int(d.value) for d in t.shape)).astype(t.dtype.numpy)  # type: ignore[attr-defined]
                for t in build().inputs}
    return make


def _hand_written(build: Callable[[], Program]) -> tuple[Callable[[], Program], Callable[[int], dict]]:
    return build, _normal_inputs(build)


PROGRAMS = {
    "softmax_sum": _catalog("softmax_sum", N=2, M=8),
    "softmax": _catalog("softmax", N=2, M=6),
    "rmsnorm_amax": _catalog("rmsnorm_amax", N=2, M=4),
    "attn_causal": _catalog("attn_causal", "prefill", **TINY_CAUSAL),
    "fig1a_split": _hand_written(lambda: softmax_sum_split(n=5, m=4, factor=2)),
    "fig1a": _hand_written(lambda: softmax_sum(symbolic=False, n=3, m=6)),
    "prefix_sum": _hand_written(lambda: prefix_sum(n=6)),
}
SEEDS = (0, 1)


@cache
def original(name: str) -> Program:
    return PROGRAMS[name][0]()


@cache
def inputs_of(name: str, seed: int) -> dict:
    return PROGRAMS[name][1](seed)


@cache
def expected(name: str, seed: int) -> dict:
    return interpret(original(name), inputs_of(name, seed))


def assert_same_meaning(name: str, program: Program, regrouped: bool) -> None:
    for seed in SEEDS:
        got = interpret(program, inputs_of(name, seed))
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


def draw_step(data: st.DataObject, sch: Schedule) -> tuple[str, Callable[[], object]]:
    """A primitive and a call of it on ``sch`` with drawn arguments (legal or not)."""
    primitives = ["split", "reorder", "fuse", "tile", "bind", "annotate", "decompose_reduction", "rfactor"]
    primitives += [p for p in ("compute_at", "recompute_at", "reverse_compute_at", "compute_inline") if hasattr(sch, p)]
    prim = data.draw(st.sampled_from(primitives))
    reductions = [b.name for b in sch.program.blocks() if b.reducer is not None]
    pool = reductions if prim in ("decompose_reduction", "rfactor") and reductions else _blocks(sch)
    block = data.draw(st.sampled_from(pool))
    loop = _loop(data, sch, block)
    if prim == "split":
        factors = data.draw(FACTORS)
        return prim, lambda: sch.split(loop, factors)
    if prim in ("reorder", "fuse", "tile"):
        other = _loop(data, sch, block)
        if prim == "reorder":
            return prim, lambda: sch.reorder([loop, other])
        if prim == "fuse":
            return prim, lambda: sch.fuse([loop, other])
        sizes = data.draw(st.lists(st.integers(1, 3), min_size=2, max_size=2))
        return prim, lambda: sch.tile([loop, other], sizes)
    if prim == "bind":
        thread = data.draw(st.sampled_from(THREADS))
        return prim, lambda: sch.bind(loop, thread)
    if prim == "annotate":
        kind = data.draw(st.sampled_from(KINDS))
        return prim, lambda: sch.annotate(loop, kind)
    if prim == "decompose_reduction":
        return prim, lambda: sch.decompose_reduction(block, loop)
    if prim == "rfactor":
        reduce_loops = [r for r in sch.get_loops(block) if r.name in _reduce_loop_vars(sch.program.block(block))]
        if reduce_loops and data.draw(st.booleans()):
            loop = data.draw(st.sampled_from(reduce_loops))
        axis = data.draw(st.sampled_from([None, 0]))
        return prim, lambda: sch.rfactor(loop, factor_axis=axis)
    if prim == "compute_inline":
        return prim, lambda: sch.compute_inline(block)  # type: ignore[attr-defined]
    target = data.draw(st.sampled_from(_blocks(sch)))
    at = _loop(data, sch, target)
    return prim, lambda: getattr(sch, prim)(block, at)


# ------------------------------------------------------------------ the property

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PROGRAMS)), steps=st.integers(1, 5), data=st.data())
def test_random_schedules_keep_the_meaning(name: str, steps: int, data: st.DataObject) -> None:
    sch = Schedule(original(name))
    regrouped = False
    for _ in range(steps):
        prim, call = draw_step(data, sch)
        before, trace = sch.program, sch.trace.python()
        try:
            call()
        except PolyfuseError:
            event(f"{prim} refused")
            assert sch.program is before, f"refused {prim} changed the program"
            assert sch.trace.python() == trace, f"refused {prim} changed the trace"
            continue
        event(f"{prim} applied")
        validate(sch.program)
        regrouped = regrouped or prim == "rfactor"
        assert_same_meaning(name, sch.program, regrouped)
    assert Schedule(original(name)).replay(sch.trace.to_json()).program == sch.program
