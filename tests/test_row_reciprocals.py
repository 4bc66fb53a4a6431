"""Divisions by a value of the row in kernels whose rows stay on chip (polyfuse/emit_cpp/reciprocal.py,
``row_divisions``): the plan multiplies by ``rcp_rz(d)`` where ``d``'s finite non-zero values are proven to lie in
``[2^-126, 2^126]`` and says why not elsewhere; the interval evaluation behind the proof is sound on random
expressions and f32 values (±0, ±inf, NaN, subnormal and huge included); the printed kernel computes the
reciprocal once per row.  On a GPU, tests/test_onchip_rows.py runs these kernels against the rolling kernels
(which divide) and NumPy on every input variant."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CUDA, CodegenOptions, Target, emit_planned, gpu_plan, onchip
from polyfuse.emit_cpp.reciprocal import F32_MAX, SMALLEST_NORMAL, finite_bounds
from polyfuse.errors import BackendUnavailable
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Select, Var
from polyfuse.ir.stmt import INPUT, Tensor
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import stages
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.htile import TileLoad
from polyfuse.tiling.skip import skip_masked_tiles

H100 = PRESETS["sm_90a"]


def _rows(name: str, options: CodegenOptions | None = None, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes("default"), **sizes}
    sch = default_schedule(name, "default", op.program("default", **sizes), target="cuda", options=options)
    target = Target("cuda", H100, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(sch.program)), target)
    (kernel,) = plan.kernels
    assert isinstance(kernel.rows, onchip.RowsOnChip), kernel.rows
    return gpu, plan, target, kernel.rows


@pytest.mark.parametrize(("name", "low"), [("sum_sum", 1.0), ("rmsnorm_amax", 1e-3), ("layernorm_stats", 3.16e-3)])
def test_a_divisor_of_proven_range_is_multiplied_by_its_reciprocal(name, low):
    _, _, _, rows = _rows(name)
    (d,) = rows.divisions
    assert d.chosen, d.reason
    found = float(d.reason.split("[")[1].split(",")[0])
    assert found == pytest.approx(low, rel=1e-2)
    assert "rcp_rz" in "\n".join(rows.describe())


@pytest.mark.parametrize("name", [
    "l2norm_stable",   # x / max|x|: the max may be subnormal
    "softmax",         # the denominator of a temporary's exponentials: no range fact
])
def test_a_divisor_without_a_proven_range_is_tested_per_row(name):
    gpu, plan, target, rows = _rows(name)
    (d,) = rows.divisions
    assert d.chosen and d.guarded and "may be 0 or near it" in d.reason
    assert "at run time, else divided" in d.describe()
    text = emit_planned(gpu, plan, target).text
    ok = re.search(r"const bool (pf_ok\d+) = pf::rcp_normal\(", text).group(1)
    # one loop multiplies (where the row's divisor passed), the other divides
    assert f"if ({ok})" in text and " * pf_rcp" in text
    assert re.search(r"\} *\n\s*else \{", text) and "/ pf_" in text.split(f"if ({ok})")[1]


def test_the_option_keeps_the_division():
    off = CodegenOptions(reciprocal_rows=False)
    gpu, plan, target, rows = _rows("sum_sum", off)
    (d,) = rows.divisions
    assert not d.chosen and "reciprocal_rows is off" in d.reason
    assert "rcp_rz" not in emit_planned(gpu, plan, target).text


def test_the_reciprocal_is_computed_once_per_row_after_its_reduction():
    gpu, plan, target, _ = _rows("sum_sum", **ops.get("sum_sum").presets["default"])
    text = emit_planned(gpu, plan, target).text
    assert text.count("pf::rcp_rz(") == 1
    body = text[text.index("pf::rcp_rz("):]
    # the second pass multiplies; no division is left in the kernel's element loops
    assert " * pf_rcp" in body and " / sqrt" not in text
    assert text.index("__syncthreads()") < text.index("pf::rcp_rz(")


def test_a_divisor_that_may_exceed_2_to_126_is_not_proven():
    # d = max(Σx², 1): at least 1, but its finite values reach f32's largest, whose reciprocal is subnormal (such
    # a divisor is tested per row at run time).
    x = Tensor("x", (Const(8, dt.i32),), dt.f32, INPUT)
    square = BinOp("*", _load(x), _load(x))
    b = finite_bounds(BinOp("max", square, Const(1.0, dt.f32)), {}, {})
    assert b.flo == 1.0 and b.fhi == F32_MAX


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["sum_sum", "rmsnorm_amax", "layernorm_stats"])
def test_row_reciprocals_compile_warning_free_for_cuda_and_hip_headers(name):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    gpu, plan, target, _ = _rows(name, N=3, M=42)
    source = emit_planned(gpu, plan, target)
    assert "pf::rcp_rz(" in source.text
    compile_gpu(source.text, f"rcp_{name}", "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)


# ------------------------------------------------------------------------------ soundness of the bounds

def _load(t: Tensor) -> TileLoad:
    return TileLoad(t, (Var("i"),))


NONNEG = Tensor("p", (Const(8, dt.i32),), dt.f32, INPUT, sign="nonnegative")
ANY = Tensor("q", (Const(8, dt.i32),), dt.f32, INPUT)
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 2.0 ** -149, 2.0 ** -126, 1.0, 10.0, 3e38, F32_MAX]

_leaves = st.one_of(
    st.sampled_from([_load(NONNEG), _load(ANY)]),
    st.floats(-1e6, 1e6, width=32).map(lambda v: Const(float(v), dt.f32)),
)


def _extend(children):
    unary = st.tuples(st.sampled_from(["sqrt", "exp", "neg", "abs"]), children).map(lambda t: Call(t[0], (t[1],)))
    binary = st.tuples(st.sampled_from(["+", "-", "*", "max", "min"]), children, children).map(
        lambda t: BinOp(t[0], t[1], t[2]))
    square = children.map(lambda c: BinOp("*", c, c))
    by_const = st.tuples(children, st.sampled_from([3.0, -7.0, 0.5, 8192.0])).map(
        lambda t: BinOp("/", t[0], Const(t[1], dt.f32)))
    # a masked row's 0 (after a loop in warp fragments): the value or 0, either way round
    zero, cond = Const(0.0, dt.f32), BinOp("<", _load(ANY), Const(0.0, dt.f32))
    or_zero = st.tuples(children, st.booleans()).map(
        lambda t: Select(cond, t[0], zero) if t[1] else Select(cond, zero, t[0]))
    return st.one_of(unary, binary, square, by_const, or_zero)


_exprs = st.recursive(_leaves, _extend, max_leaves=6)
_values = st.one_of(st.sampled_from(SPECIAL), st.floats(width=32, allow_nan=True, allow_infinity=True))


def _eval(e: Expr, env: dict[str, np.float32]) -> np.float32:
    """``e`` in f32 as the GPU computes it (correctly rounded; exp within a few ulp, here NumPy's)."""
    with np.errstate(all="ignore"):
        if isinstance(e, Const):
            return np.float32(e.value)
        if isinstance(e, TileLoad):
            return env[e.tensor.name]
        if isinstance(e, Select):
            return _eval(e.true_value if _eval(e.cond.a, env) < _eval(e.cond.b, env) else e.false_value, env)
        if isinstance(e, Call):
            x = _eval(e.args[0], env)
            return {"sqrt": np.sqrt, "exp": np.exp, "neg": np.negative, "abs": np.abs}[e.fn](x)
        a, b = _eval(e.a, env), _eval(e.b, env)
        if e.op in ("max", "min"):  # NaN-propagating, as pf::max
            return (np.maximum if e.op == "max" else np.minimum)(a, b)
        return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[e.op](a, b)


@settings(max_examples=400, deadline=None)
@given(_exprs, _values, _values)
def test_the_bounds_hold_for_every_f32_value(e, p, q):
    env = {"p": np.float32(abs(p)) if not math.isnan(p) else np.float32(0.0), "q": np.float32(q)}
    b = finite_bounds(e, {}, {})
    v = float(_eval(e, env))
    if math.isnan(v):
        return
    assert b.lo <= v <= b.hi
    if math.isfinite(v) and not (b.zero and v == 0):  # (zero: the finite non-zero values are bounded, or it is 0)
        assert b.flo <= v <= b.fhi


def test_a_range_fact_bounds_the_non_zero_values():
    from polyfuse.transforms.ranges import ValueRange

    s = Tensor("s", (Const(8, dt.i32),), dt.f32, INPUT)
    b = finite_bounds(_load(s), {}, {"s": ValueRange("s", 1.0, 4096.0, "a softmax denominator")})
    assert (b.flo, b.fhi, b.zero) == (1.0, 4096.0, True)
    assert SMALLEST_NORMAL <= 1.0 / b.fhi


def test_a_masked_row_s_zero_keeps_the_non_zero_values_bounds():
    # After a loop in warp fragments a ragged tile's rows past the edge read 0 (a masked load, or a select of 0):
    # 0 is a special divisor (x·rcp_rz(0) = x/0), so the finite non-zero values keep the fact's bounds.
    from polyfuse.transforms.ranges import ValueRange

    s = Tensor("s", (Const(8, dt.i32),), dt.f32, INPUT)
    fact = {"s": ValueRange("s", 1.0, 4096.0, "a softmax denominator")}
    edge = BinOp("<", Var("i"), Const(5, dt.i32))
    for e in (TileLoad(s, (Var("i"),), mask=edge, other=Const(0.0, dt.f32)),
              Select(edge, _load(s), Const(0.0, dt.f32)), Select(edge, Const(0.0, dt.f32), _load(s))):
        b = finite_bounds(e, {}, fact)
        assert (b.lo, b.hi, b.flo, b.fhi, b.zero) == (0.0, 4096.0, 1.0, 4096.0, True), e
    # another masked value is not known
    other = TileLoad(s, (Var("i"),), mask=edge, other=Const(-1.0, dt.f32))
    assert finite_bounds(other, {}, fact).flo == -F32_MAX


@pytest.mark.parametrize("device", ["sm_90a", "sm_80"])
@pytest.mark.parametrize(("name", "sizes"), [("attn_causal", {}), ("attn_global", {"Sq": 300, "Skv": 300})])
def test_attention_s_last_quotient_is_multiplied_by_its_reciprocal(device, name, sizes):
    # out = pv / row_sum after the loop in warp fragments: row_sum's fact ([1, Skv], or 0 in a ragged tile's rows
    # past the edge) proves rcp_rz(row_sum) normal; each thread computes it once per row it holds.
    op = ops.get(name)
    sizes = {**op.presets["prefill"], **sizes}
    for target, chosen in ((CUDA, True), (CUDA.with_options(reciprocal_rows=False), False)):
        sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda",
                               device=PRESETS[device])
        st = stages(sch, dataclasses.replace(target, device=PRESETS[device]))
        plan, epilogue = st.dump("plan"), st.source.text.split("// out\n")[-1]
        if chosen:
            assert "division out: x / d, d = load(row_sum" in plan and "as x · rcp_rz(d)" in plan, plan
            assert re.search(r"const float (pf_rcp\d+) = pf::rcp_rz\(", epilogue)
            assert " / pf_row" not in epilogue
        else:
            assert "divided per element (the options' reciprocal_rows is off)" in plan
            assert "pf::rcp_rz" not in epilogue and " / pf_row" in epilogue


