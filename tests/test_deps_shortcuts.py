"""The analysis' shortcuts agree with the plain formulation, its caches key on everything, and it is fast.

``deps.analyze`` orders instances on fewer time coordinates (``ordering_schedule``),
derives anti dependences and the flow into own-element reads from the other
dependences, and analyses a repeated read once (:mod:`polyfuse.deps.direct`).  The
plain formulation: every read and write on the padded schedule with a trailing
reads-before-write dimension, one ``compute_flow`` per kind, anti in reversed time.
"""

from __future__ import annotations

import ir_programs

import time

import islpy as isl
import pytest
from test_deps import attention_like, copy_then_reverse, softmax_split_exp

from polyfuse import deps, ops
from polyfuse.deps.access import tagged_union
from polyfuse.deps.schedule import ordering_schedule
from polyfuse.ir import ProgramBuilder, reduce
from polyfuse.ops.schedules import default_schedule
from polyfuse.transforms import repair
from polyfuse.transforms.schedule import Schedule, Trace


def _in_place_update():
    """``x[i] = x[i] * 2`` after a write of x: an own-element read outside a reduction."""
    p = ProgramBuilder("in_place")
    N = p.size("N")
    a, x = p.input("a", (N,), "f32"), p.output("x", (N,), "f32")
    with p.nest("fill", i=N) as (i,):
        x[i] = a[i] + 1.0
    with p.nest("double", i=N) as (i,):
        x[i] = x[i] * 2.0
    with p.nest("sum", j=reduce(N)) as (j,):
        x[0] = x[0] + x[j] * x[j]  # a repeated read (x[j] twice), one of them the accumulator at j = 0
    return p.build()


def _decomposed_softmax():
    """Fig. 1a with s_sum's init split off (its accumulator read happens in every instance)."""
    sch = Schedule(ir_programs.softmax_sum())
    sch.decompose_reduction("s_sum", sch.loop("s_sum", "j"))
    return sch.program


@pytest.fixture(scope="module")
def fused_attention():
    """The fused attention programs (prefill, decode) before compaction, and after."""
    out = []
    for mode in ("prefill", "decode"):
        sch = default_schedule("attn_causal", mode, ops.get("attn_causal").program(mode))
        uncompacted = Schedule(sch.original).replay(Trace(sch.trace.steps[:-1])).program
        out += [uncompacted, sch.program]
    return out


PROGRAMS = {
    "softmax": lambda: ir_programs.softmax_sum(),
    "softmax_naive": lambda: ir_programs.softmax_sum(layout="naive"),
    "softmax_split": lambda: ir_programs.softmax_sum_split(),
    "softmax_split_exp": softmax_split_exp,
    "copy_then_reverse": lambda: copy_then_reverse(fused=True),
    "prefix_sum": lambda: ir_programs.prefix_sum(),
    "attention_like": lambda: attention_like(B=1, H=2, S=12, D=4),
    "in_place": _in_place_update,
    "decomposed": _decomposed_softmax,
}


def _plain(program) -> dict[tuple[str, str, str], isl.Map]:
    """Every direct dependence by (kind, source ref, sink ref), computed the plain way."""
    d = deps.analyze(program)
    reads = [a for a in d.accesses if a.is_read]
    writes = [a for a in d.accesses if not a.is_read]
    timed = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    for a in d.accesses:
        order = isl.Map.from_domain_and_range(a.relation.domain(), isl.Set("{ [0] }" if a.is_read else "{ [1] }"))
        timed = timed.union(isl.UnionMap.from_map(a.untag.apply_range(d.schedule[a.block].flat_range_product(order))))
    width = next(iter(d.schedule.values())).dim(isl.dim_type.out) + 1
    names = ", ".join(f"t{k}" for k in range(width))
    negate = isl.UnionMap(f"{{ [{names}] -> [{', '.join(f'-t{k}' for k in range(width))}] }}")

    def last_writes(sinks, schedule):
        return (isl.UnionAccessInfo.from_sink(tagged_union(sinks)).set_must_source(tagged_union(writes))
                .set_schedule_map(schedule).compute_flow().get_must_dependence())

    out: dict[tuple[str, str, str], isl.Map] = {}
    for kind, umap in (("flow", last_writes(reads, timed)), ("output", last_writes(writes, timed)),
                       ("anti", last_writes(reads, timed.apply_range(negate)).reverse())):
        maps: list[isl.Map] = []
        umap.foreach_map(maps.append)
        for m in maps:
            src = m.get_space().domain().unwrap().get_tuple_name(isl.dim_type.out)
            dst = m.get_space().range().unwrap().get_tuple_name(isl.dim_type.out)
            rel = m.domain_factor_domain().range_factor_domain()
            if d.access(src).block == d.access(dst).block:
                rel = rel.subtract(isl.Map.identity(rel.get_space()))
            if not rel.is_empty():
                out[(kind, src, dst)] = rel
    return out


