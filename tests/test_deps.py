"""polyfuse.deps: domains, tagged accesses, schedule, dependences, legality (Neptune Fig. 1)."""

from __future__ import annotations

import ir_programs

import time

import islpy as isl
import pytest

from polyfuse import deps
from polyfuse.errors import IllegalTransform, IRError, NonAffineIndex, PolyfuseError
from polyfuse.ir import (
    INF, Block, IterVar, Loop, Program, ProgramBuilder, Store, Var, exp, maximum, reduce, select, spatial,
)

# ----------------------------------------------------------------- programs


def softmax_sum(*, layout: str = "plain", sizes: tuple = ("N", "M")) -> Program:
    """Neptune Fig. 1a / 1b (see ``ir_programs.softmax_sum``) with symbolic or integer sizes."""
    return ir_programs.softmax_sum(layout=layout, sizes=sizes)


def softmax_split_exp() -> Program:
    """Fig. 1a with s_exp's i loop split by 4 (N need not divide: the guard cuts the tail)."""
    p = ProgramBuilder("softmax_sum")
    N, M = p.sizes("N", "M")
    inp = p.input("inp", (N, M), "f32")
    xmax, xexp = p.temp("xmax", (N,), "f32"), p.temp("xexp", (N, M), "f32")
    xsum = p.output("xsum", (N,), "f32")
    with p.nest("s_max", i=N, j=reduce(M)) as (i, j):
        xmax[i] = maximum(xmax[i], inp[i, j])
    with p.loop("i0", (N + 3) // 4) as i0, p.loop("i1", 4) as i1, p.loop("j", M) as lj:
        with p.block("s_exp", i=spatial(N, i0 * 4 + i1), j=spatial(M, lj)) as (i, j):
            xexp[i, j] = exp(inp[i, j] - xmax[i])
    with p.loop("j", M) as lj, p.loop("i", N) as li:  # interchanged: each xsum[i] still sums j in order
        with p.block("s_sum", i=spatial(N, li), j=reduce(M, lj)) as (i, j):
            xsum[i] = xsum[i] + xexp[i, j]
    return p.build()


def copy_then_reverse(*, fused: bool) -> Program:
    """``y[i] = x[i]`` then ``z[i] = y[N-1-i]``; fusing both under one loop i reads y too early."""
    p = ProgramBuilder("rev")
    N = p.size("N")
    x, y, z = p.input("x", (N,), "f32"), p.temp("y", (N,), "f32"), p.output("z", (N,), "f32")
    if not fused:
        with p.nest("produce", i=N) as (i,):
            y[i] = x[i] * 2.0
        with p.nest("consume", i=N) as (i,):
            z[i] = y[N - 1 - i] + 1.0
        return p.build()
    with p.loop("i", N) as li:
        with p.block("produce", i=spatial(N, li)) as (i,):
            y[i] = x[i] * 2.0
        with p.block("consume", i=spatial(N, li)) as (i,):
            z[i] = y[N - 1 - i] + 1.0
    return p.build()


def attention_like(B: int = 2, H: int = 8, S: int = 128, D: int = 64) -> Program:
    """Eight blocks over 4-5 loop levels: q·kᵀ, scale+mask, max, exp, sum, P·V, normalise."""
    p = ProgramBuilder("attention_like")
    q, k, v = (p.input(n, (B, H, S, D), "f32") for n in ("q", "k", "v"))
    score, masked, e = (p.temp(n, (B, H, S, S), "f32") for n in ("score", "masked", "e"))
    m, s = p.temp("m", (B, H, S), "f32"), p.temp("s", (B, H, S), "f32")
    o, scaled = p.temp("o", (B, H, S, D), "f32"), p.temp("scaled", (B, H, S, S), "f32")
    out = p.output("out", (B, H, S, D), "f32")
    with p.nest("qk", b=B, h=H, i=S, j=S, d=reduce(D)) as (b, h, i, j, d):
        score[b, h, i, j] = score[b, h, i, j] + q[b, h, i, d] * k[b, h, j, d]
    with p.nest("scale", b=B, h=H, i=S, j=S) as (b, h, i, j):
        scaled[b, h, i, j] = score[b, h, i, j] * 0.125
    with p.nest("mask", b=B, h=H, i=S, j=S) as (b, h, i, j):
        masked[b, h, i, j] = select(j <= i, scaled[b, h, i, j], -INF)
    with p.nest("rmax", b=B, h=H, i=S, j=reduce(S)) as (b, h, i, j):
        m[b, h, i] = maximum(m[b, h, i], masked[b, h, i, j])
    with p.nest("pexp", b=B, h=H, i=S, j=S) as (b, h, i, j):
        e[b, h, i, j] = exp(masked[b, h, i, j] - m[b, h, i])
    with p.nest("rsum", b=B, h=H, i=S, j=reduce(S)) as (b, h, i, j):
        s[b, h, i] = s[b, h, i] + e[b, h, i, j]
    with p.nest("pv", b=B, h=H, i=S, d=D, j=reduce(S)) as (b, h, i, d, j):
        o[b, h, i, d] = o[b, h, i, d] + e[b, h, i, j] * v[b, h, j, d]
    with p.nest("norm", b=B, h=H, i=S, d=D) as (b, h, i, d):
        out[b, h, i, d] = o[b, h, i, d] / s[b, h, i]
    return p.build()


def only(found: list[deps.Dependence]) -> deps.Dependence:
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


def same(rel: isl.Map | isl.Set, text: str) -> bool:
    expected = isl.Map(text) if isinstance(rel, isl.Map) else isl.Set(text)
    return rel.is_equal(expected)


# ----------------------------------------------------------------- instances and accesses


def test_domains_are_named_parametric_boxes():
    d = deps.analyze(softmax_sum())
    assert list(d.domains) == ["s_max", "s_exp", "s_sum"]
    assert same(d.domains["s_max"], "[N, M] -> { s_max[i, j] : 0 <= i < N and 0 <= j < M }")
    assert d.params == ("N", "M")
    assert str(d.domains["s_exp"]) == "[N, M] -> { s_exp[i, j] : 0 <= i < N and 0 <= j < M }"


def test_accesses_are_tagged_per_reference():
    d = deps.analyze(softmax_sum())
    assert [a.tag for a in d.accesses if a.block == "s_exp"] == ["s_exp__r0", "s_exp__r1", "s_exp__w"]
    xmax_read = d.access("s_exp__r1")
    assert (xmax_read.tensor, xmax_read.kind, xmax_read.text) == ("xmax", "read", "xmax[i]")
    assert same(xmax_read.tagged, "[N, M] -> { [s_exp[i, j] -> s_exp__r1[]] -> xmax[i] : 0 <= i < N and 0 <= j < M }")
    # The accumulator read is absent where the init happens (first reduce iteration).
    acc = d.access("s_max__r0")
    assert acc.role == "accumulator"
    assert same(acc.relation, "[N, M] -> { s_max[i, j] -> xmax[i] : 0 <= i < N and 0 < j < M }")


def test_schedule_interleaves_sequence_positions_and_loops():
    d = deps.analyze(softmax_sum())
    assert same(d.schedule["s_exp"], "[N, M] -> { s_exp[i, j] -> [1, i, 0, j, 0] : 0 <= i < N and 0 <= j < M }")
    fused = deps.instance_schedule(softmax_sum(layout="naive"), d.domains)
    assert same(fused["s_sum"], "[N, M] -> { s_sum[i, j] -> [0, i, 0, j, 2] : 0 <= i < N and 0 <= j < M }")


def test_split_binding_is_inverted_and_guarded():
    prog = softmax_split_exp()
    sched = deps.instance_schedule(prog, deps.domains(prog))
    expected = ("[N, M] -> { s_exp[i, j] -> [1, i0, 0, i1, 0, j, 0] : i = 4i0 + i1 and 0 <= i1 < 4 "
                "and 0 <= i < N and 0 <= j < M }")
    assert same(sched["s_exp"], expected)


# ----------------------------------------------------------------- dependences of Fig. 1a


def test_softmax_dependences():
    d = deps.analyze(softmax_sum())
    t = only(d.between("s_max", "s_exp"))
    assert (t.kind, t.tensor, t.temporal, t.source_ref, t.sink_ref) == ("flow", "xmax", True, "s_max__w", "s_exp__r1")
    assert same(t.relation, "[N, M] -> { s_max[i, M - 1] -> s_exp[i, j] : 0 <= i < N and 0 <= j < M }")
    e = only(d.between("s_exp", "s_sum"))
    assert (e.kind, e.tensor, e.temporal) == ("flow", "xexp", False)
    assert same(e.relation, "[N, M] -> { s_exp[i, j] -> s_sum[i, j] : 0 <= i < N and 0 <= j < M }")
    for red, tensor in (("s_max", "xmax"), ("s_sum", "xsum")):
        self_flow = only(d.between(red, red, "flow"))
        assert self_flow.self_reduction and not self_flow.temporal and self_flow.tensor == tensor
        chain = f"[N, M] -> {{ {red}[i, j] -> {red}[i, j + 1] : 0 <= i < N and 0 <= j < M - 1 }}"
        assert same(self_flow.relation, chain)
        assert only(d.between(red, red, "output")).self_reduction
    assert d.anti == []
    assert [x.label for x in d.temporal] == ["flow s_max -> s_exp on xmax (temporal)"]
    assert d.between("s_max", "s_sum") == []


def test_dependence_prints_kind_blocks_tensor_and_isl_relation():
    d = deps.analyze(softmax_sum())
    text = str(only(d.between("s_max", "s_exp")))
    assert text.startswith("flow s_max -> s_exp on xmax (temporal): [N, M] -> { s_max[i, j = -1 + M] -> s_exp[")
    assert "witness" not in text


def test_symbolic_relations_hold_for_every_size():
    sym = deps.analyze(softmax_sum())
    temporal = only(sym.temporal).relation
    assert [temporal.get_dim_name(isl.dim_type.param, k) for k in range(2)] == ["N", "M"]
    for n, m in ((1, 1), (2, 4), (3, 7)):
        concrete = deps.analyze(softmax_sum().bind(N=n, M=m))
        for dep in sym:
            fixed = dep.relation.intersect_params(isl.Set(f"[N, M] -> {{ : N = {n} and M = {m} }}"))
            fixed = fixed.project_out(isl.dim_type.param, 0, 2)
            match = [c for c in concrete.all if (c.kind, c.source_ref, c.sink_ref, c.temporal)
                     == (dep.kind, dep.source_ref, dep.sink_ref, dep.temporal)]
            expected = match[0].relation if match else fixed.subtract(fixed)
            assert fixed.is_equal(expected), (n, m, str(dep))


def test_reduction_init_reads_happen_at_the_first_reduce_iteration():
    p = ProgramBuilder("biased_sum")
    N, M = p.sizes("N", "M")
    x, bias = p.input("x", (N, M), "f32"), p.input("bias", (N,), "f32")
    b2, y = p.temp("b2", (N,), "f32"), p.output("y", (N,), "f32")
    with p.nest("twice", i=N) as (i,):
        b2[i] = bias[i] * 2.0
    with p.nest("acc", i=N, j=reduce(M), init=b2[Var("i")]) as (i, j):
        y[i] = y[i] + x[i, j]
    d = deps.analyze(p.build())
    init_read = d.access("acc__init0")
    assert (init_read.role, init_read.tensor) == ("init", "b2")
    dep = only(d.between("twice", "acc"))
    assert dep.sink_ref == "acc__init0"
    assert same(dep.relation, "[N, M] -> { twice[i] -> acc[i, 0] : 0 <= i < N and M > 0 }")


def test_overwrites_give_anti_and_output_dependences():
    p = ProgramBuilder("overwrite")
    N = p.size("N")
    x, t, y = p.input("x", (N,), "f32"), p.temp("t", (N,), "f32"), p.output("y", (N,), "f32")
    with p.nest("w1", i=N) as (i,):
        t[i] = x[i]
    with p.nest("r1", i=N) as (i,):
        y[i] = t[i] + 1.0
    with p.nest("w2", i=N) as (i,):
        t[i] = x[i] * 3.0
    d = deps.analyze(p.build())
    assert same(only(d.between("r1", "w2", "anti")).relation, "[N] -> { r1[i] -> w2[i] : 0 <= i < N }")
    assert same(only(d.between("w1", "w2", "output")).relation, "[N] -> { w1[i] -> w2[i] : 0 <= i < N }")
    assert d.between("w2", "r1") == []


# ----------------------------------------------------------------- legality


def test_naive_fusion_violates_exactly_the_temporal_edges():
    d = deps.analyze(softmax_sum())
    found = deps.violated(d, softmax_sum(layout="naive"))
    v = only(found)
    assert (v.kind, v.source, v.sink, v.tensor, v.temporal) == ("flow", "s_max", "s_exp", "xmax", True)
    assert same(v.relation, "[N, M] -> { s_max[i, M - 1] -> s_exp[i, j] : 0 <= i < N and 0 <= j < M - 1 }")
    assert same(v.witness, "[N, M] -> { s_max[0, M - 1] -> s_exp[0, 0] : N > 0 and M >= 2 }")
    assert deps.check_naive_fusion(d, softmax_sum(layout="naive")) == found
    assert "witness (first violating pair)" in str(v)


def test_legal_reschedules_violate_nothing():
    d = deps.analyze(softmax_sum())
    assert deps.violated(d, softmax_split_exp()) == []
    assert deps.violated(d, d.schedule) == []
    deps.require_legal(d, softmax_split_exp(), what="split s_exp")
    split = deps.analyze(softmax_split_exp())
    for a, b in zip(d.all, split.all, strict=True):
        assert (a.label, a.source_ref, a.sink_ref) == (b.label, b.source_ref, b.sink_ref)
        assert a.relation.is_equal(b.relation)


def test_fusion_reading_a_value_written_later_is_refused():
    d = deps.analyze(copy_then_reverse(fused=False))
    with pytest.raises(IllegalTransform) as err:
        deps.check_naive_fusion(d, copy_then_reverse(fused=True), what="fusing consume into produce")
    msg = str(err.value)
    assert msg.startswith("fusing consume into produce breaks 1 non-temporal dependence(s) of 'rev'")
    assert "flow produce -> consume on y: [N] -> { produce[i] -> consume[i' = -1 + N - i] :" in msg
    assert "witness (first violating pair): [N] -> { produce[i] -> consume[i'] :" in msg
    assert "for example: [N = 3] -> { [produce[2] -> consume[0]] }" in msg
    # The witness is the lexicographically first violating pair: the first producer that runs too late.
    v = only(deps.violated(d, copy_then_reverse(fused=True)))
    assert same(v.witness, "[N] -> { produce[i] -> consume[N - 1 - i] : N <= 2i <= N + 1 and N >= 2 }")


def test_reversed_reduce_loop_breaks_the_reduction_chain():
    d = deps.analyze(softmax_sum())
    new = softmax_sum(layout="naive_reversed_max")
    found = deps.violated(d, new)
    labels = {v.label for v in found}
    assert "flow s_max -> s_max on xmax (reduction)" in labels
    assert "output s_max -> s_max on xmax (reduction)" in labels
    chain = next(v for v in found if v.kind == "flow" and v.self_reduction)
    assert same(chain.relation, "[N, M] -> { s_max[i, j] -> s_max[i, j + 1] : 0 <= i < N and 0 <= j < M - 1 }")
    with pytest.raises(IllegalTransform, match=r"flow s_max -> s_max on xmax \(reduction\): \[N, M\] -> \{"):
        deps.check_naive_fusion(d, new)


def test_new_program_must_keep_every_block_and_domain():
    d = deps.analyze(softmax_sum())
    with pytest.raises(IllegalTransform, match="has no block 's_max'"):
        deps.violated(d, copy_then_reverse(fused=False))
    with pytest.raises(IllegalTransform, match="block 's_max' changed its iteration domain"):
        deps.violated(d, softmax_sum(sizes=("N", 4)))


def _single_block(binding, loop_extent, name: str = "b") -> Program:
    """``y[i] = x[i]`` with an explicit binding of ``i`` (bypassing the builder's checks)."""
    p = ProgramBuilder("one")
    N = p.size("N")
    x, y = p.input("x", (N,), "f32"), p.output("y", (N,), "f32")
    with p.nest(name, i=N) as (i,):
        y[i] = x[i]
    prog = p.build()
    block = prog.blocks()[0]
    li = Var("l")
    new_block = block.replace(bindings=(binding(li, N),))
    return prog.replace(body=Loop(li, loop_extent(N), new_block))


def test_instances_run_exactly_once():
    with pytest.raises(IRError, match=r"block 'b': instances .* are never executed"):
        deps.analyze(_single_block(lambda li, n: li * 2, lambda n: n))
    with pytest.raises(IRError, match=r"block 'b': some instances run at two loop points"):
        deps.analyze(_single_block(lambda li, n: li // 2, lambda n: n * 2))
    d = deps.analyze(_single_block(lambda li, n: li, lambda n: n))
    with pytest.raises(IllegalTransform, match=r"program 'one': block 'b': instances"):
        deps.violated(d, _single_block(lambda li, n: li * 2, lambda n: n))


def test_non_affine_binding_names_the_block():
    prog = _single_block(lambda li, n: li, lambda n: n)
    block = prog.blocks()[0].replace(bindings=(Var("l") * Var("l"),))
    with pytest.raises(NonAffineIndex, match=r"block 'b', binding of 'i': .* multiplies two non-constant terms"):
        deps.analyze(prog.replace(body=Loop(Var("l"), Var("N"), block)))


def test_isl_keywords_as_names():
    p = ProgramBuilder("kw")
    mod = p.size("mod")
    x, y = p.input("x", (mod,), "f32"), p.output("y", (mod,), "f32")
    with p.loop("floor", mod) as lf, p.block("max", min=spatial(mod, lf)) as (i,):
        y[i] = x[i]
    d = deps.analyze(p.build())
    assert str(d.domains["max"]) == "[mod] -> { max[min] : 0 <= min < mod }"


def test_between_rejects_unknown_names():
    d = deps.analyze(softmax_sum())
    with pytest.raises(PolyfuseError, match="has no block 'nope'"):
        d.between("s_max", "nope")
    with pytest.raises(PolyfuseError, match="kind 'true'"):
        d.between("s_max", "s_exp", kind="true")


def test_describe_lists_blocks_and_marks_temporal_dependences():
    text = deps.describe(softmax_sum())
    assert text.splitlines()[0] == "program softmax_sum [N, M]"
    assert "  s_max: reduction (max over j)" in text
    assert "    s_exp__r1: read xmax[i]" in text
    assert "  flow s_max -> s_exp on xmax (temporal) via s_max__w -> s_exp__r1: [N, M] -> {" in text
    assert "  flow s_exp -> s_sum on xexp via s_exp__w -> s_sum__r1: [N, M] -> {" in text
    assert "reduction self-dependences:" in text


# ----------------------------------------------------------------- performance


def test_attention_like_analysis_is_fast():
    prog = attention_like()
    start = time.perf_counter()
    d = deps.analyze(prog)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"analysis took {elapsed:.2f} s"
    assert len(d.domains) == 8
    assert [x.label for x in d.temporal] == [
        "flow qk -> scale on score (temporal)",
        "flow rmax -> pexp on m (temporal)",
        "flow rsum -> norm on s (temporal)",
        "flow pv -> norm on o (temporal)",
    ]


def test_store_without_loops_is_scheduled():
    p = ProgramBuilder("scalar")
    x, y = p.input("x", (1,), "f32"), p.output("y", (1,), "f32")
    with p.block("only", i=spatial(1, 0)) as (i,):
        y[i] = x[i]
    d = deps.analyze(p.build())
    assert same(d.schedule["only"], "{ only[0] -> [0] }")


def test_hand_built_block_without_builder():
    i = Var("i")
    x = ProgramBuilder("tmp").input("x", (4,), "f32")
    y = ProgramBuilder("tmp").output("y", (4,), "f32")
    block = Block("copy", (IterVar(i, Var("n")),), (Var("l"),), Store(y, (i,), x[i]))
    prog = Program("hand", (), (x, y), Loop(Var("l"), Var("n"), block))
    with pytest.raises(NonAffineIndex, match="'n', which is not in scope"):
        deps.analyze(prog)
