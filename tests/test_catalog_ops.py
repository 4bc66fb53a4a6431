"""Catalog operators of OPERATORS.md A, C and D: plain programs against their NumPy references."""

from __future__ import annotations

import functools
import math
import time

import ml_dtypes
import numpy as np
import pytest

from polyfuse import ops
from polyfuse.ir import interpret
from polyfuse.ir.printer import program_from_source

SOFTMAX = ["softmax_sum", "softmax", "logsumexp"]
NORMS = ["l2norm_stable", "rmsnorm_amax", "sum_sum", "variance", "inertia"]
CASCADES = ["moe_routing", "quant_gemm", "quant_gemm_fp8", "performer"]
OPERATORS = SOFTMAX + NORMS + CASCADES
SEEDS = (0, 1, 2)
CASES = [(name, seed, mag) for name in OPERATORS for mag in ops.get(name).magnitudes for seed in SEEDS]
INTERPRETER_BUDGET_S = 8.0


def _case_id(case: tuple) -> str:
    name, seed, mag = case
    return f"{name}-s{seed}-m{mag:g}"


@functools.cache
def _run(case: tuple) -> tuple[dict, dict, ops.Comparison, float, float]:
    """Interpret one case once: outputs, reference, comparison, CPU and wall seconds in ``interpret``."""
    name, seed, mag = case
    op = ops.get(name)
    program, inputs = op.program(), op.inputs(seed, magnitude=mag)
    cpu, wall = time.process_time(), time.perf_counter()
    result = interpret(program, inputs)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    mode, sizes = op.modes[0], op.sizes()
    reference = op.reference(inputs, mode, sizes)
    return result, reference, ops.compare(result, reference, op.tolerance(mode, sizes)), cpu, wall


def _interpret(name: str, **arrays: object) -> dict[str, np.ndarray]:
    """Run operator ``name`` at the sizes the given f32 arrays imply (for hand-made inputs)."""
    op = ops.get(name)
    inputs = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
    return interpret(op.program(**_sizes_of(name, inputs)), inputs)


