"""Placement primitives: compute_at, reverse_compute_at, compute_inline, reverse_compute_inline,
cache_read, cache_write, set_scope — expected IR, results equal to the original program, and
refusals whose messages name the block, loop, tensor or dependence."""

from __future__ import annotations

import numpy as np
import pytest

from ir_programs import softmax_sum
from polyfuse.errors import IllegalTransform
from polyfuse.ir import Program, ProgramBuilder, cast, exp, interpret, maximum, reduce
from polyfuse.ir.printer import program_from_source
from polyfuse.ir.stmt import Block, Loop
from polyfuse.transforms import Schedule
from polyfuse.transforms.cache import cache_read, cache_write, set_scope
from polyfuse.transforms.compute_at import compute_at, naive_reverse_compute_at, reverse_compute_at
from polyfuse.transforms.inline import compute_inline, reverse_compute_inline
from polyfuse.transforms.split import split
from polyfuse.transforms.tree import loops_of

# ----------------------------------------------------------------- helpers


def random_inputs(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in program.inputs:
        shape = tuple(int(d.value) for d in t.shape)  # type: ignore[attr-defined]
        out[t.name] = rng.uniform(0.5, 2.0, size=shape).astype(t.dtype.numpy)
    return out


def assert_same_results(before: Program, after: Program, sizes: dict[str, int] | None = None) -> None:
    """Both programs give bit-identical outputs on random inputs (sizes bound if symbolic)."""
    if sizes:
        before, after = before.bind(**sizes), after.bind(**sizes)
    inputs = random_inputs(before)
    want, got = interpret(before, inputs), interpret(after, inputs)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"output {name!r}")


def loop_names(program: Program, block: str) -> list[str]:
    return [lp.var.name for lp in loops_of(program, block)]


def bindings(program: Program, block: str) -> list[str]:
    return [str(b) for b in program.block(block).bindings]


def round_trips(program: Program) -> bool:
    return program_from_source(str(program)) == program


def scale_then_rowsum(n: int = 10, m: int = 6) -> Program:
    """t = 2·x; y[i] = Σ_j t[i, j]."""
    p = ProgramBuilder("scale_rowsum")
    x = p.input("x", (n, m), "f32")
    t = p.temp("t", (n, m), "f32")
    y = p.output("y", (n,), "f32")
    with p.nest("scale", i=n, j=m) as (i, j):
        t[i, j] = x[i, j] * 2.0
    with p.nest("rowsum", i=n, j=reduce(m)) as (i, j):
        y[i] = y[i] + t[i, j]
    return p.build()


def rowsum_then_divide(n: int = 5, m: int = 7) -> Program:
    """s[i] = Σ_j x[i, j]; y[i, k] = x[i, k] / s[i]: a reduction as the producer."""
    p = ProgramBuilder("normalize")
    x = p.input("x", (n, m), "f32")
    s = p.temp("s", (n,), "f32")
    y = p.output("y", (n, m), "f32")
    with p.nest("rowsum", i=n, j=reduce(m)) as (i, j):
        s[i] = s[i] + x[i, j]
    with p.nest("divide", i=n, k=m) as (i, k):
        y[i, k] = x[i, k] / s[i]
    return p.build()


def score_max_exp(n: int = 4, m: int = 10) -> Program:
    """s = 2·x; m = max_j s; e = exp(s - m); y = Σ_j e — a score feeding a cascade of reductions."""
    p = ProgramBuilder("score_max_exp")
    x = p.input("x", (n, m), "f32")
    s, mx = p.temp("s", (n, m), "f32"), p.temp("m", (n,), "f32")
    e, y = p.temp("e", (n, m), "f32"), p.output("y", (n,), "f32")
    with p.nest("sc", i=n, j=m) as (i, j):
        s[i, j] = x[i, j] * 2.0
    with p.nest("s_max", i=n, j=reduce(m)) as (i, j):
        mx[i] = maximum(mx[i], s[i, j])
    with p.nest("s_exp", i=n, j=m) as (i, j):
        e[i, j] = exp(s[i, j] - mx[i])
    with p.nest("s_sum", i=n, j=reduce(m)) as (i, j):
        y[i] = y[i] + e[i, j]
    return p.build()


