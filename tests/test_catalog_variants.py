"""Every catalog operator on the inputs that break floating point (issue 20; OPERATORS.md E.1).

The input variants of :mod:`polyfuse.ops.variants` (rows that start with zeros, zero rows, ties,
sorted rows, ±inf / NaN / huge / tiny entries) on every operator, mode and host backend: the plain
program (``interp``) must agree with the float64 reference everywhere, special values included, and
so must the fused program, its tile program and the generated C++, and (on leading zeros) the fused
program of the CUDA schedule.  Inputs that an operator declares (masses ``sign="nonnegative"``, the
masked attention variants' data ``finite=True``) get variants within the declaration.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.cli import main
from polyfuse.cli.stages import BACKENDS, Subject
from polyfuse.errors import NoRepairFound, PolyfuseError
from polyfuse.ir import interpret
from polyfuse.ops import schedules
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.variants import VARIANTS, Operand, apply_variant, declared, leading_zero_counts, special_kinds

SEEDS = {"interp": (0, 1, 2), "fused": (0,), "tile": (0,), "cpp": (0, 1, 2)}
"""Seeds per host backend: the interpreters of fused and tile programs take a NumPy pass per step (about ten
times the plain program's time), so they run one; the compiled kernel (built once) and the plain program three."""
HOST_BACKENDS = tuple(SEEDS)
REFUSED = {"quant_gemm_fp8": "rounded to fp8"}
"""Operators whose default schedule is refused (NoRepairFound), with a phrase of the reason."""

GPU_SCHEDULE = "cuda-schedule"
"""The fused program of the default CUDA schedule (GPU tiles), interpreted on the host: run on the leading_zeros
inputs, whose zeros must cover a whole GPU tile."""


SUBJECTS = [(name, mode) for name in ops.names() for mode in ops.get(name).modes]


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    """Builds (once per operator and mode, with -Werror) the host C++ kernel, cached in a fresh directory."""
    from polyfuse.pipeline import build

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        kernels = {}

        def kernel(subject: Subject):
            key = (subject.op.name, subject.mode)
            if key not in kernels:
                kernels[key] = build(subject.schedule(), "cpp", sizes=subject.sizes, werror=True)
            return kernels[key]

        yield kernel


@pytest.mark.parametrize(("name", "mode", "backend", "variant"),
                         [(*subject, backend, variant) for subject in SUBJECTS for backend in HOST_BACKENDS
                          for variant in VARIANTS],
                         ids=lambda v: str(v))
def test_backend_agrees_with_the_reference_on_every_variant(name, mode, backend, variant, request):
    subject = Subject.of(name, mode, {})
    op = subject.op
    if backend != "interp" and name in REFUSED:
        with pytest.raises(NoRepairFound, match=REFUSED[name]):
            subject.schedule()
        return
    if backend == "cpp":
        run = request.getfixturevalue("host_kernel")(subject).run
    else:
        run = functools.partial(BACKENDS[backend], subject)
    tolerance = op.tolerance(mode, subject.sizes)
    for seed in SEEDS[backend]:
        inputs = op.inputs(seed, mode, subject.sizes, variant=variant)
        result = ops.compare(run(inputs), op.reference(inputs, mode, subject.sizes), tolerance)
        assert result.ok, f"{subject} {backend} inputs={variant} seed={seed}: {result.line()} ({result.worst})"


@pytest.mark.parametrize(("name", "mode"), SUBJECTS)
def test_plain_program_on_every_variant_at_every_magnitude(name, mode):
    """The variants rewrite the draw of any magnitude (offsets of 1e4, logits of 1e4, values of 1e25 …)."""
    subject = Subject.of(name, mode, {})
    op = subject.op
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(0, mode, subject.sizes, magnitude, variant)
            result = ops.compare(BACKENDS["interp"](subject, inputs), op.reference(inputs, mode, subject.sizes),
                                 op.tolerance(mode, subject.sizes))
            assert result.ok, f"{subject} magnitude={magnitude:g} inputs={variant}: {result.line()} ({result.worst})"


@pytest.mark.parametrize(("name", "mode", "backend", "variant"),
                         [(*subject, GPU_SCHEDULE, "leading_zeros") for subject in SUBJECTS],
                         ids=lambda v: str(v))
def test_gpu_schedule_agrees_on_leading_zeros(name, mode, backend, variant):
    """The GPU schedules roll over tiles, not elements: the repair first meets a running value that is still 0
    after a whole tile of zeros (quant_gemm K=256 with 64 leading zeros, issue 20)."""
    subject = Subject.of(name, mode, {})
    if name in REFUSED:
        with pytest.raises(NoRepairFound, match=REFUSED[name]):
            subject.schedule("cuda")
        return
    inputs = subject.op.inputs(0, mode, subject.sizes, variant=variant)
    result = ops.compare(interpret(subject.schedule("cuda").program, inputs),
                         subject.op.reference(inputs, mode, subject.sizes), subject.op.tolerance(mode, subject.sizes))
    assert result.ok, f"{subject} {backend} inputs={variant}: {result.line()} ({result.worst})"


# ------------------------------------------------------------------ what each variant does

def _rows(variant: str) -> tuple[np.ndarray, np.ndarray]:
    """The random rows of l2norm_stable's x (8 rows of 40) and the same rows rewritten by ``variant``."""
    op = ops.get("l2norm_stable")
    return op.inputs(0)["x"], op.inputs(0, variant=variant)["x"]


def test_every_operator_declares_the_operands_it_reduces():
    for name in ops.names():
        op = ops.get(name)
        inputs = {t.name: t for t in op.program(op.modes[0]).inputs}
        assert op.operands, name
        for operand in op.operands:
            assert operand.name in inputs, (name, operand.name)
            assert -len(inputs[operand.name].shape) <= operand.axis < len(inputs[operand.name].shape)


@pytest.mark.parametrize("name", ops.names())
def test_random_is_the_operators_own_draw_and_variants_keep_dtypes(name):
    op = ops.get(name)
    plain = op.make_inputs(np.random.default_rng(3), op.modes[0], op.sizes(), 1.0)
    for variant in VARIANTS:
        inputs = op.inputs(3, variant=variant)
        assert {k: (v.dtype, v.shape) for k, v in inputs.items()} == {k: (v.dtype, v.shape) for k, v in plain.items()}
        touched = {o.name for o in op.operands}
        for key, value in inputs.items():
            if variant == "random" or key not in touched:
                assert np.array_equal(value, plain[key]), (variant, key)


def test_leading_zeros_cover_half_the_row_all_but_one_and_each_power_of_two():
    assert leading_zero_counts(40) == [20, 39, 1, 2, 4, 8, 16, 32]
    assert leading_zero_counts(256)[:2] == [128, 255] and 64 in leading_zero_counts(256)
    assert leading_zero_counts(1) == [1]
    random, rows = _rows("leading_zeros")
    for r, count in enumerate(leading_zero_counts(40)):
        assert not rows[r, :count].any() and np.array_equal(rows[r, count:], random[r, count:])


@pytest.mark.parametrize(("extent", "gpu_tile"), [
    (40, GpuTuning().row_tile), (8192, GpuTuning().row_tile), (256, GpuTuning().gemm_tile[2]),
    (4096, GpuTuning().gemm_tile[2]), (4096, GpuTuning().prefill_tile[1]), (4096, GpuTuning().performer_tile[0]),
])
def test_leading_zeros_cover_a_whole_gpu_tile(extent, gpu_tile):
    """The rolling loops of the GPU schedules step over ``_fit(tile, extent)`` elements: the first row's zeros
    cover that whole step, and some row has zeros over exactly one step (quant_gemm K=256: 64, issue 20)."""
    step = schedules._fit(gpu_tile, extent)
    counts = leading_zero_counts(extent)
    assert counts[0] >= step and step in counts


def test_leading_zeros_of_a_key_are_a_zero_vector():
    """Attention's k and v rows run along the keys; a key (all of its d) is one element."""
    op = ops.get("attn_global")
    random, inputs = op.inputs(0), op.inputs(0, variant="leading_zeros")
    k, counts = inputs["k"], leading_zero_counts(40)
    for h in range(k.shape[1]):
        assert not k[0, h, :counts[h]].any() and np.array_equal(k[0, h, counts[h]:], random["k"][0, h, counts[h]:])
        assert not inputs["v"][0, h, :counts[h]].any()
    q, counts = inputs["q"].reshape(-1, 16), leading_zero_counts(16)  # q's rows run along d
    assert all(not q[r, :counts[r % len(counts)]].any() and q[r, counts[r % len(counts)]:].any()
               for r in range(q.shape[0]))


def test_zero_rows_are_every_third_row():
    random, rows = _rows("zero_rows")
    for r in range(rows.shape[0]):
        assert (not rows[r].any()) if r % 3 == 0 else np.array_equal(rows[r], random[r])


def test_ties_are_the_rows_own_extremes_half_and_half():
    random, rows = _rows("ties")
    for r in range(rows.shape[0]):
        values, counts = np.unique(rows[r], return_counts=True)
        assert values.tolist() == [random[r].min(), random[r].max()] and counts.tolist() == [20, 20]
        assert rows[r].astype(np.float64).var() >= random[r].astype(np.float64).var()  # Popoviciu


def test_monotone_rows_are_sorted_three_ways():
    random, rows = _rows("monotone")
    for r in range(rows.shape[0]):
        assert sorted(rows[r].tolist()) == sorted(random[r].tolist())
        key = (rows[r], -rows[r], np.abs(rows[r]))[r % 3]
        assert np.all(np.diff(key) >= 0), r


def test_special_puts_one_special_entry_in_each_row():
    random, rows = _rows("special")
    operand = ops.get("l2norm_stable").operands[0]
    kinds = special_kinds(operand)
    assert kinds == ["+inf", "-inf", "nan", "huge", "tiny", None]
    expected = {"+inf": np.inf, "-inf": -np.inf, "huge": operand.huge, "tiny": operand.tiny}
    for r in range(rows.shape[0]):
        changed = np.flatnonzero(~((rows[r] == random[r]) | np.isnan(rows[r]) & np.isnan(random[r])))
        kind = kinds[r % len(kinds)]
        if kind is None:
            assert changed.size == 0
            continue
        (j,) = changed
        value = float(rows[r, j])
        if kind == "nan":
            assert math.isnan(value)
        elif kind in ("+inf", "-inf"):
            assert value == expected[kind]
        else:
            assert abs(value) == float(np.float32(expected[kind]))
            assert math.copysign(1, value) == math.copysign(1, random[r, j])


def test_masses_stay_nonnegative():
    """inertia declares its masses sign='nonnegative': no variant gives a negative or NaN mass."""
    op = ops.get("inertia")
    for variant in VARIANTS:
        w = op.inputs(0, variant=variant)["w"]
        assert not np.any(w < 0) and not np.any(np.isnan(w)), variant
    kinds = special_kinds(declared(op.operands[0], op.program().tensor("w")))
    assert "-inf" not in kinds and "nan" not in kinds


def test_finite_inputs_get_no_infinities():
    """The masked attention variants declare q, k, v finite: special entries are huge or tiny only."""
    op = ops.get("attn_causal")
    inputs = op.inputs(0, "prefill", variant="special")
    assert all(np.all(np.isfinite(a)) for a in inputs.values())


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(PolyfuseError, match="no input variant 'noise'; known: random, leading_zeros"):
        ops.get("softmax").inputs(0, variant="noise")


def test_an_operand_that_is_not_an_input_is_named():
    x = {"x": np.ones((2, 4), np.float32)}
    with pytest.raises(PolyfuseError, match="operator 'demo': operand 'y' is not one of its inputs"):
        apply_variant("zero_rows", x, (Operand("y", axis=1),), seed=0, op="demo")
    with pytest.raises(PolyfuseError, match="operator 'demo' declares no operands"):
        apply_variant("zero_rows", x, (), seed=0, op="demo")
    with pytest.raises(PolyfuseError, match="operand 'x': axis 2 .* do not fit its 2 dimensions"):
        apply_variant("zero_rows", x, (Operand("x", axis=2),), seed=0, op="demo")


def test_a_huge_value_outside_the_dtype_is_refused_naming_the_operand():
    x = {"q": np.ones((2, 4), np.float16)}
    with pytest.raises(PolyfuseError, match="operand 'q': its huge value 1e\\+06 is not a finite, non-zero float16"):
        apply_variant("special", x, (Operand("q", axis=1, huge=1e6),), seed=0, op="demo")


# ------------------------------------------------------------------ references on special values

def _reference_and_program(name: str, mode: str, sizes: dict[str, int], inputs: dict) -> dict[str, np.ndarray]:
    """The reference on hand-made inputs, after checking that the plain program agrees with it."""
    op = ops.get(name)
    reference = op.reference(inputs, mode, sizes)
    result = ops.compare(interpret(op.program(mode, **sizes), inputs), reference, op.tolerance(mode, sizes))
    assert result.ok, f"{result.line()} ({result.worst})"
    return reference


def test_l2norm_reference_gives_nan_for_a_zero_row_as_the_program_does():
    """0·sqrt(Σ (0/0)²) and inf·sqrt(inf/inf + …) are NaN in the plain program; sqrt(Σ x²) would say 0 and inf."""
    x = np.array([[0.0, 0.0, 0.0], [0.0, 3.0, -4.0], [np.inf, 1.0, 1.0]], np.float32)
    out = _reference_and_program("l2norm_stable", "default", {"N": 3, "M": 3}, {"x": x})["out"]
    assert np.isnan(out[0]) and out[1] == 5.0 and np.isnan(out[2])


def test_moe_reference_ranks_nan_logits_by_the_programs_comparisons():
    """A NaN logit compares false: it and the largest finite logit both have rank 0, so slot 0 sums them.
    The program declares its inputs finite (its GPU kernel splits them for tensor cores), so it refuses
    such inputs; the reference still follows the program's definition of the ranks."""
    sizes = {"S": 1, "HD": 1, "E": 4, "K": 2}
    inputs = {"x": np.array([[1.0]], np.float32), "w": np.array([[np.nan, 3.0, 1.0, 2.0]], np.float32)}
    op = ops.get("moe_routing")
    ref = op.reference(inputs, "default", sizes)
    assert ref["topi"].tolist() == [[0 + 1, 3]]
    assert np.isnan(ref["probs"]).all()
    with pytest.raises(PolyfuseError, match=r"input 'w' is declared finite=True, but its element \[0, 0\] is nan"):
        interpret(op.program("default", **sizes), inputs)


def test_attention_reference_zeroes_weights_below_f32_like_the_program():
    """A key whose weight underflows f32 (logit 200 below the max) contributes 0·inf = NaN with an infinite v;
    attention declares its inputs finite, so the program refuses such a v."""
    sizes = {"B": 1, "Hq": 1, "Hkv": 1, "Sq": 1, "Skv": 2, "D": 16, "Dv": 16}
    q = np.zeros((1, 1, 1, 16), np.float16)
    q[..., 0] = 200.0
    k = np.zeros((1, 1, 2, 16), np.float16)
    k[0, 0, 0, 0] = 4.0  # logit 200·4/4 = 200 for key 0, 0 for key 1
    v = np.ones((1, 1, 2, 16), np.float16)
    v[0, 0, 1] = np.inf
    op = ops.get("attn_global")
    assert np.isnan(op.reference({"q": q, "k": k, "v": v}, "prefill", sizes)["out"]).all()
    with pytest.raises(PolyfuseError, match="input 'v' is declared finite=True"):
        interpret(op.program("prefill", **sizes), {"q": q, "k": k, "v": v})


# ------------------------------------------------------------------ the command

def test_check_takes_an_input_variant_and_says_which(capsys):
    assert main(["check", "softmax", "--inputs", "special", "--seed", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("inputs=special") and out[-1].endswith("OK")


def test_check_rejects_an_unknown_variant_listing_the_known_ones(capsys):
    assert main(["check", "softmax", "--inputs", "noise"]) == 3
    assert "invalid choice: 'noise' (choose from 'random', 'leading_zeros'" in capsys.readouterr().err


def test_check_reports_nan_against_a_finite_reference(capsys, monkeypatch):
    """A backend that returns NaN where the reference is finite fails (exit 1), naming both values."""
    monkeypatch.setitem(BACKENDS, "fused", lambda subject, inputs: {"out": np.full(8, np.nan, np.float32)})
    assert main(["check", "l2norm_stable", "--backend", "fused"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("worst: out: nan where the reference is ") and out[-1].startswith("max_abs_err=inf ")


def _gpu_check():
    """benchmarks/gpu_check.py as a module (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_the_variants_it_is_given():
    gpu_check = _gpu_check()
    assert gpu_check.input_variants("all") == list(VARIANTS)
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown input variant\(s\) noise; known: random"):
        gpu_check.input_variants("random,noise")
    jobs = gpu_check.jobs_of(["l2norm_stable"], ["test"], ["random", "leading_zeros"], "cuda", 0)
    assert [(job[3], job[6]) for job in jobs] == [(1.0, "random"), (1e25, "random"), (1e-30, "random"),
                                                  (1.0, "leading_zeros")]
    record = gpu_check.run_one(("l2norm_stable", "default", "test", 1.0, "interp", 0, "zero_rows"))
    assert record["status"] == "OK" and record["inputs"] == "zero_rows" and "inputs=zero_rows" in record["text"]