@pytest.mark.nvcc
@pytest.mark.parametrize("device", ["sm_90a", "sm_80"])
def test_attention_s_reciprocal_quotient_compiles(device):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    op = ops.get("attn_global")
    sizes = {**op.presets["prefill"], "Sq": 300, "Skv": 300}
    sch = default_schedule("attn_global", "prefill", op.program("prefill", **sizes), target="cuda",
                           device=PRESETS[device])
    text = stages(sch, dataclasses.replace(CUDA, device=PRESETS[device])).source.text
    assert "pf::rcp_rz(" in text.split("// out\n")[-1]
    compile_gpu(text, f"quotient_{device}", "cuda", device, options=CompileOptions(werror=True), compile_only=True)


# ------------------------------------------------------------------------------ the primitive on its own

RCP_KERNEL = r"""
#include "polyfuse_gpu.h"
extern "C" __global__ void rcp_probe(const float* __restrict__ x, float* __restrict__ r, int64_t n)
{
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) r[i] = pf::rcp_rz(x[i]);
}
"""


def _rcp_rz(x: np.ndarray) -> np.ndarray:
    """1/x rounded toward zero to f32: 1/x in f64 (an f32 reciprocal that is not exact lies at least 2^-48
    relatively from every f32, so the f64 rounding never crosses one), then one step toward 0 where the f32
    rounding went away from it."""
    with np.errstate(all="ignore"):
        exact = 1.0 / x.astype(np.float64)
        r = exact.astype(np.float32)
        away = np.isfinite(exact) & (np.abs(r.astype(np.float64)) > np.abs(exact))
        r[away] = np.nextafter(r[away], np.float32(0))
        big = np.isfinite(exact) & np.isinf(r)  # (past f32's largest: toward zero is the largest)
        r[big] = np.copysign(np.finfo(np.float32).max, exact[big]).astype(np.float32)
    return r