def stencil(n: int = 8) -> Program:
    """t = 2·x; y[i] = t[i] + t[i + 1]: neighbouring iterations share t."""
    p = ProgramBuilder("stencil")
    x = p.input("x", (n,), "f32")
    t = p.temp("t", (n,), "f32")
    y = p.output("y", (n - 1,), "f32")
    with p.nest("double", i=n) as (i,):
        t[i] = x[i] * 2.0
    with p.nest("pairs", i=n - 1) as (i,):
        y[i] = t[i] + t[i + 1]
    return p.build()


# ----------------------------------------------------------------- compute_at


def test_compute_at_symbolic_row_loop_gets_full_row():
    p = softmax_sum()
    new = compute_at(p, block="s_exp", loop_block="s_sum", loop="i")
    assert loop_names(new, "s_exp") == ["i", "ax0"]
    assert bindings(new, "s_exp") == ["i", "ax0"]
    assert str(loops_of(new, "s_exp")[1].extent) == "M"
    # s_exp now sits in s_sum's row loop, before the j loop that reads it
    row = loops_of(new, "s_sum")[0]
    assert [type(s).__name__ for s in row.body.stmts] == ["Loop", "Loop"]  # type: ignore[attr-defined]
    assert round_trips(new)
    assert_same_results(p, new, {"N": 3, "M": 5})


def test_compute_at_partial_tile_uses_full_tile_box_and_guard():
    p = split(scale_then_rowsum(10, 6), block="rowsum", loop="i", factors=[None, 4])
    new = compute_at(p, block="scale", loop_block="rowsum", loop="i_0")
    assert loop_names(new, "scale") == ["i_0", "ax0", "ax1"]
    assert bindings(new, "scale") == ["i_0 * 4 + ax0", "ax1"]
    assert [str(lp.extent) for lp in loops_of(new, "scale")] == ["3", "4", "6"]
    assert "with p.block(\"scale\", i=spatial(10, i_0 * 4 + ax0), j=spatial(6, ax1))" in str(new)
    assert_same_results(p, new)


def test_compute_at_reduction_producer_keeps_its_reduce_range():
    p = rowsum_then_divide(5, 7)
    new = compute_at(p, block="rowsum", loop_block="divide", loop="i")
    assert loop_names(new, "rowsum") == ["i", "ax0"]
    assert bindings(new, "rowsum") == ["i", "ax0"]
    assert str(loops_of(new, "rowsum")[1].extent) == "7"
    assert_same_results(p, new)


def test_compute_at_refuses_overlapping_regions_of_a_stencil():
    with pytest.raises(IllegalTransform) as err:
        compute_at(stencil(), block="double", loop_block="pairs", loop="i")
    msg = str(err.value)
    assert "block 'double'" in msg and "loop 'i'" in msg and "overlap" in msg and "more than once" in msg


def test_compute_at_refuses_when_another_reader_runs_before_the_new_position():
    p = ProgramBuilder("two_readers")
    x = p.input("x", (6,), "f32")
    t = p.temp("t", (6,), "f32")
    z, y = p.output("z", (6,), "f32"), p.output("y", (6,), "f32")
    with p.nest("P", i=6) as (i,):
        t[i] = x[i] * 2.0
    with p.nest("D", i=6) as (i,):
        z[i] = t[i] + 1.0
    with p.nest("C", i=6) as (i,):
        y[i] = t[i] * 3.0
    with pytest.raises(IllegalTransform) as err:
        compute_at(p.build(), block="P", loop_block="C", loop="i")
    msg = str(err.value)
    assert "compute_at of block 'P' under loop 'i'" in msg
    assert "flow P -> D on t" in msg and "witness" in msg


def test_compute_at_refuses_a_loop_whose_blocks_run_before_the_producer():
    """R reads the old t (from A) before P overwrites it: P under R's loop would feed R its value."""
    p = ProgramBuilder("overwrite")
    x = p.input("x", (6,), "f32")
    t = p.temp("t", (6,), "f32")
    y, z = p.output("y", (6,), "f32"), p.output("z", (6,), "f32")
    with p.nest("A", i=6) as (i,):
        t[i] = x[i]
    with p.nest("R", i=6) as (i,):
        y[i] = t[i] + 1.0
    with p.nest("P", i=6) as (i,):
        t[i] = x[i] * 2.0
    with p.nest("C", i=6) as (i,):
        z[i] = t[i] * 3.0
    with pytest.raises(IllegalTransform) as err:
        compute_at(p.build(), block="P", loop_block="R", loop="i")
    msg = str(err.value)
    assert "anti R -> P on t" in msg and "witness" in msg