def _sizes_of(name: str, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    first = next(iter(inputs.values()))
    if name in SOFTMAX or name in ("l2norm_stable", "rmsnorm_amax", "sum_sum"):
        return dict(zip(("N", "M"), first.shape, strict=True))
    if name == "variance":
        return dict(zip(("B", "L"), first.shape, strict=True))
    if name == "inertia":
        return dict(zip(("B", "N"), first.shape, strict=True))
    if name in ("quant_gemm", "quant_gemm_fp8"):
        (M, K), N = first.shape, inputs["W"].shape[1]
        return {"M": M, "K": K, "N": N}
    raise AssertionError(f"no hand-made sizes for {name}")


# ------------------------------------------------------------------ catalog shape

def test_registered_in_order():
    assert [n for n in ops.names() if n in OPERATORS] == OPERATORS


@pytest.mark.parametrize("name", OPERATORS)
def test_sizes_presets_and_dtypes(name):
    op = ops.get(name)
    assert set(op.presets["default"]) == set(op.defaults["default"])
    assert any(v % 32 for v in op.defaults["default"].values())
    program = op.program()
    declared = {t.name: t.dtype.numpy for t in program.inputs}
    assert {k: v.dtype for k, v in op.inputs(0).items()} == declared
    assert op.build("default", dict(op.presets["default"])).name == name  # builds at benchmark sizes
    assert len(op.magnitudes) >= 2 and op.tolerance_note


@pytest.mark.parametrize("name", OPERATORS)
def test_printed_program_round_trips(name):
    p = ops.get(name).program()
    assert program_from_source(str(p)) == p


def test_softmax_sum_is_figure_1a():
    p = ops.get("softmax_sum").program()
    assert [b.name for b in p.blocks()] == ["s_max", "s_exp", "s_sum"]
    assert [t.name for t in p.tensors] == ["inp", "xmax", "xexp", "xsum"]
    assert [t.name for t in p.outputs] == ["xsum"]


# ------------------------------------------------------------------ against NumPy

@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_reference(case):
    *_, cmp, _, _ = _run(case)
    assert cmp.ok, f"{_case_id(case)}: {cmp.line()} ({cmp.worst})"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_finite_wherever_the_reference_is(case):
    result, reference, *_ = _run(case)
    for name, ref in reference.items():
        finite = np.isfinite(ref)
        assert finite.all(), f"{_case_id(case)}: the reference of {name} is not finite"
        assert np.isfinite(result[name][finite]).all(), f"{_case_id(case)}: {name} has inf/NaN"


def _naive_failures(name: str, inputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> bool:
    """Whether the textbook formula without the operator's safeguard fails in f32 on ``inputs``."""
    with np.errstate(all="ignore"):
        if name in SOFTMAX:
            return not np.isfinite(np.exp(inputs["inp"]).sum(axis=1)).all()
        if name == "moe_routing":
            return not np.isfinite(np.exp(inputs["x"] @ inputs["w"]).sum(axis=1)).all()
        if name == "l2norm_stable":
            naive = np.sqrt(np.sum(inputs["x"] * inputs["x"], axis=1))
            return not np.allclose(naive, reference["out"], rtol=1e-3)
        if name == "variance":
            x = inputs["x"]
            naive = np.mean(x * x, axis=1) - np.mean(x, axis=1) ** 2
            return not np.allclose(naive, reference["var"], rtol=1e-2)
        if name == "inertia":
            w, x = inputs["w"], inputs["x"]
            mass = w.sum(axis=1)
            center = np.einsum("bn,bnc->bc", w, x) / mass[:, None]
            naive = np.einsum("bn,bnc->b", w, x * x) - mass * np.sum(center * center, axis=1)
            return not np.allclose(naive, reference["inertia"], rtol=1e-2)
        if name == "performer":
            delta = np.float32(inputs["q"].shape[-1] ** -0.25)
            for x in (inputs["q"], inputs["k"]):
                dash = np.einsum("bhld,fd->bhlf", delta * x, inputs["proj"])
                if not np.isfinite(np.exp(dash - delta * delta / 2 * np.sum(x * x, axis=-1, keepdims=True))).all():
                    return True
            return False
    raise AssertionError(name)


ADVERSARIAL = {"softmax_sum": 1e4, "softmax": 1e4, "logsumexp": 1e4, "moe_routing": 1e4,
               "l2norm_stable": 1e25, "variance": 1e4, "inertia": 1e3, "performer": 120.0}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_large_magnitude_breaks_the_unstable_formula(name):
    """The adversarial magnitude is adversarial: the formula without the safeguard fails on it
    (overflow, or cancellation for the one-pass moments), the plain program is within tolerance."""
    mag = ADVERSARIAL[name]
    assert mag in ops.get(name).magnitudes
    for seed in SEEDS:
        _, reference, cmp, _, _ = _run((name, seed, mag))
        assert _naive_failures(name, ops.get(name).inputs(seed, magnitude=mag), reference)
        assert cmp.ok


def test_interpreter_time_and_errors(capsys):
    """Every case interprets within the budget; prints time and max error per operator and magnitude."""
    cpu = wall = 0.0
    worst: dict[tuple[str, float], tuple[float, float]] = {}
    for case in CASES:
        *_, cmp, c, w = _run(case)
        cpu, wall = cpu + c, wall + w
        a, r = worst.get((case[0], case[2]), (0.0, 0.0))
        worst[(case[0], case[2])] = (max(a, cmp.max_abs_err), max(r, cmp.max_rel_err))
    with capsys.disabled():
        print(f"\ncatalog ops: {len(CASES)} interpreter runs, {cpu:.2f} s CPU, {wall:.2f} s wall")
        for (name, mag), (a, r) in worst.items():
            print(f"  {name:15s} magnitude {mag:<7g} max_abs_err {a:.2e} max_rel_err {r:.2e}")
    assert cpu < INTERPRETER_BUDGET_S


# ------------------------------------------------------------------ hand-checked cases

LOGS = [[5.0, 5.0, 5.0, 5.0], [0.0, math.log(2), math.log(3), math.log(4)]]


def test_softmax_family_by_hand():
    """Row 0: four equal logits; row 1: logs of 1..4, so exp(x - max) = k/4 and the sum is 10/4."""
    assert np.allclose(_interpret("softmax_sum", inp=LOGS)["xsum"], [4.0, 2.5], rtol=1e-6)
    y = _interpret("softmax", inp=LOGS)["y"]
    assert np.allclose(y, [[0.25] * 4, [0.1, 0.2, 0.3, 0.4]], rtol=1e-6)
    lse = _interpret("logsumexp", inp=LOGS)["out"]
    assert np.allclose(lse, [5 + math.log(4), math.log(10)], rtol=1e-6)


def test_norms_by_hand():
    assert np.allclose(_interpret("l2norm_stable", x=[[3e30, -4e30]])["out"], [5e30], rtol=1e-6)
    out = _interpret("rmsnorm_amax", x=[[3.0, -4.0]])
    scale = math.sqrt(25 / 2 + 1e-6)
    assert np.allclose(out["y"], [[3 / scale, -4 / scale]], rtol=1e-6)
    assert np.allclose(out["amax"], [3 / scale], rtol=1e-6)
    # m = 30 > 10: s = 10/sqrt(20); m = 3 < 11: the denominator is clamped to 1, s = 3.
    s = _interpret("sum_sum", x1=[[1, 2, 3, 4], [1, 1, 1, 0]], x2=[[1, 1, 1, 1], [1, 1, 1, 1]])["s"]
    assert np.allclose(s, [10 / math.sqrt(20), 3.0], rtol=1e-6)
    assert _interpret("variance", x=[[1, 2, 3, 4]])["var"].tolist() == [1.25]
    # Two unit masses at x = ±1: centre 0, I = 1 + 1.
    assert _interpret("inertia", w=[[1, 1]], x=[[[-1, 0, 0], [1, 0, 0]]])["inertia"].tolist() == [2.0]


def test_moe_routing_by_hand():
    """Logits [1, 3, 3, 0] (a tie: the lower index first) and [-1, -3, -3, 0]."""
    op = ops.get("moe_routing")
    inputs = {"x": np.array([[1.0], [-1.0]], np.float32), "w": np.array([[1.0, 3.0, 3.0, 0.0]], np.float32)}
    out = interpret(op.program(S=2, HD=1, E=4, K=2), inputs)
    assert out["topi"].tolist() == [[1, 2], [3, 0]]
    s0, s1 = math.exp(-2) + 2 + math.exp(-3), 1 + math.exp(-1) + 2 * math.exp(-3)
    assert np.allclose(out["probs"], [[1 / s0, 1 / s0], [1 / s1, math.exp(-1) / s1]], rtol=1e-6)


def test_quant_gemm_by_hand():
    """One row [1, -0.5, 0.3], W = I: scaled values 448, -224, 134.4; fp8 e4m3 rounds 134.4 to 128."""
    a, w = [[1.0, -0.5, 0.3]], np.eye(3)
    assert np.allclose(_interpret("quant_gemm", A=a, W=w)["C"], [[448, -224, 134.4]], rtol=1e-6)
    assert _interpret("quant_gemm_fp8", A=a, W=w)["C"].tolist() == [[448, -224, 128]]
    assert float(np.float32(134.4).astype(ml_dtypes.float8_e4m3fn)) == 128.0


def test_performer_with_zero_keys_averages_v():
    """k = 0 makes every k' equal (ρ·exp(0)), so out is the mean of v's rows whatever q and P are."""
    op = ops.get("performer")
    inputs = op.inputs(0)
    inputs["k"] = np.zeros_like(inputs["k"])
    out = interpret(op.program(), inputs)["out"]
    expected = np.broadcast_to(inputs["v"].mean(axis=2, keepdims=True), out.shape)
    assert np.allclose(out, expected, rtol=1e-5, atol=1e-6)


GENERIC = [name for name in ops.names() if ops.get(name).symbolic]
GENERIC_SIZES = ((1, 1), (1, 7), (13, 1), (2, 41), (7, 13))
"""Values of an operator's symbolic sizes (zipped with them in order): 1, primes, and a row length past the default."""


NO_DEFAULT_FUSION = {"quant_gemm_fp8": "its fp8 rounding is not invertible: the default schedule raises "
                                      "NoRepairFound at every size, so the plain program is compiled"}


@pytest.mark.parametrize("name", GENERIC)
def test_one_host_kernel_serves_every_symbolic_size(name):
    """The host kernel of the generic program, compiled once, matches NumPy at each of ``GENERIC_SIZES``."""
    from polyfuse.ops.schedules import default_schedule
    from polyfuse.pipeline import build

    op = ops.get(name)
    mode = op.modes[0]
    program = op.generic_program(mode)
    kernel = build(program if name in NO_DEFAULT_FUSION else default_schedule(name, mode, program), "cpp")
    assert set(kernel.kernel_source.sizes) == set(op.symbolic)
    for values in GENERIC_SIZES:
        given = dict(zip(op.symbolic, values, strict=False))
        sizes = op.sizes(mode, given)
        inputs = op.inputs(3, mode, sizes)
        result = ops.compare(kernel.run(inputs, **given), op.reference(inputs, mode, sizes), op.tolerance(mode, sizes))
        assert result.ok, f"{name} at {sizes}: {result.worst}"


def test_generic_program_keeps_the_other_sizes_static():
    op = ops.get("rmsnorm_amax")
    assert op.symbolic == ("N",) and op.static_sizes() == {"M": 40}
    program = op.generic_program(M=24)
    assert [p.name for p in program.params] == ["N"] and str(program.tensor("x").shape[1]) == "24"
