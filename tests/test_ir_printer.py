"""The printer prints valid builder Python that rebuilds an equal program."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ir_programs import prefix_sum, softmax_sum, softmax_sum_split
from polyfuse.ir import (
    INF, ProgramBuilder, cast, const, eq, exp, log, make_reducer, maximum, minimum, ne, reduce, select, spatial,
    sqrt, tanh,
)
from polyfuse.ir.printer import print_program, program_from_source


def roundtrip(prog):
    text = print_program(prog)
    again = program_from_source(text)
    assert again == prog, text
    assert print_program(again) == text
    return text


def test_figure_1a_prints_as_builder_code():
    text = roundtrip(softmax_sum())
    assert 'with p.nest("s_max", i=N, j=reduce(M)) as (i, j):' in text
    assert "xmax[i] = maximum(xmax[i], inp[i, j])" in text
    assert "xsum[i] = xsum[i] + xexp[i, j]" in text


def test_general_form_with_split_loops_and_guards():
    text = roundtrip(softmax_sum_split())
    assert 'with p.block("s_max", i=spatial(10, i0 * 4 + i1), j=reduce(6, j)) as (i, j):' in text


def test_loop_kinds_threads_scopes_custom_reducers_and_init():
    p = ProgramBuilder("kinds")
    x = p.input("x", (8, 16), "f16")
    acc = p.temp("acc", (8,), "f32", scope="shared")
    y = p.output("y", (8,), "bf16")
    absmax = make_reducer("absmax", lambda a, b: maximum(abs(a), abs(b)), identity=0.0, dtype="f32")
    with p.loop("bx", 2, thread="blockIdx.x") as bx:
        with p.loop("tx", 4, kind="unrolled", annotations=(("pragma", "x"),)) as tx:
            with p.loop("r", 16, kind="vectorized") as r:
                with p.block("amax", reducer=absmax, init=1.5, i=spatial(8, bx * 4 + tx), j=reduce(16, r)) as (i, j):
                    acc[i] = absmax.apply(acc[i], cast("f32", x[i, j]))
    with p.nest("out", i=8) as (i,):
        y[i] = cast("bf16", acc[i])
    roundtrip(p.build())


def test_prefix_sum_with_offsets_and_single_iteration_nest():
    roundtrip(prefix_sum())


def test_names_that_clash_with_variables_are_renamed_in_text_only():
    p = ProgramBuilder("clash")
    k = p.input("k", (4, 4), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("s", i=4, k=reduce(4)) as (i, kk):
        y[i] = y[i] + k[i, kk]
    text = roundtrip(p.build())
    assert 'k_ = p.input("k"' in text


_leaf = st.sampled_from(["x", "c0", "cneg", "cinf", "i"])


def _build(tree, x, i):
    if isinstance(tree, str):
        return {"x": x, "c0": const(1.5), "cneg": const(-2.25), "cinf": const(-INF), "i": cast("f32", i)}[tree]
    op, *args = tree
    vals = [_build(a, x, i) for a in args]
    binary = {
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b,
        "pow": lambda a, b: a ** b, "max": maximum, "min": minimum,
    }
    unary = {"exp": exp, "log": log, "sqrt": sqrt, "tanh": tanh, "neg": lambda a: -a, "abs": abs,
             "f16": lambda a: cast("f16", a)}
    if op in binary:
        return binary[op](*vals)
    if op == "select":
        return select((x < vals[0]) & ne(vals[1], x) | eq(x, 0.0), vals[0], vals[1])
    return unary[op](*vals)


_trees = st.recursive(
    _leaf,
    lambda kids: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "/", "pow", "max", "min", "select"]), kids, kids),
        st.tuples(st.sampled_from(["exp", "log", "sqrt", "tanh", "neg", "abs", "f16"]), kids),
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_trees)
def test_random_expressions_roundtrip(tree):
    p = ProgramBuilder("rand")
    xs = p.input("xs", (4,), "f32")
    out = p.output("out", (4,), "f32")
    with p.nest("s", i=4) as (i,):
        out[i] = _build(tree, xs[i], i)
    roundtrip(p.build())