def test_compute_at_refuses_when_readers_under_the_loop_need_only_part_of_the_producer():
    p = ProgramBuilder("partial")
    x = p.input("x", (8,), "f32")
    t = p.temp("t", (8,), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("P", i=8) as (i,):
        t[i] = x[i] * 2.0
    with p.nest("C", i=4) as (i,):
        y[i] = t[i]
    with pytest.raises(IllegalTransform) as err:
        compute_at(p.build(), block="P", loop_block="C", loop="i")
    assert "never run" in str(err.value) and "block 'P'" in str(err.value)


def test_compute_at_refuses_a_loop_without_readers_and_unknown_handles():
    p = softmax_sum()
    with pytest.raises(IllegalTransform, match="no block under loop 'i' reads tensor 'xexp'"):
        compute_at(p, block="s_exp", loop_block="s_max", loop="i")
    with pytest.raises(IllegalTransform, match="not inside a loop named 'k'"):
        compute_at(p, block="s_exp", loop_block="s_sum", loop="k")
    with pytest.raises(IllegalTransform, match="its own"):
        compute_at(p, block="s_exp", loop_block="s_exp", loop="i")


# ----------------------------------------------------------------- reverse_compute_at


def test_reverse_compute_at_row_loop():
    p = softmax_sum()
    new = reverse_compute_at(p, block="s_exp", loop_block="s_max", loop="i")
    assert loop_names(new, "s_exp") == ["i", "ax0"]
    row = loops_of(new, "s_max")[0]
    # placed after s_max's j loop, the last writer of xmax in the row loop
    assert [s.body.name if isinstance(s.body, Block) else s.var.name  # type: ignore[attr-defined]
            for s in row.body.stmts] == ["s_max", "s_exp"]  # type: ignore[attr-defined]
    assert_same_results(p, new, {"N": 3, "M": 4})


def test_reverse_compute_at_cuts_a_reduction_to_the_producer_tile():
    p = split(score_max_exp(4, 10), block="sc", loop="j", factors=[None, 4])
    new = reverse_compute_at(p, block="s_max", loop_block="sc", loop="j_0")
    assert loop_names(new, "s_max") == ["i", "j_0", "ax0"]
    assert bindings(new, "s_max") == ["i", "j_0 * 4 + ax0"]
    assert new.block("s_max").iters[1].is_reduce
    assert_same_results(p, new)


def test_reverse_compute_at_refuses_reading_a_reduction_before_it_is_final():
    p = reverse_compute_at(score_max_exp(), block="s_max", loop_block="sc", loop="j")
    with pytest.raises(IllegalTransform) as err:
        reverse_compute_at(p, block="s_exp", loop_block="sc", loop="j")
    msg = str(err.value)
    assert "reverse_compute_at of block 's_exp' under loop 'j'" in msg
    assert "flow s_max -> s_exp on m (temporal)" in msg and "witness" in msg


def test_naive_reverse_compute_at_returns_the_broken_temporal_dependences():
    p = reverse_compute_at(score_max_exp(), block="s_max", loop_block="sc", loop="j")
    new, broken = naive_reverse_compute_at(p, block="s_exp", loop_block="sc", loop="j")
    assert broken and all(d.temporal for d in broken)
    assert {d.label for d in broken} == {"flow s_max -> s_exp on m (temporal)"}
    assert all(d.witness is not None for d in broken)
    assert loop_names(new, "s_exp") == ["i", "j"]
    assert reverse_compute_at(p, block="s_exp", loop_block="sc", loop="j", check="naive") == new
    inputs = random_inputs(p)  # the early read is real: e uses partial maxima until a repair
    assert not np.array_equal(interpret(new, inputs)["y"], interpret(p, inputs)["y"])


def test_reverse_compute_at_refuses_consumers_spanning_two_iterations_and_strangers():
    with pytest.raises(IllegalTransform) as err:
        reverse_compute_at(stencil(), block="pairs", loop_block="double", loop="i")
    assert "block 'pairs'" in str(err.value) and "single iteration" in str(err.value)
    with pytest.raises(IllegalTransform, match="no block under loop 'i' writes a tensor that 's_max' reads"):
        reverse_compute_at(softmax_sum(), block="s_max", loop_block="s_sum", loop="i")
    with pytest.raises(IllegalTransform, match="check must be"):
        reverse_compute_at(softmax_sum(), block="s_exp", loop_block="s_max", loop="i", check="loose")


# ----------------------------------------------------------------- compute_inline


def test_compute_inline_substitutes_and_removes_the_tensor():
    p = softmax_sum()
    new = compute_inline(p, block="s_exp")
    assert [b.name for b in new.blocks()] == ["s_max", "s_sum"]
    assert "xexp" not in {t.name for t in new.tensors}
    assert "xsum[i] = xsum[i] + exp(inp[i, j] - xmax[i])" in str(new)
    assert_same_results(p, new, {"N": 3, "M": 4})


def test_compute_inline_maps_store_indices_to_read_indices():
    p = ProgramBuilder("transpose")
    x = p.input("x", (4, 5), "f32")
    t = p.temp("t", (5, 4), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("P", j=5, i=4) as (j, i):
        t[j, i] = x[i, j] * 2.0
    with p.nest("C", i=4) as (i,):
        y[i] = t[i + 1, i] + t[0, i]
    prog = p.build()
    new = compute_inline(prog, block="P")
    assert "y[i] = x[i, i + 1] * 2.0 + x[i, 0] * 2.0" in str(new)
    assert_same_results(prog, new)


def test_compute_inline_refuses_reductions_outputs_and_stores_at_offsets():
    with pytest.raises(IllegalTransform, match=r"block 's_max' is a reduction \(max over j\)"):
        compute_inline(softmax_sum(), block="s_max")
    with pytest.raises(IllegalTransform, match="block 's_sum' is a reduction"):
        compute_inline(softmax_sum(), block="s_sum")
    p = ProgramBuilder("outs")
    x = p.input("x", (4,), "f32")
    t, y = p.temp("t", (5,), "f32"), p.output("y", (4,), "f32")
    with p.nest("shift", i=4) as (i,):
        t[i + 1] = x[i]
    with p.nest("copy", i=4) as (i,):
        y[i] = t[i + 1]
    prog = p.build()
    with pytest.raises(IllegalTransform, match=r"block 'shift' stores t\[i \+ 1\]"):
        compute_inline(prog, block="shift")
    with pytest.raises(IllegalTransform, match="block 'copy' writes output tensor 'y'"):
        compute_inline(prog, block="copy")


def test_compute_inline_refuses_when_an_input_of_the_block_changes_before_the_read():
    p = ProgramBuilder("clobber")
    x = p.input("x", (4,), "f32")
    a, t = p.temp("a", (4,), "f32"), p.temp("t", (4,), "f32")
    y = p.output("y", (4,), "f32")
    with p.nest("A", i=4) as (i,):
        a[i] = x[i] + 1.0
    with p.nest("P", i=4) as (i,):
        t[i] = a[i] * 2.0
    with p.nest("W", i=4) as (i,):
        a[i] = x[i] * 0.0
    with p.nest("C", i=4) as (i,):
        y[i] = t[i] + a[i]
    with pytest.raises(IllegalTransform) as err:
        compute_inline(p.build(), block="P")
    msg = str(err.value)
    assert "block 'W' writes tensor 'a'" in msg and "before 'C'" in msg and "witness" in msg


def test_compute_inline_refuses_a_read_that_comes_before_the_write():
    p = ProgramBuilder("early")
    x = p.input("x", (4,), "f32")
    t, y = p.temp("t", (4,), "f32"), p.output("y", (4,), "f32")
    with p.nest("C", i=4) as (i,):
        y[i] = t[i]
    with p.nest("P", i=4) as (i,):
        t[i] = x[i]
    with pytest.raises(IllegalTransform, match=r"read t\[i\] of block 'C' .* does not read a value written by 'P'"):
        compute_inline(p.build(), block="P")


# ----------------------------------------------------------------- reverse_compute_inline


def norm_then_cast(broadcast: bool = False) -> Program:
    """n = x / s; y = f16(2n) transposed (or a broadcast of n's first column)."""
    p = ProgramBuilder("norm_cast")
    x, s = p.input("x", (4, 6), "f32"), p.input("s", (4,), "f32")
    n = p.temp("n", (4, 6), "f32")
    y = p.output("y", (6, 4), "f16")
    with p.nest("norm", i=4, j=6) as (i, j):
        n[i, j] = x[i, j] / s[i]
    with p.nest("cast", j=6, i=4) as (j, i):
        y[j, i] = cast("f16", n[i, 0 if broadcast else j] * 2.0)
    return p.build()


def test_reverse_compute_inline_merges_the_epilogue_into_the_producer():
    p = norm_then_cast()
    new = reverse_compute_inline(p, block="cast")
    assert [b.name for b in new.blocks()] == ["norm"]
    assert "n" not in {t.name for t in new.tensors}
    assert 'y[j, i] = cast("f16", x[i, j] / s[i] * 2.0)' in str(new)
    assert_same_results(p, new)


def test_reverse_compute_inline_refusals_name_the_reason():
    with pytest.raises(IllegalTransform, match="do not correspond one to one through 'n'"):
        reverse_compute_inline(norm_then_cast(broadcast=True), block="cast")
    with pytest.raises(IllegalTransform, match="'s_sum' is a reduction"):
        reverse_compute_inline(softmax_sum(), block="s_sum")
    p = ProgramBuilder("after_reduction")
    x = p.input("x", (4, 3), "f32")
    s, y = p.temp("s", (4,), "f32"), p.output("y", (4,), "f16")
    with p.nest("total", i=4, j=reduce(3)) as (i, j):
        s[i] = s[i] + x[i, j]
    with p.nest("half", i=4) as (i,):
        y[i] = cast("f16", s[i])
    with pytest.raises(IllegalTransform, match=r"s \(by total, a reduction\)"):
        reverse_compute_inline(p.build(), block="half")


def test_reverse_compute_inline_refuses_when_the_moved_write_would_be_seen_early():
    p = ProgramBuilder("seen_early")
    x = p.input("x", (4,), "f32")
    n = p.temp("n", (4,), "f32")
    y, z = p.output("y", (4,), "f32"), p.output("z", (4,), "f32")
    with p.nest("zero", i=4) as (i,):
        y[i] = x[i] * 0.0
    with p.nest("norm", i=4) as (i,):
        n[i] = x[i] / 2.0
    with p.nest("peek", i=4) as (i,):
        z[i] = y[i] + 1.0
    with p.nest("store", i=4) as (i,):
        y[i] = n[i]
    with pytest.raises(IllegalTransform) as err:
        reverse_compute_inline(p.build(), block="store")
    msg = str(err.value)
    assert "block 'peek' reads tensor 'y'" in msg and "after 'norm' and before 'store'" in msg and "witness" in msg


# ----------------------------------------------------------------- cache_read / cache_write / set_scope


def test_cache_read_by_index_copies_the_region_before_the_nest():
    p = softmax_sum()
    new, name = cache_read(p, block="s_exp", tensor=0, scope="shared")
    assert name == "inp_shared"
    assert new.tensor("inp_shared").scope == "shared"
    assert [b.name for b in new.blocks()] == ["s_max", "inp_shared", "s_exp", "s_sum"]
    text = str(new)
    assert 'with p.nest("inp_shared", i=N, j=M) as (i, j):\n        inp_shared[i, j] = inp[i, j]' in text
    assert "xexp[i, j] = exp(inp_shared[i, j] - xmax[i])" in text
    assert "xmax[i] = maximum(xmax[i], inp[i, j])" in text  # other readers keep the original
    assert round_trips(new)
    assert_same_results(p, new, {"N": 3, "M": 4})


def test_cache_read_then_compute_at_stages_one_row_per_iteration():
    p = softmax_sum()
    staged, name = cache_read(p, block="s_exp", tensor="inp", scope="shared")
    new = compute_at(staged, block=name, loop_block="s_exp", loop="i")
    assert loop_names(new, name) == ["i", "ax0"]
    assert bindings(new, name) == ["i", "ax0"]
    assert_same_results(p, new, {"N": 3, "M": 4})


def test_cache_read_refusals():
    p = softmax_sum()
    with pytest.raises(IllegalTransform, match="does not read tensor 'xsum'; it reads inp, xmax"):
        cache_read(p, block="s_exp", tensor="xsum", scope="shared")
    with pytest.raises(IllegalTransform, match="index 2 is out of range"):
        cache_read(p, block="s_exp", tensor=2, scope="shared")
    with pytest.raises(IllegalTransform, match="scope must be one of"):
        cache_read(p, block="s_exp", tensor=0, scope="texture")
    fused = reverse_compute_at(p, block="s_exp", loop_block="s_max", loop="i")
    with pytest.raises(IllegalTransform, match="s_max write.* 'xmax' in the same loop nest as 's_exp'"):
        cache_read(fused, block="s_exp", tensor="xmax", scope="local")


def test_cache_write_accumulates_locally_and_copies_back():
    p = softmax_sum()
    new, name = cache_write(p, block="s_sum", scope="local")
    assert name == "xsum_local"
    assert [b.name for b in new.blocks()] == ["s_max", "s_exp", "s_sum", "xsum_local"]
    text = str(new)
    assert "xsum_local[i] = xsum_local[i] + xexp[i, j]" in text
    assert 'with p.nest("xsum_local", i=N) as (i,):\n        xsum[i] = xsum_local[i]' in text
    assert_same_results(p, new, {"N": 3, "M": 4})


def test_cache_write_of_a_decomposed_reduction_starts_the_cache_from_the_init():
    """Without its init the reduction accumulates into the tensor's current value (the init block's
    zeros): the cache is filled from it first, or it would accumulate into uninitialised memory."""
    p = softmax_sum()
    sch = Schedule(p)
    init = sch.decompose_reduction("s_sum", sch.loop("s_sum", "i"))
    name = sch.cache_write("s_sum", "local")
    assert [b.name for b in sch.program.blocks()] == ["s_max", "s_exp", init, f"{name}_in", "s_sum", name]
    assert 'with p.nest("xsum_local_in", i=N) as (i,):\n        xsum_local[i] = xsum[i]' in str(sch.program)
    assert_same_results(p, sch.program, {"N": 3, "M": 4})
    assert round_trips(sch.program)


def test_cache_write_refuses_a_strided_write_and_neighbours_in_the_nest():
    p = ProgramBuilder("strided")
    x = p.input("x", (4,), "f32")
    y = p.output("y", (8,), "f32")
    with p.nest("even", i=4) as (i,):
        y[i * 2] = x[i]
    with p.nest("odd", i=4) as (i,):
        y[i * 2 + 1] = x[i]
    with pytest.raises(IllegalTransform, match="that 'even' writes are not a box"):
        cache_write(p.build(), block="even", scope="local")
    fused = reverse_compute_at(softmax_sum(), block="s_exp", loop_block="s_max", loop="i")
    with pytest.raises(IllegalTransform, match="s_exp access.* 'xmax' in the same loop nest as 's_max'"):
        cache_write(fused, block="s_max", scope="local")


def test_set_scope_moves_temps_only():
    p = softmax_sum()
    new = set_scope(p, block="s_exp", scope="shared")
    assert new.tensor("xexp").scope == "shared"
    assert 'xexp = p.temp("xexp", (N, M), "f32", scope="shared")' in str(new)
    assert_same_results(p, new, {"N": 2, "M": 3})
    with pytest.raises(IllegalTransform, match="'xsum' is a program output"):
        set_scope(p, block="s_sum", scope="shared")


# ----------------------------------------------------------------- the Schedule facade


def test_facade_records_placement_steps_and_replays_them():
    p = softmax_sum()
    sch = Schedule(p)
    staged = sch.cache_read("s_exp", 0, "shared")
    sch.compute_at(staged, sch.loop("s_exp", "i"))
    sch.set_scope("s_exp", "local")
    sch.reverse_compute_at("s_sum", sch.loop("s_exp", "i"))
    sch.cache_write("s_max", "local")
    sch.compute_inline("s_exp")
    text = sch.trace.python()
    assert text.splitlines() == [
        "sch.cache_read(block='s_exp', tensor=0, scope='shared')",
        "sch.compute_at(block='inp_shared', loop=sch.loop(\"s_exp\", \"i\"))",
        "sch.set_scope(block='s_exp', scope='local')",
        "sch.reverse_compute_at(block='s_sum', loop=sch.loop(\"s_exp\", \"i\"))",
        "sch.cache_write(block='s_max', scope='local')",
        "sch.compute_inline(block='s_exp')",
    ]
    assert Schedule(p).replay(sch.trace.to_json()).program == sch.program
    assert Schedule(p).exec_python(text).program == sch.program
    assert_same_results(p, sch.program, {"N": 3, "M": 5})


def test_facade_reverse_compute_inline_round_trip():
    p = norm_then_cast()
    sch = Schedule(p)
    sch.reverse_compute_inline("cast")
    assert Schedule(p).replay(sch.trace.to_json()).program == sch.program
    assert isinstance(loops_of(sch.program, "norm")[0], Loop)
