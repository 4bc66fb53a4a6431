"""The loop-nest builder, the tensor-expression layer and their error messages."""

from __future__ import annotations

import math

import pytest

from ir_programs import softmax_sum
from polyfuse.errors import IRError, NonAffineIndex, PolyfuseError
from polyfuse.ir import (
    INF, BinOp, Block, Cast, Load, Loop, ProgramBuilder, Var, builtin_reducer, cast, const, exp, f16, f32,
    make_reducer, maximum, reduce, select, spatial, te,
)


def test_figure_1a_structure():
    prog = softmax_sum()
    assert [b.name for b in prog.blocks()] == ["s_max", "s_exp", "s_sum"]
    assert [p.name for p in prog.params] == ["N", "M"]
    s_max, s_exp, s_sum = prog.blocks()
    assert s_max.reducer == builtin_reducer("max", f32) and s_max.init == const(-INF, f32)
    assert s_sum.reducer == builtin_reducer("sum", f32) and s_sum.init == const(0.0, f32)
    assert s_exp.reducer is None and s_exp.init is None
    assert s_sum.reduce_term() == Load(prog.tensor("xexp"), (Var("i"), Var("j")))
    assert [iv.kind for iv in s_max.iters] == ["spatial", "reduce"]
    assert isinstance(prog.body.stmts[0], Loop) and prog.body.stmts[0].var == Var("i")


def test_implicit_casts_are_explicit_nodes():
    p = ProgramBuilder("casts")
    x = p.input("x", (4,), "f16")
    y = p.output("y", (4,), "f16")
    with p.nest("s", i=4) as (i,):
        y[i] = x[i] * 2.0 + cast("f32", x[i])
    value = p.build().block("s").store.value
    assert isinstance(value, Cast) and value.dtype == f16
    assert isinstance(value.value, BinOp) and value.value.dtype == f32


