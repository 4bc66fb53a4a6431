"""polyfuse.deps against execution: every relation checked pair by pair on small concrete sizes.

A tiny enumerator walks the loop tree in order with Python ints (independent of
ISL and of the NumPy interpreter), records each instance's accesses (reads
before the write; a reduction's accumulator read absent at its first reduce
iteration, its init loads present only there) and derives the exact last-writer
(flow), next-write (anti) and previous-write (output) pairs.  The analysis must
produce exactly those pairs, per reference tag, and ``violated`` exactly the
pairs a transformed program runs sink-first.
"""

from __future__ import annotations

import ir_programs

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

import islpy as isl
import pytest

from polyfuse import deps
from polyfuse.ir import (
    BinOp, Block, Const, Expr, Load, Loop, Program, ProgramBuilder, Seq, Stmt, Var, exp, maximum, reduce, spatial,
)
from polyfuse.ir.visit import loads

Instance = tuple[str, tuple[int, ...]]
Pairs = dict[tuple[str, str, str], set[tuple[Instance, Instance]]]

# ----------------------------------------------------------------- the enumerator


def evaluate(e: Expr, env: dict[str, int]) -> int:
    """An integer index/binding/extent expression with Python's floor semantics."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env[e.name]
    assert isinstance(e, BinOp), e
    a, b = evaluate(e.a, env), evaluate(e.b, env)
    return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[e.op]


def run_order(program: Program) -> list[tuple[Block, tuple[int, ...]]]:
    """Block instances in execution order (the implied guard applied)."""
    out: list[tuple[Block, tuple[int, ...]]] = []

    def visit(s: Stmt, env: dict[str, int]) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                visit(c, env)
        elif isinstance(s, Loop):
            for v in range(evaluate(s.extent, env)):
                visit(s.body, {**env, s.var.name: v})
        else:
            assert isinstance(s, Block)
            inst = tuple(evaluate(b, env) for b in s.bindings)
            if all(0 <= x < evaluate(iv.extent, env) for x, iv in zip(inst, s.iters, strict=True)):
                out.append((s, inst))

    visit(program.body, {})
    return out


def events(block: Block, inst: tuple[int, ...]) -> Iterator[tuple[str, bool, str, tuple[int, ...]]]:
    """(tag, is_write, tensor, element) of one instance: reads in pre-order, init loads, then the store."""
    env = {iv.var.name: x for iv, x in zip(block.iters, inst, strict=True)}
    first = all(x == 0 for iv, x in zip(block.iters, inst, strict=True) if iv.is_reduce)
    st = block.store
    acc = Load(st.tensor, st.indices)
    for k, ld in enumerate(loads(st.value)):
        if not (block.is_reduction and block.init is not None and ld == acc and first):
            yield f"{block.name}__r{k}", False, ld.tensor.name, tuple(evaluate(i, env) for i in ld.indices)
    if block.init is not None and first:
        for k, ld in enumerate(loads(block.init)):
            yield f"{block.name}__init{k}", False, ld.tensor.name, tuple(evaluate(i, env) for i in ld.indices)
    yield f"{block.name}__w", True, st.tensor.name, tuple(evaluate(i, env) for i in st.indices)


def executed_dependences(program: Program) -> tuple[Pairs, dict[tuple[str, str, tuple], tuple[int, ...]]]:
    """Exact direct dependence pairs by (kind, source tag, sink tag), and each block's last write per element."""
    found: Pairs = defaultdict(set)
    last_write: dict[tuple, tuple[str, Instance]] = {}
    reads_since: dict[tuple, list[tuple[str, Instance]]] = defaultdict(list)
    final: dict[tuple[str, str, tuple], tuple[int, ...]] = {}
    for block, inst in run_order(program):
        me = (block.name, inst)
        for tag, is_write, tensor, elem in events(block, inst):
            loc = (tensor, elem)
            prev = last_write.get(loc)
            if not is_write:
                if prev is not None and prev[1] != me:
                    found[("flow", prev[0], tag)].add((prev[1], me))
                reads_since[loc].append((tag, me))
                continue
            if prev is not None and prev[1] != me:
                found[("output", prev[0], tag)].add((prev[1], me))
            for rtag, reader in reads_since.pop(loc, []):
                if reader != me:
                    found[("anti", rtag, tag)].add((reader, me))
            last_write[loc] = (tag, me)
            final[(block.name, tensor, elem)] = inst
    return found, final