def _probe_values(rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        np.array(SPECIAL + [-v for v in SPECIAL] + [3.0, 7.0, 2.0 ** 126, 2.0 ** -127], np.float32),
        (rng.standard_normal(1 << 16) * np.exp2(rng.uniform(-130, 130, 1 << 16))).astype(np.float32),
        rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32),  # every bit pattern
    ])


@pytest.mark.nvcc
def test_rcp_rz_compiles():
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    compile_gpu(RCP_KERNEL, "rcp_probe", "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)


@pytest.mark.gpu
def test_rcp_rz_rounds_toward_zero_on_the_gpu():
    from polyfuse.runtime.loaders import loader

    try:
        driver = loader("cuda")
    except BackendUnavailable as err:
        pytest.skip(str(err))
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):  # (magnitudes past f32's range become ±inf: tested too)
        x = _probe_values(rng)
    r = np.zeros_like(x)
    image = compile_gpu(RCP_KERNEL, "rcp_probe", "cuda", driver.device_spec().arch, options=CompileOptions(werror=True))
    function = driver.function(driver.load(image.read_bytes()), "rcp_probe", 0)
    pointers, owners = [], []
    for host in (x, r):
        pointer, owner = driver.alloc(host.nbytes)
        driver.to_device(pointer, host.ctypes.data, host.nbytes)
        pointers.append(pointer)
        owners.append(owner)
    driver.launch(function, -(-x.size // 256), 256, 0, pointers, [x.size])
    driver.synchronize()
    driver.to_host(r.ctypes.data, pointers[1], r.nbytes)
    want = _rcp_rz(x)
    normal = np.abs(x) >= SMALLEST_NORMAL  # (subnormal divisors: the code generator never plans them)
    same = (r.view(np.uint32) == want.view(np.uint32)) | (np.isnan(r) & np.isnan(want))
    assert np.all(same[normal]), (x[normal & ~same][:5], r[normal & ~same][:5], want[normal & ~same][:5])


@pytest.mark.gpu
def test_a_row_whose_divisor_fails_its_test_divides_and_matches_numpy():
    # l2norm_stable's x / max|x|: rows whose max is subnormal or above 2^126 take the division, the others the
    # reciprocal; every row against NumPy within the operator's tolerance.
    from polyfuse.pipeline import build

    op = ops.get("l2norm_stable")
    sizes = {"N": 6, "M": 42}
    try:
        kernel = build(default_schedule("l2norm_stable", "default", op.program("default", **sizes), target="cuda"),
                       "cuda", sizes=sizes, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert "pf::rcp_normal(" in kernel.kernel_source.text
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 42))
    x[1] *= 1e-40                       # max|x| subnormal: divided
    x[2] = 0.0
    x[2, 5] = 2.0 ** 127                # max|x| above 2^126: divided (out = 2^127 exactly)
    x[3] = 0.0
    x[3, 7] = -(2.0 ** -140)            # one subnormal entry
    x[4] *= 2.0 ** 120                  # large, still multiplied
    x[5] *= 2.0 ** -120                 # small, still multiplied
    inputs = {"x": x.astype(np.float32)}
    got = kernel.run(inputs)
    result = ops.compare(got, op.reference(inputs, "default", sizes), op.tolerance("default", sizes))
    assert result.ok, f"{result.line()} worst {result.worst}"