@pytest.mark.parametrize("index, fragment", [
    (lambda i, j, y: (i * j, j), "index 0: i * j is not affine: it multiplies two non-constant terms"),
    (lambda i, j, y: (i, j // i), "index 1"),
    (lambda i, j, y: (y[i] + 1, j), "index 0: yidx[i] + 1 is not affine"),  # a gather is a bare load
])
def test_non_affine_index_names_tensor_and_index(index, fragment):
    p = ProgramBuilder("bad")
    x = p.input("x", (4, 4), "f32")
    y = p.input("yidx", (4,), "i32")
    out = p.output("out", (4, 4), "f32")
    with pytest.raises(NonAffineIndex) as err:
        with p.nest("s", i=4, j=4) as (i, j):
            out[i, j] = x[index(i, j, y)]
    assert "tensor 'x'" in str(err.value) and fragment in str(err.value)


def test_index_using_variable_out_of_scope_is_refused():
    p = ProgramBuilder("scope")
    x = p.input("x", (4,), "f32")
    y = p.output("y", (4,), "f32")
    with p.loop("t", 4) as t:
        with p.block("s", i=spatial(4, t)) as (i,):
            y[i] = x[t]
    with pytest.raises(NonAffineIndex, match="block 's'.*tensor 'x'.*uses t"):
        p.build()


@pytest.mark.parametrize("make, message", [
    (lambda p, x, y: y.__setitem__(0, x[0]), "store to 'y' outside of a block"),
    (lambda p, x, y: x[1, 2], "tensor 'x' has 1 dimensions but is indexed with 2"),
])
def test_misuse_outside_blocks(make, message):
    p = ProgramBuilder("misuse")
    x = p.input("x", (4,), "f32")
    y = p.output("y", (4,), "f32")
    with pytest.raises(IRError, match=message):
        make(p, x, y)


def test_block_errors_name_the_block():
    p = ProgramBuilder("errs")
    x = p.input("x", (4, 4), "f32")
    y = p.output("y", (4,), "f32")
    with pytest.raises(IRError, match="block 'r' reduces over j .* not"):
        with p.nest("r", i=4, j=reduce(4)) as (i, j):
            y[i] = exp(x[i, j])
    with pytest.raises(IRError, match="block 'two' already stores to 'y'"):
        with p.nest("two", i=4) as (i,):
            y[i] = x[i, 0]
            y[i] = x[i, 1]
    with pytest.raises(IRError, match="block 'none' has no store"):
        with p.nest("none", i=4) as (i,):
            pass
    with pytest.raises(IRError, match="writes to input tensor 'x'"):
        q = ProgramBuilder("w")
        xi = q.input("x", (4,), "f32")
        q.output("o", (4,), "f32")
        with q.nest("s", i=4) as (i,):
            xi[i] = 1.0
        q.build()


def test_declaration_errors():
    p = ProgramBuilder("decl")
    p.input("x", (4,), "f32")
    with pytest.raises(IRError, match="tensor 'x' declared twice"):
        p.input("x", (4,), "f32")
    with pytest.raises(IRError, match="unknown dtype 'f17'"):
        p.input("z", (4,), "f17")
    with pytest.raises(IRError, match="shape dimension 0 is 0"):
        p.temp("t", (0,), "f32")
    with pytest.raises(IRError, match="no output tensor"):
        q = ProgramBuilder("noout")
        a = q.input("a", (2,), "f32")
        t = q.temp("t", (2,), "f32")
        with q.nest("s", i=2) as (i,):
            t[i] = a[i]
        q.build()


def test_python_truthiness_of_expressions_is_refused():
    i = Var("i")
    with pytest.raises(IRError, match="select"):
        bool(i < 3)


def test_custom_reducer_and_init():
    p = ProgramBuilder("custom")
    x = p.input("x", (3, 5), "f32")
    y = p.output("y", (3,), "f32")
    absmax = make_reducer("absmax", lambda a, b: maximum(abs(a), abs(b)), identity=0.0, dtype="f32")
    with p.nest("r", reducer=absmax, init=1.0, i=3, j=reduce(5)) as (i, j):
        y[i] = absmax.apply(y[i], x[i, j])
    blk = p.build().block("r")
    assert blk.reducer is absmax and blk.init == const(1.0, f32)
    assert blk.reduce_term() == Load(x, (Var("i"), Var("j")))


def test_sizes_bind_to_integers():
    prog = softmax_sum().bind(N=3, M=5)
    assert prog.params == ()
    assert prog.tensor("inp").shape == (const(3), const(5))
    with pytest.raises(PolyfuseError, match="no size parameter K"):
        softmax_sum().bind(K=2)


def test_te_attention_reads_like_the_paper():
    B, H, S, D = 1, 2, 8, 4
    q = te.placeholder((B, H, S, D), "f16", name="q")
    k = te.placeholder((B, H, S, D), "f16", name="k")
    v = te.placeholder((B, H, S, D), "f16", name="v")
    p = te.batch_matmul(q, k, trans_b=True, out_dtype="f32", name="qk")
    score = te.compute(p.shape, lambda b, h, i, j: te.if_then_else(j > i, -math.inf, p(b, h, i, j) * 0.5),
                       name="score")
    j = te.reduce_axis((0, S), name="j")
    m = te.compute((B, H, S), lambda b, h, i: te.max(score(b, h, i, j), axis=j), name="row_max")
    e = te.compute(p.shape, lambda b, h, i, j: exp(score(b, h, i, j) - m(b, h, i)), name="p_exp")
    s = te.compute((B, H, S), lambda b, h, i: te.sum(e(b, h, i, j), axis=j), name="row_sum")
    o = te.batch_matmul(e, v, out_dtype="f32", name="pv")
    out = te.compute(o.shape, lambda b, h, i, d: cast("f16", o(b, h, i, d) / s(b, h, i)), name="out")
    prog = te.create_program([out], name="attention")
    assert [b.name for b in prog.blocks()] == ["qk", "score", "row_max", "p_exp", "row_sum", "pv", "out"]
    assert [t.name for t in prog.inputs] == ["q", "k", "v"] and [t.name for t in prog.outputs] == ["out"]
    assert prog.block("row_max").reducer.name == "max"
    assert all(isinstance(b, Block) for b in prog.blocks())
    # every reference to the output tensor carries the output role
    assert prog.block("out").store.tensor.role == "output"


def test_te_reduction_must_be_whole_body():
    x = te.placeholder((4, 4), "f32", name="x")
    j = te.reduce_axis(4, name="j")
    with pytest.raises(IRError, match="whole body"):
        te.compute((4,), lambda i: te.sum(x(i, j), axis=j) + 1.0, name="bad")


def test_select_needs_boolean_condition():
    with pytest.raises(IRError, match="boolean condition"):
        select(Var("i") + 1, 1.0, 2.0)