def _found(program) -> dict[tuple[str, str, str], isl.Map]:
    out: dict[tuple[str, str, str], isl.Map] = {}
    for d in deps.analyze(program):
        key = (d.kind, d.source_ref, d.sink_ref)
        out[key] = out[key].union(d.relation) if key in out else d.relation
    return out


def _assert_same_dependences(program) -> None:
    plain, found = _plain(program), _found(program)
    assert sorted(found) == sorted(plain)
    for key, rel in plain.items():
        assert found[key].is_equal(rel), f"{key}: {found[key]} != {rel}"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_dependences_equal_the_plain_formulation(name: str):
    _assert_same_dependences(PROGRAMS[name]())


@pytest.mark.slow
def test_fused_attention_dependences_equal_the_plain_formulation(fused_attention):
    for program in fused_attention:
        _assert_same_dependences(program)


def test_repeated_reads_get_the_dependences_of_the_first():
    d = deps.analyze(_in_place_update())
    into = {x.sink_ref: x for x in d.flow if x.source == "double" and x.sink == "sum"}
    assert set(into) == {"sum__r1", "sum__r2"}
    assert into["sum__r1"].relation.is_equal(into["sum__r2"].relation)


@pytest.mark.parametrize("name", ["softmax_naive", "softmax_split", "attention_like"])
def test_ordering_schedule_keeps_the_order_of_every_pair_of_blocks(name: str):
    program = PROGRAMS[name]()
    d = deps.analyze(program)
    blocks = list(d.domains)
    for a in blocks:
        for b in blocks:
            short = ordering_schedule(program, d.domains, {a, b})
            width = next(iter(short.values())).dim(isl.dim_type.out)
            assert width <= d.schedule[a].dim(isl.dim_type.out)
            padded = d.schedule[a].lex_lt_map(d.schedule[b])
            assert short[a].lex_lt_map(short[b]).is_equal(padded), (a, b)


def test_ordering_schedule_drops_what_cannot_order():
    program = ir_programs.softmax_sum(layout="naive")  # [0, i, 0, j, k] for k = 0, 1, 2
    d = deps.analyze(program)
    alone = ordering_schedule(program, d.domains, {"s_exp"})
    assert alone["s_exp"].is_equal(isl.Map("[N, M] -> { s_exp[i, j] -> [i, j] : 0 <= i < N and 0 <= j < M }"))
    two = ordering_schedule(program, d.domains, {"s_max", "s_sum"})
    assert two["s_sum"].is_equal(isl.Map("[N, M] -> { s_sum[i, j] -> [i, j, 2] : 0 <= i < N and 0 <= j < M }"))


def test_caches_key_on_the_loops_as_well_as_the_block():
    # The same block objects under different loops: each program gets its own schedule.
    plain, naive = ir_programs.softmax_sum(), ir_programs.softmax_sum(layout="naive")
    assert plain.block("s_exp") == naive.block("s_exp")
    first = deps.instance_schedule(plain, deps.domains(plain))["s_exp"]
    second = deps.instance_schedule(naive, deps.domains(naive))["s_exp"]
    assert first.is_equal(isl.Map("[N, M] -> { s_exp[i, j] -> [1, i, 0, j, 0] : 0 <= i < N and 0 <= j < M }"))
    assert second.is_equal(isl.Map("[N, M] -> { s_exp[i, j] -> [0, i, 0, j, 1] : 0 <= i < N and 0 <= j < M }"))
    # Sizes are part of the key too: integer sizes give integer domains.
    small = ir_programs.softmax_sum(symbolic=False, n=2, m=3)
    assert deps.domains(small)["s_max"].is_equal(isl.Set("{ s_max[i, j] : 0 <= i < 2 and 0 <= j < 3 }"))


def test_cleared_caches_give_the_same_analysis():
    program = attention_like(B=1, H=2, S=12, D=4)
    before = _found(program)
    deps.clear_caches()
    after = _found(program)
    assert sorted(before) == sorted(after)
    assert all(before[k].is_equal(after[k]) for k in before)


# ----------------------------------------------------------------- speed


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_fusing_attention_is_fast(mode: str):
    """Every schedule step of fused attention (dependence checks, solver, compaction) from cold caches.

    About 1 s on a small 2-core VM once the modules are imported; the bound leaves room for a
    loaded CI machine and only catches a return to several seconds."""
    program = ops.get("attn_causal").program(mode)
    default_schedule("attn_causal", mode, program)  # imports everything the steps use
    deps.clear_caches()
    repair._solve_cached.cache_clear()
    start = time.perf_counter()
    default_schedule("attn_causal", mode, program)
    elapsed = time.perf_counter() - start
    assert elapsed < 4.0, f"fusing attn_causal ({mode}) took {elapsed:.2f} s"