def points(rel: isl.Map, source: str, sink: str) -> set[tuple[Instance, Instance]]:
    """The pairs of a parameter-free relation."""
    n_in, n_out = rel.dim(isl.dim_type.in_), rel.dim(isl.dim_type.out)
    out: set[tuple[Instance, Instance]] = set()

    def add(pt: isl.Point) -> None:
        xs = [pt.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(n_in + n_out)]
        out.add(((source, tuple(xs[:n_in])), (sink, tuple(xs[n_in:]))))

    rel.wrap().foreach_point(add)
    return out


def analysed_pairs(found: list[deps.Dependence]) -> Pairs:
    out: Pairs = defaultdict(set)
    for d in found:
        assert d.relation.dim(isl.dim_type.param) == 0
        out[(d.kind, d.source_ref, d.sink_ref)] |= points(d.relation, d.source, d.sink)
    return {k: v for k, v in out.items() if v}


def assert_matches_execution(program: Program) -> deps.Dependences:
    """Every dependence pair the analysis claims is exactly the executed one; temporal flags agree."""
    d = deps.analyze(program)
    executed, final = executed_dependences(program)
    analysed = analysed_pairs(d.all)
    assert set(analysed) == set(executed), (sorted(set(analysed) ^ set(executed)))
    for key, pairs in executed.items():
        assert analysed[key] == pairs, (key, sorted(pairs ^ analysed[key])[:5])
    blocks = {b.name: b for b in program.blocks()}
    for dep in d.flow:
        src = blocks[dep.source]
        tensor = src.store.tensor.name
        for (_, s_inst), _ in points(dep.relation, dep.source, dep.sink):
            elem = next(e for t, w, _, e in events(src, s_inst) if w)
            is_final = src.is_reduction and dep.source != dep.sink and final[(src.name, tensor, elem)] == s_inst
            assert dep.temporal == is_final, (str(dep), s_inst)
    return d


def assert_violations_match_execution(original: Program, new: Program) -> list[deps.Dependence]:
    """``violated`` reports exactly the original pairs that ``new`` runs sink-first."""
    d = deps.analyze(original)
    order = run_order(new)
    position = {(b.name, inst): k for k, (b, inst) in enumerate(order)}
    assert len(position) == len(order) == len(run_order(original)), "each instance must run exactly once"
    expected: Pairs = defaultdict(set)
    for dep in d.all:
        for src, dst in points(dep.relation, dep.source, dep.sink):
            if position[dst] < position[src]:
                expected[(dep.kind, dep.source_ref, dep.sink_ref)].add((src, dst))
    found = deps.violated(d, new)
    assert analysed_pairs(found) == dict(expected)
    for v in found:
        assert v.witness is not None and v.witness.is_subset(v.relation)
    return found


# ----------------------------------------------------------------- programs


def softmax_sum(N: int, M: int, *, fused: bool = False) -> Program:
    return ir_programs.softmax_sum(False, N, M, layout="naive" if fused else "plain")


