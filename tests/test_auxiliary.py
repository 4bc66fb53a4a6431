"""State repairs with auxiliary accumulators (issue #9): the polynomial-in-r terms fuse exactly,
by rolling update and by split-k update (partial states at split-local references, combined by
Chan's parallel formula), keep the two-pass program's accuracy at a large common offset, and
non-polynomial terms without a repair are still refused with the reason."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
import sympy

from polyfuse import ops, tiling
from polyfuse.pipeline import build
from polyfuse.errors import IllegalTransform, NoRepairFound
from polyfuse.ir import ProgramBuilder, Var, const, exp, interpret, maximum, reduce, spatial
from polyfuse.ir.expr import BinOp
from polyfuse.ir.visit import loads, walk_expr
from polyfuse.ops.schedules import default_schedule
from polyfuse.tiling import to_tiles
from polyfuse.transforms import Schedule
from polyfuse.transforms.repair import solve_repair

OFFSET = 1e6


def _relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref) / np.abs(ref)))


@pytest.mark.parametrize("name, key", [("variance", "var"), ("layernorm_stats", "var"), ("inertia", "inertia")])
def test_fused_keeps_two_pass_accuracy_at_a_large_offset(name, key):
    op = ops.get(name)
    program = op.program("default")
    fused = default_schedule(name, "default", program).program
    for seed in (0, 1):
        inputs = op.inputs(seed, "default", None, OFFSET)
        ref = op.reference(inputs, "default", op.sizes("default"))[key]
        unfused_err = _relative_error(interpret(program, inputs)[key], ref)
        fused_err = _relative_error(interpret(fused, inputs)[key], ref)
        assert fused_err <= 10 * unfused_err, f"{name} seed={seed}: fused {fused_err:.3g}, unfused {unfused_err:.3g}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")
@pytest.mark.parametrize("name", ["variance", "layernorm_stats"])
@pytest.mark.parametrize("length", [2, 3, 5, 7, 13])
def test_rolled_variance_at_a_large_offset_keeps_the_plain_programs_error(name, length):
    """Regression: the auxiliary term ``∂g/∂mean = -2(x - mean)/L`` was emitted as ``2·mean/L - 2·x/L`` (sympy
    distributes a number over a sum), which rounds both scaled values at the offset's magnitude: at offset 1e4 the
    rolled variance was off by 8.8e-5 (L = 7) where the plain program's error is 7e-7.  Kept factored, the
    difference is exact where the two are close and the rolled kernel's error is the plain program's."""
    op = ops.get(name)
    sizes = {**op.sizes("default"), **({"B": 5, "L": length} if name == "variance" else {"N": 5, "M": length})}
    kernel = build(default_schedule(name, "default", op.program("default", **sizes)), "cpp", sizes=sizes)
    plain = op.program("default", **sizes)
    for seed in range(3):
        inputs = op.inputs(seed, "default", sizes, 1e4)
        ref = op.reference(inputs, "default", sizes)
        fused, unfused = kernel.run(inputs), interpret(plain, inputs)
        for key in op.tolerance("default", sizes):
            fused_err = float(np.max(np.abs(fused[key].astype(np.float64) - ref[key])))
            unfused_err = float(np.max(np.abs(unfused[key].astype(np.float64) - ref[key])))
            assert fused_err <= 2 * unfused_err + 2 ** -20, \
                f"{key} seed={seed}: fused {fused_err:.3g}, plain {unfused_err:.3g}"


def test_auxiliary_terms_keep_the_difference_of_element_and_producer():
    """The Taylor coefficient of ``(x - m)²/7`` is ``-(2·(x - m)/7)``, the subtraction of the two loads first."""
    r = _solve(_chain(lambda x, m: (x - m) * (x - m) / 7.0))
    first, second = r.auxiliaries
    differences = [e for e in walk_expr(first.term) if isinstance(e, BinOp) and e.op == "-"]
    assert [sorted(ld.tensor.name for ld in loads(e)) for e in differences] == [["m", "x"]], str(first.term)
    assert str(second.g) == "1/7"


def test_one_pass_formula_loses_everything_at_the_offset():
    """What the fusion avoids: E[x²] - E[x]² in f32 at offset 1e6 is off by orders of magnitude."""
    op = ops.get("variance")
    inputs = op.inputs(0, "default", None, OFFSET)
    x = inputs["x"]
    one_pass = (x * x).mean(axis=1, dtype=np.float32) - x.mean(axis=1, dtype=np.float32) ** 2
    ref = op.reference(inputs, "default", op.sizes("default"))["var"]
    assert _relative_error(one_pass, ref) > 10.0


def _solve(block):
    term = block.reduce_term()
    producers = [ld for ld in loads(term) if ld.tensor.name == "m"]
    return solve_repair(block.reducer, term, producers, reduce_vars={iv.var.name for iv in block.reduce_iters},
                        auxiliary=True)


def _chain(consumer_term):
    return _chain_program(consumer_term).block("s_s")


def _chain_program(consumer_term, producer="sum", finite=False):
    p = ProgramBuilder("chain")
    x = p.input("x", (4, 8), "f32", finite=finite)
    m = p.temp("m", (4,), "f32")
    s = p.output("s", (4,), "f32")
    with p.nest("s_m", i=4, j=reduce(8)) as (i, j):
        m[i] = m[i] + x[i, j] if producer == "sum" else maximum(m[i], x[i, j])
    with p.nest("s_s", i=4, j=reduce(8)) as (i, j):
        s[i] = s[i] + consumer_term(x[i, j], m[i])
    return p.build()


def test_cubic_term_gets_three_auxiliaries_with_a_binomial_repair():
    r = _solve(_chain(lambda x, m: (x - m) * (x - m) * (x - m)))
    assert len(r.auxiliaries) == 3
    (m,), (m2,) = r.old, r.new
    a1, a2, a3 = r.state
    d = m2 - m
    assert sympy.expand(r.h - (r.t + a1 * d + a2 * d ** 2 + a3 * d ** 3)) == 0
    assert sympy.expand(r.auxiliaries[0].repair.h - (r.t + 2 * a2 * d + 3 * a3 * d ** 2)) == 0
    assert sympy.expand(r.auxiliaries[1].repair.h - (r.t + 3 * a3 * d)) == 0
    assert "binomial" in r.cases and "no single repair" in r.cases


def test_non_polynomial_term_without_a_repair_is_refused_with_the_reason():
    with pytest.raises(NoRepairFound, match="not a polynomial in m"):
        _solve(_chain(lambda x, m: exp(x * m) + exp(x - m) * x))


def test_explain_lists_the_auxiliary_reductions(capsys):
    from polyfuse.cli.commands import fusion_text
    from polyfuse.cli.stages import Subject

    text = fusion_text(Subject.of("variance", "default", {}))
    assert "auxiliary reductions" in text and "s_var_aux1" in text
    assert "Taylor coefficient" in text and "reference point" in text


# ------------------------------------------------------------------ split-k update

SPLIT_K = {  # operator -> (producer block, its reduce loop, consumers, output)
    "variance": ("s_mean", "j", ("s_var",), "var"),
    "layernorm_stats": ("s_mean", "j", ("s_var",), "var"),
    "inertia": ("s_mass", "n", ("s_center", "s_inertia"), "inertia"),
}
SPLIT_K_CASES = [(name, splits) for name in SPLIT_K for splits in (4, 3)]  # 40 elements: 4 x 10, and 14 + 14 + 12


@functools.cache
def _split_k(name: str, splits: int) -> Schedule:
    producer, loop, consumers, _ = SPLIT_K[name]
    sch = Schedule(ops.get(name).program("default"))
    j0, _ = sch.split(sch.loop(producer, loop), [splits, None])
    for consumer in consumers:
        sch.split_k_update(consumer, j0)
    sch.compact_buffers()
    return sch


@pytest.mark.parametrize("name, splits", SPLIT_K_CASES)
def test_split_k_state_repair_matches_numpy(name, splits):
    op = ops.get(name)
    sizes = op.sizes("default")
    program = _split_k(name, splits).program
    for seed in (0, 1, 2):
        for magnitude in op.magnitudes:
            inputs = op.inputs(seed, "default", None, magnitude)
            result = ops.compare(interpret(program, inputs), op.reference(inputs, "default", sizes),
                                 op.tolerance("default", sizes))
            assert result.ok, f"{name} splits={splits} seed={seed} magnitude={magnitude}: {result.line()}"


@pytest.mark.parametrize("name, splits", SPLIT_K_CASES)
def test_split_k_keeps_two_pass_accuracy_at_a_large_offset(name, splits):
    op = ops.get(name)
    key = SPLIT_K[name][3]
    program = op.program("default")
    fused = _split_k(name, splits).program
    for seed in (0, 1):
        inputs = op.inputs(seed, "default", None, OFFSET)
        ref = op.reference(inputs, "default", op.sizes("default"))[key]
        unfused_err = _relative_error(interpret(program, inputs)[key], ref)
        fused_err = _relative_error(interpret(fused, inputs)[key], ref)
        assert fused_err <= 10 * unfused_err, f"{name} seed={seed}: fused {fused_err:.3g}, unfused {unfused_err:.3g}"


@pytest.mark.parametrize("name, splits", SPLIT_K_CASES)
def test_split_k_partial_states_are_local_and_the_combine_reads_them(name, splits):
    """One local nest per split holds X and its auxiliaries; no global auxiliary is left (the combine
    reads the partial states); a split holding fewer elements counts its share for its reference."""
    sch = _split_k(name, splits)
    consumer = SPLIT_K[name][2][-1]
    fusion = next(f for f in sch.fusions if f.consumer == consumer)
    aux = [f"{consumer}_{a.name}_rf" for a in fusion.repair.auxiliaries]
    assert fusion.repair.auxiliaries and set(aux) <= set(fusion.created)
    program = sch.program
    combine = program.block(consumer)
    partials = {ld.tensor.name for ld in loads(combine.store.value)}
    assert {program.block(a).store.tensor.name for a in aux} <= partials
    names = {t.name for t in program.tensors}
    assert not any(n.endswith(("_aux1", "_aux2")) for n in names), "a global auxiliary accumulator is dead code"
    counted = any(b.name.endswith("_seen") for b in program.blocks())
    assert counted == (name != "inertia" and splits == 3)
    if name != "inertia":
        assert fusion.notes and "reference point" in fusion.notes[0]


@pytest.mark.parametrize("name, splits", SPLIT_K_CASES)
def test_split_k_tile_program_matches_numpy(name, splits):
    op = ops.get(name)
    sizes = op.sizes("default")
    tiles = to_tiles(_split_k(name, splits).program)
    for magnitude in (*op.magnitudes, OFFSET):
        inputs = op.inputs(0, "default", None, magnitude)
        ref = op.reference(inputs, "default", sizes)
        got = tiling.interpret(tiles, inputs)
        if magnitude == OFFSET:
            key = SPLIT_K[name][3]
            unfused_err = _relative_error(interpret(op.program("default"), inputs)[key], ref[key])
            assert _relative_error(got[key], ref[key]) <= 10 * unfused_err
        else:
            result = ops.compare(got, ref, op.tolerance("default", sizes))
            assert result.ok, f"{name} splits={splits} magnitude={magnitude}: {result.line()}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")
@pytest.mark.parametrize("name, splits", SPLIT_K_CASES)
def test_split_k_host_cpp_matches_numpy(name, splits):
    op = ops.get(name)
    sizes = op.sizes("default")
    kernel = build(_split_k(name, splits).program, werror=True)
    for magnitude in (*op.magnitudes, OFFSET):
        inputs = op.inputs(1, "default", None, magnitude)
        ref = op.reference(inputs, "default", sizes)
        got = kernel.run(inputs)
        if magnitude == OFFSET:
            key = SPLIT_K[name][3]
            unfused_err = _relative_error(interpret(op.program("default"), inputs)[key], ref[key])
            assert _relative_error(got[key], ref[key]) <= 10 * unfused_err
        else:
            result = ops.compare(got, ref, op.tolerance("default", sizes))
            assert result.ok, f"{name} splits={splits} magnitude={magnitude}: {result.line()}"


def test_split_k_trace_replays_to_the_same_program():
    sch = _split_k("inertia", 3)
    again = Schedule(ops.get("inertia").program("default")).replay(sch.trace.to_json())
    assert again.program == sch.program


def test_split_k_combine_of_the_variance_state_is_chans_formula():
    """Σ_s h(S_s, A1_s, A2_s; r_s -> r) over two splits with their own references equals Σ (c - r)²:
    with S1 = Σ (c - r_s) and n = count, S2_s + 2(r_s - r)·S1_s + n_s·(r_s - r)² per split."""
    r = _solve(_chain(lambda x, m: (x - m) * (x - m)))
    assert "split-k combine" in r.cases and "Chan" in r.cases
    (m,), (m2,) = r.old, r.new
    splits = [[sympy.Symbol(f"c{s}{k}", real=True) for k in range(2 + s)] for s in range(2)]
    refs = [sympy.Symbol(f"r{s}", real=True) for s in range(2)]
    combined = sympy.Integer(0)
    for cs, ref in zip(splits, refs, strict=True):
        states = [sum((t.xreplace({sym: c for sym in t.free_symbols - {m}}).xreplace({m: ref}) for c in cs),
                      sympy.Integer(0)) for t in (r.g, *(a.g for a in r.auxiliaries))]
        combined += r.h.xreplace({r.t: states[0], **dict(zip(r.state, states[1:], strict=True)), m: ref})
        chan = (sum((c - ref) ** 2 for c in cs) + 2 * (ref - m2) * sum(c - ref for c in cs)
                + len(cs) * (ref - m2) ** 2)
        assert sympy.expand(sum((c - m2) ** 2 for c in cs) - chan) == 0
    everything = sum((c - m2) ** 2 for cs in splits for c in cs)
    assert sympy.expand(combined - everything) == 0


def test_split_k_of_a_non_polynomial_term_is_refused_with_the_reason():
    sch = Schedule(_chain_program(lambda x, m: exp(x * m) + exp(x - m) * x))
    j0, _ = sch.split(sch.loop("s_m", "j"), [2, None])
    with pytest.raises(NoRepairFound, match="not a polynomial in m"):
        sch.split_k_update("s_s", j0)


def _fuse_chain(program, fusion: str) -> Schedule:
    sch = Schedule(program)
    if fusion == "rolling_update":
        sch.rolling_update("s_s", sch.loop("s_m", "j"))
    else:
        j0, _ = sch.split(sch.loop("s_m", "j"), [3, None])
        sch.split_k_update("s_s", j0)
    return sch


@pytest.mark.parametrize("fusion", ["rolling_update", "split_k_update"])
def test_polynomial_in_a_max_keeps_the_empty_state_while_the_max_is_minus_inf(fusion):
    """Σ (x - max)² over finite data: the state starts where the previous max is -inf; h would compute
    0·inf there, so the empty state is kept."""
    program = _chain_program(lambda x, m: (x - m) * (x - m), producer="max", finite=True)
    sch = _fuse_chain(program, fusion)
    inputs = {"x": np.random.default_rng(0).uniform(-2.0, 2.0, (4, 8)).astype(np.float32)}
    got, ref = interpret(sch.program, inputs)["s"], interpret(program, inputs)["s"]
    assert np.all(np.isfinite(got)) and np.allclose(got, ref, rtol=1e-5)


@pytest.mark.parametrize("fusion", ["rolling_update", "split_k_update"])
def test_polynomial_in_a_max_of_data_that_may_be_minus_inf_is_refused(fusion):
    """Data holding -inf make the running max -inf while the plain program's term for such an element is
    +inf; no guard makes Σ (x - max)² exact there, so without finite=True the fusion is refused."""
    program = _chain_program(lambda x, m: (x - m) * (x - m), producer="max")
    with pytest.raises(NoRepairFound, match="declare the input finite=True"):
        _fuse_chain(program, fusion)


# ------------------------------------------------------------------ rolling update over tiles

ROLLING_TILE_CASES = [(name, tile) for name in ("variance", "layernorm_stats") for tile in (16, 8)]
"""40 elements: tiles of 16 + 16 + 8 (the last partial), and 5 tiles of 8."""
BACKENDS = ["loop", "tiles", "cpp"]


@functools.cache
def _rolled_over_tiles(name: str, tile: int) -> Schedule:
    sch = Schedule(ops.get(name).program("default"))
    j0, _ = sch.split(sch.loop("s_mean", "j"), [None, tile])
    sch.rolling_update("s_var", j0)
    sch.compact_buffers()
    return sch


@functools.cache
def _runner(name: str, tile: int, backend: str):
    program = _rolled_over_tiles(name, tile).program
    if backend == "loop":
        return functools.partial(interpret, program)
    if backend == "tiles":
        return functools.partial(tiling.interpret, to_tiles(program))
    return build(program, "cpp", werror=True).run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, tile", ROLLING_TILE_CASES)
def test_rolling_over_tiles_matches_numpy(name, tile, backend):
    """The state repair runs once per tile; a partial last tile must not change the result, at the
    catalog magnitudes (catalog tolerance) and at a large common offset (the unfused program's accuracy)."""
    if backend == "cpp" and shutil.which("g++") is None:
        pytest.skip("needs g++ on PATH")
    op = ops.get(name)
    sizes = op.sizes("default")
    run = _runner(name, tile, backend)
    for seed in (0, 1):
        for magnitude in (*op.magnitudes, OFFSET):
            inputs = op.inputs(seed, "default", None, magnitude)
            ref = op.reference(inputs, "default", sizes)
            got = run(inputs)
            if magnitude == OFFSET:
                unfused_err = _relative_error(interpret(op.program("default"), inputs)["var"], ref["var"])
                fused_err = _relative_error(got["var"], ref["var"])
                assert fused_err <= 10 * unfused_err, \
                    f"{name} tile={tile} {backend} seed={seed}: fused {fused_err:.3g}, unfused {unfused_err:.3g}"
            else:
                result = ops.compare(got, ref, op.tolerance("default", sizes))
                assert result.ok, f"{name} tile={tile} {backend} seed={seed} magnitude={magnitude}: {result.line()}"


@pytest.mark.parametrize("name, tile", ROLLING_TILE_CASES)
def test_rolling_over_tiles_combines_the_state_in_order(name, tile):
    """X's combine reads A_1 and A_2 before their update, A_1's reads A_2 before its update: the
    combines run X, A_1, A_2 in the rolling loop."""
    program = _rolled_over_tiles(name, tile).program
    order = [b.name for b in program.blocks()]
    assert order.index("s_var") < order.index("s_var_aux1") < order.index("s_var_aux2")
    assert order.index("s_var_aux2_rf") < order.index("s_var")


@pytest.mark.parametrize("name, tile", ROLLING_TILE_CASES)
def test_rolling_over_tiles_references_count_the_elements_seen(name, tile):
    """The reference point is mean·N/n with n the elements reduced so far: min(16·(k + 1), 40) when the
    last of the tiles of 16 is partial, 8·(k + 1) for tiles of 8 (never the tile count (k + 1)/E, which
    for ragged tiles overshoots the mean by up to 20% and loses everything at a large offset)."""
    fusion = _rolled_over_tiles(name, tile).fusions[0]
    (note,) = fusion.notes
    count = f"minimum((k + 1) * {tile}, 40)" if 40 % tile else f"(k + 1) * {tile}"
    assert f"{count} of 40 elements reduced by iteration k of loop 'j_0'" in note


def test_rolling_over_tiles_trace_replays_to_the_same_program():
    sch = _rolled_over_tiles("variance", 16)
    again = Schedule(ops.get("variance").program("default")).replay(sch.trace.to_json())
    assert again.program == sch.program


def test_rolling_over_a_tile_of_fused_loops_counts_its_elements():
    """A tile enumerated by a fused pair of loops (``j_1 = 4·(f // 4) + f % 4``) still reduces the
    interval [16·k, 16·(k + 1)): ISL sees it, and the reference keeps the accuracy at the offset."""
    op = ops.get("variance")
    sch = Schedule(op.program("default"))
    j0, j1 = sch.split(sch.loop("s_mean", "j"), [None, 16])
    sch.fuse(sch.split(j1, [4, 4]))
    sch.rolling_update("s_var", j0)
    assert "minimum((k + 1) * 16, 40) of 40 elements" in sch.fusions[0].notes[0]
    inputs = op.inputs(0, "default", None, OFFSET)
    ref = op.reference(inputs, "default", op.sizes("default"))["var"]
    unfused_err = _relative_error(interpret(op.program("default"), inputs)["var"], ref)
    assert _relative_error(interpret(sch.program, inputs)["var"], ref) <= 10 * unfused_err


def test_a_binding_that_is_not_a_tiling_counts_iterations():
    """j = 20·u + k: iteration k reduces {k, k + 20}, not an interval; the count falls back to k + 1 of
    the loop's 20 iterations (exact: it ends at 1), and says why."""
    from polyfuse.transforms.rolling_update import _elements_seen

    p = ProgramBuilder("strided")
    x = p.input("x", (4, 40), "f32")
    m = p.output("m", (4,), "f32")
    with p.loop("b", 4) as b, p.loop("k", 20) as k, p.loop("u", 2) as u:
        with p.block("s_m", b=spatial(4, b), j=reduce(40, u * 20 + k)) as (bb, j):
            m[bb] = m[bb] + x[bb, j]
    count = _elements_seen(p.build(), "s_m", "k")
    assert "does not reduce j in [1·k, 1·(k + 1))" in count.describe("k")
    seen, total = count.fraction(Var("k") + 1)
    assert (seen, total) == (Var("k") + 1, const(20))


def test_rolling_the_inertia_after_its_centre_over_tiles_is_refused_with_the_reason():
    """Rolled over tiles, the centre becomes a combine of one partial per tile: the inertia, which reads
    the centre per element, has no reduction to align with; the refusal says so and what works."""
    sch = Schedule(ops.get("inertia").program("default"))
    n0, _ = sch.split(sch.loop("s_mass", "n"), [None, 16])
    sch.rolling_update("s_center", n0)
    with pytest.raises(IllegalTransform, match=r"(?s)block 's_inertia' under loop 'n_0'.*'s_center' was rolled over "
                                               r"the tiles of loop 'n_0'.*s_center_rf.*split_k_update"):
        sch.rolling_update("s_inertia", n0)


@pytest.mark.parametrize("name", ["variance", "layernorm_stats", "inertia"])
def test_gpu_rolling_plan_matches_numpy_on_the_interpreter(name):
    """The GPU plan rolls over row tiles (100 elements: three tiles of 32 and one of 4; inertia, whose
    centre cannot roll over tiles, keeps the untiled loop); interpreted, its program matches NumPy
    (variance was 27% off while the tile combines updated A_2 before X and A_1 read it)."""
    op = ops.get(name)
    sizes = {**op.sizes("default"), {"variance": "L", "layernorm_stats": "M", "inertia": "N"}[name]: 100}
    program = default_schedule(name, "default", op.program("default", **sizes), "cuda").program
    for magnitude in op.magnitudes:
        inputs = op.inputs(0, "default", sizes, magnitude)
        result = ops.compare(interpret(program, inputs), op.reference(inputs, "default", sizes),
                             op.tolerance("default", sizes))
        assert result.ok, f"{name} magnitude={magnitude}: {result.line()}"