def stencil(N: int, *, variant: str = "plain") -> Program:
    """Shifted, strided and modular reads; an overwrite; a reduction with an init load.

    ``fused``: everything under one loop (breaks the shifted read); ``split``:
    the smoother's loop split by 3 with a guard (legal).
    """
    p = ProgramBuilder("stencil")
    x = p.input("x", (N + 1,), "f32")
    a, b = p.temp("a", (N + 1,), "f32"), p.temp("b", (N,), "f32")
    acc, y = p.temp("acc", (N // 2 + 1,), "f32"), p.output("y", (N,), "f32")
    if variant == "fused":
        with p.loop("i", N + 1) as li:
            with p.block("fill", i=spatial(N + 1, li)) as (i,):
                a[i] = x[i] * 2.0
            with p.block("smooth", i=spatial(N, li)) as (i,):
                b[i] = a[i] + a[i + 1] + a[i // 2] + a[i % 3]
    else:
        with p.nest("fill", i=N + 1) as (i,):
            a[i] = x[i] * 2.0
    if variant == "plain":
        with p.nest("smooth", i=N) as (i,):
            b[i] = a[i] + a[i + 1] + a[i // 2] + a[i % 3]
    elif variant == "split":
        with p.loop("i0", (N + 2) // 3) as i0, p.loop("i1", 3) as i1:
            with p.block("smooth", i=spatial(N, 3 * i0 + i1)) as (i,):
                b[i] = a[i] + a[i + 1] + a[i // 2] + a[i % 3]
    with p.nest("pairsum", i=N // 2 + 1, j=reduce(2), init=a[Var("i")]) as (i, j):
        acc[i] = acc[i] + b[(2 * i + j) % N]
    with p.nest("refill", i=N + 1) as (i,):
        a[i] = x[i] * 3.0
    with p.nest("out", i=N) as (i,):
        y[i] = b[N - 1 - i] + acc[i // 2] + a[i]
    return p.build()


def attention_like(B: int, H: int, S: int, D: int, *, tiled: bool = False) -> Program:
    p = ProgramBuilder("attention_like")
    q, k, v = (p.input(n, (B, H, S, D), "f32") for n in ("q", "k", "v"))
    score, e = p.temp("score", (B, H, S, S), "f32"), p.temp("e", (B, H, S, S), "f32")
    m, s = p.temp("m", (B, H, S), "f32"), p.temp("s", (B, H, S), "f32")
    o, out = p.temp("o", (B, H, S, D), "f32"), p.output("out", (B, H, S, D), "f32")
    with p.nest("qk", b=B, h=H, i=S, j=S, d=reduce(D)) as (b, h, i, j, d):
        score[b, h, i, j] = score[b, h, i, j] + q[b, h, i, d] * k[b, h, j, d]
    with p.nest("rmax", b=B, h=H, i=S, j=reduce(S)) as (b, h, i, j):
        m[b, h, i] = maximum(m[b, h, i], score[b, h, i, j])
    if not tiled:
        with p.nest("pexp", b=B, h=H, i=S, j=S) as (b, h, i, j):
            e[b, h, i, j] = exp(score[b, h, i, j] - m[b, h, i])
        with p.nest("rsum", b=B, h=H, i=S, j=reduce(S)) as (b, h, i, j):
            s[b, h, i] = s[b, h, i] + e[b, h, i, j]
    else:  # naive fusion of pexp and rsum into one (b, h, i, j) nest, j tiled by 2
        with p.loop("b", B) as lb, p.loop("h", H) as lh, p.loop("i", S) as li:
            with p.loop("j0", (S + 1) // 2) as j0, p.loop("j1", 2) as j1:
                with p.block("pexp", b=spatial(B, lb), h=spatial(H, lh), i=spatial(S, li),
                             j=spatial(S, 2 * j0 + j1)) as (b, h, i, j):
                    e[b, h, i, j] = exp(score[b, h, i, j] - m[b, h, i])
                with p.block("rsum", b=spatial(B, lb), h=spatial(H, lh), i=spatial(S, li),
                             j=reduce(S, 2 * j0 + j1)) as (b, h, i, j):
                    s[b, h, i] = s[b, h, i] + e[b, h, i, j]
    with p.nest("pv", b=B, h=H, i=S, d=D, j=reduce(S)) as (b, h, i, d, j):
        o[b, h, i, d] = o[b, h, i, d] + e[b, h, i, j] * v[b, h, j, d]
    with p.nest("norm", b=B, h=H, i=S, d=D) as (b, h, i, d):
        out[b, h, i, d] = o[b, h, i, d] / s[b, h, i]
    return p.build()


# ----------------------------------------------------------------- tests


@pytest.mark.parametrize("N,M", [(1, 1), (2, 4), (3, 5)])
def test_softmax_matches_execution(N: int, M: int):
    assert_matches_execution(softmax_sum(N, M))
    assert_matches_execution(softmax_sum(N, M, fused=True))


@pytest.mark.parametrize("N", [1, 4, 7])
def test_stencil_matches_execution(N: int):
    d = assert_matches_execution(stencil(N))
    assert d.anti and d.output, "the overwrite of a must give anti and output dependences"
    assert_matches_execution(stencil(N, variant="split"))


def test_symbolic_analysis_specialises_to_concrete_execution():
    p = ProgramBuilder("softmax_sum")
    N, M = p.sizes("N", "M")
    inp, xmax = p.input("inp", (N, M), "f32"), p.temp("xmax", (N,), "f32")
    y = p.output("y", (N, M), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        xmax[i] = maximum(xmax[i], inp[i, j])
    with p.nest("s_use", i=N, j=M) as (i, j):
        y[i, j] = inp[i, M - 1 - j] - xmax[i]
    prog = p.build()
    sym = deps.analyze(prog)
    for n, m in ((2, 3), (3, 1)):
        executed, _ = executed_dependences(prog.bind(N=n, M=m))
        fixed = [replace(d, relation=d.relation.fix_val(isl.dim_type.param, 0, n)
                         .fix_val(isl.dim_type.param, 1, m).project_out(isl.dim_type.param, 0, 2))
                 for d in sym.all]
        assert analysed_pairs(fixed) == {k: v for k, v in executed.items() if v}


def test_attention_matches_execution():
    assert_matches_execution(attention_like(1, 2, 3, 2))
    assert_matches_execution(attention_like(1, 1, 3, 2, tiled=True))


def test_violations_match_execution_order():
    found = assert_violations_match_execution(softmax_sum(2, 3), softmax_sum(2, 3, fused=True))
    assert [v.label for v in found] == ["flow s_max -> s_exp on xmax (temporal)"]
    assert assert_violations_match_execution(stencil(5), stencil(5, variant="split")) == []
    broken = assert_violations_match_execution(stencil(5), stencil(5, variant="fused"))
    assert {(v.kind, v.source, v.sink, v.temporal) for v in broken} == {("flow", "fill", "smooth", False)}
    tiled = assert_violations_match_execution(attention_like(1, 1, 3, 2), attention_like(1, 1, 3, 2, tiled=True))
    assert [v.label for v in tiled] == []


# ----------------------------------------------------------------- the operator catalog


def _catalog_cases() -> list:
    try:
        from polyfuse import ops

        names = ops.names()
    except Exception as err:  # the catalog is written concurrently; a broken import must not hide these tests
        return [pytest.param(None, None, marks=pytest.mark.skip(reason=f"operator catalog unavailable: {err}"))]
    cases = [pytest.param(n, m, id=f"{n}-{m}") for n in names for m in ops.get(n).modes]
    return cases or [pytest.param(None, None, marks=pytest.mark.skip(reason="the operator catalog is empty"))]


MAX_INSTANCES = 20_000


def _instances(program: Program) -> int:
    return sum(int(dom.count_val().to_python()) for dom in deps.domains(program).values())


@pytest.mark.parametrize("name,mode", _catalog_cases())
def test_catalog_operator_matches_execution(name: str, mode: str):
    """Each catalog program at sizes of at most 4 (the same loop structure, enumerable in Python)."""
    from polyfuse import ops

    op = ops.get(name)
    sizes = op.sizes(mode)
    try:
        program = op.program(mode, **{k: min(v, 4) for k, v in sizes.items()})
    except Exception:  # sizes with constraints (divisibility, ratios): fall back to the defaults
        program = op.program(mode)
    program = program.bind(**{p.name: sizes[p.name] for p in program.params if p.name in sizes})
    if program.params:
        pytest.skip(f"{name}/{mode}: sizes {', '.join(p.name for p in program.params)} have no default value")
    if _instances(program) > MAX_INSTANCES:
        pytest.skip(f"{name}/{mode}: {_instances(program)} instances are too many to enumerate in Python")
    assert_matches_execution(program)


# ----------------------------------------------------------------- random reschedules (hypothesis)

N_RAND, M_RAND = 3, 4


def _cascade(order: tuple[str, ...] | None, perm: tuple[int, int], reverse: tuple[bool, bool], split: bool,
             shift: int, shared: int = 2) -> Program:
    """``t = 2x``; ``r = Σ_j t``; ``y = t[i, (j + shift) % M] + r``.

    ``order=None``: one nest per block.  Otherwise the blocks, in ``order``, share
    the outer loop (dimension ``perm[0]``, split by 2 when ``split``) and, if
    ``shared == 2``, the inner one too; unshared inner loops are one per block.
    ``reverse[d]`` runs dimension ``d`` backwards.
    """
    N, M = N_RAND, M_RAND
    p = ProgramBuilder("cascade")
    x, t = p.input("x", (N, M), "f32"), p.temp("t", (N, M), "f32")
    r, y = p.temp("r", (N,), "f32"), p.output("y", (N, M), "f32")

    def body(name: str, i, j) -> None:
        if name == "P":
            with p.block(name, i=spatial(N, i), j=spatial(M, j)) as (bi, bj):
                t[bi, bj] = x[bi, bj] * 2.0
        elif name == "R":
            with p.block(name, i=spatial(N, i), j=reduce(M, j)) as (bi, bj):
                r[bi] = r[bi] + t[bi, bj]
        else:
            with p.block(name, i=spatial(N, i), j=spatial(M, j)) as (bi, bj):
                y[bi, bj] = t[bi, (bj + shift) % M] + r[bi]

    if order is None:
        for name in ("P", "R", "C"):
            with p.loop("i", N) as li, p.loop("j", M) as lj:
                body(name, li, lj)
        return p.build()
    extents = (N, M)
    outer, inner = perm

    def place(name: str, a, b) -> None:
        vals = {outer: a, inner: b}
        for d in (0, 1):
            if reverse[d]:
                vals[d] = extents[d] - 1 - vals[d]
        body(name, vals[0], vals[1])

    with p.loop("a0", (extents[outer] + 1) // 2 if split else extents[outer]) as a0:
        with p.loop("a1", 2 if split else 1) as a1:
            a = a0 * 2 + a1 if split else a0 + a1
            if shared == 2:
                with p.loop("b", extents[inner]) as b:
                    for name in order:
                        place(name, a, b)
            else:
                for name in order:
                    with p.loop(f"b_{name}", extents[inner]) as b:
                        place(name, a, b)
    return p.build()


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test extra
    given = None


if given is not None:
    @settings(max_examples=40, deadline=None)
    @given(order=st.permutations(["P", "R", "C"]), perm=st.sampled_from([(0, 1), (1, 0)]),
           reverse=st.tuples(st.booleans(), st.booleans()), split=st.booleans(), shift=st.integers(0, 3),
           shared=st.sampled_from([1, 2]))
    def test_random_reschedules_violate_exactly_what_execution_reorders(order, perm, reverse, split, shift, shared):
        original = _cascade(None, (0, 1), (False, False), False, shift)
        new = _cascade(tuple(order), perm, reverse, split, shift, shared)
        found = assert_violations_match_execution(original, new)
        if not found:  # a schedule that keeps every direct dependence computes the same values
            before, _ = executed_dependences(original)
            after, _ = executed_dependences(new)
            assert {k: v for k, v in after.items() if k[0] == "flow"} == {
                k: v for k, v in before.items() if k[0] == "flow"}


@pytest.mark.parametrize("reverse_i,split", [(False, False), (True, False), (False, True), (True, True)])
def test_legal_reschedule_keeps_every_last_writer(reverse_i: bool, split: bool):
    """Fusing only the i loops (each block keeps its own forward j loop) is legal, however i runs."""
    original = _cascade(None, (0, 1), (False, False), False, 1)
    new = _cascade(("P", "R", "C"), (0, 1), (reverse_i, False), split, 1, shared=1)
    assert assert_violations_match_execution(original, new) == []
    before, _ = executed_dependences(original)
    after, _ = executed_dependences(new)
    assert {k: v for k, v in after.items() if k[0] == "flow"} == {k: v for k, v in before.items() if k[0] == "flow"}
