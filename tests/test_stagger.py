"""Staggered loops (:mod:`polyfuse.emit_cpp.stagger`): which loops start each block at a step of its own, how the
CUDA source runs them, that the source compiles, and (marked ``gpu``) that the results are the unstaggered
kernel's bits where the folds are exact and within the bound of a sum in any order where they are not."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from kernel_pairs import assert_same_bits_and_numpy
from polyfuse import ops
from polyfuse.device import PRESETS
from polyfuse.emit_cpp import CodegenOptions, Target, emit_planned, gpu_plan
from polyfuse.errors import BackendUnavailable
from polyfuse.ir import ProgramBuilder, cast, reduce
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.tiling import to_tiles
from polyfuse.tiling.skip import skip_masked_tiles
from polyfuse.transforms.schedule import Schedule

H100 = PRESETS["sm_90a"]
OFF = CodegenOptions(stagger_loops=False)


def _planned(program, options: CodegenOptions | None = None, device=H100):
    target = Target("cuda", device, options or CodegenOptions())
    gpu, plan = gpu_plan(skip_masked_tiles(to_tiles(program)), target)
    return gpu, plan, target


def _staggers(plan) -> list:
    return [lp.stagger for k in plan.kernels for lp in k.loops.values() if lp.stagger is not None]


def _gate_product(name: str, S: int, H: int, E: int, dtype: str, rows: int, step: int):
    """A user's gate product ``z += x·w`` (``dtype`` operands; f16 ones multiplied in f32), scheduled as
    moe_routing's gate is: ``rows`` rows of x per block, the ``H`` hidden elements in steps of ``step``, every
    block multiplying by the same tiles of w."""
    p = ProgramBuilder(name)
    x = p.input("x", (S, H), dtype)
    w = p.input("w", (H, E), dtype)
    z = p.output("z", (S, E), "f32")
    with p.nest("s_gate", s=S, e=E, h=reduce(H)) as (s, e, h):
        z[s, e] = z[s, e] + (x[s, h] * w[h, e] if dtype == "f32" else cast("f32", x[s, h]) * cast("f32", w[h, e]))
    sch = Schedule(p.build())
    s, e, h = sch.get_loops("s_gate")
    _, s1 = sch.split(s, [None, rows])
    h0, h1 = sch.split(h, [None, step])
    sch.reorder([h0, s1, e, h1])
    partial = sch.rfactor(h0)
    sch.reverse_compute_at("s_gate", sch.loop(partial, h0.name))
    return sch.program


def _gate():
    """f32 operands, 64 x 96 x 16 in blocks of 16 rows and steps of 32: staged per step."""
    return _gate_product("gate", 64, 96, 16, "f32", 16, 32)


def _gemm16():
    """f16 operands, 512 x 256 x 64 in blocks of 64 rows and steps of 64: its loop keeps both operand tiles,
    copied one iteration ahead into two halves."""
    return _gate_product("gemm16", 512, 256, 64, "f16", 64, 64)


def test_moe_routing_gate_is_staggered():
    op = ops.get("moe_routing")
    sizes = op.presets["default"]
    gpu, plan, target = _planned(default_schedule("moe_routing", "default", op.program("default", **sizes),
                                                  target="cuda").program)
    (st,) = _staggers(plan)
    assert st.var == "h_0" and st.shared == ("w",) and len(st.first) == 1
    assert "staggered: block b runs step (pf_step_h_0 + b) mod 16" in str(plan)
    text = emit_planned(gpu, plan, target).text
    assert "for (int pf_step_h_0 = 0; pf_step_h_0 < (16); ++pf_step_h_0)" in text
    assert "const int h_0 = (pf_step_h_0 + static_cast<int>(blockIdx.x % (16))) % (16);" in text
    assert "(pf_step_h_0 == 0)" in text and "(h_0 == (0))" not in text  # the fold starts at the first step run
    # the option turns it off: the loop as it was
    gpu, plan, target = _planned(default_schedule("moe_routing", "default", op.program("default", **sizes),
                                                  target="cuda", options=OFF).program, OFF)
    assert _staggers(plan) == []
    assert "for (int h_0 = 0; h_0 < (16); ++h_0)" in emit_planned(gpu, plan, target).text


def test_a_loop_copying_its_tiles_ahead_is_staggered_by_its_iterations():
    # the copies are for the step each iteration runs; the halves, the first iteration and the last go by the
    # iteration's number, so two consecutive iterations never share a half (steps 3 then 0 would)
    gpu, plan, target = _planned(_gemm16())
    (st,) = _staggers(plan)
    (kernel,) = plan.kernels
    (lp,) = kernel.loops.values()
    assert lp.streams is not None and lp.streams.ahead and lp.streams.stagger == st
    text = emit_planned(gpu, plan, target).text
    assert "[[maybe_unused]] const int pf_step_h_0 = 0;" in text  # the first iteration's tiles, before the loop
    assert "if (pf_step_h_0 + 1 < (4))" in text and "const int pf_step_h_0 = pf_next;" in text
    assert text.count("const int h_0 = (pf_step_h_0 + static_cast<int>(blockIdx.x % (4))) % (4);") == 3
    assert "(pf_keep2 + (pf_step_h_0 & 1) * " in text and "& 1)" not in text.replace("(pf_step_h_0 & 1)", "")
    # without the option: the loop as it was
    gpu, plan, target = _planned(_gemm16(), OFF)
    assert _staggers(plan) == [] and "pf_step" not in emit_planned(gpu, plan, target).text


def test_a_users_gate_product_is_staggered():
    _, plan, _ = _planned(_gate())
    (st,) = _staggers(plan)
    assert st.shared == ("w",)


@pytest.mark.parametrize("name,mode", [("attn_global", "prefill"), ("attn_global", "decode"),
                                       ("attn_causal", "prefill"), ("quant_gemm", "default"),
                                       ("performer", "default"), ("softmax", "default")])
def test_rolling_updates_keep_their_order(name, mode):
    # their loops read running statistics (a rolling update's repair) or keep operand tiles copied in step order
    op = ops.get(name)
    sizes = op.sizes(mode)
    _, plan, _ = _planned(default_schedule(name, mode, op.program(mode, **sizes), target="cuda").program)
    assert _staggers(plan) == []


def test_a_weight_beyond_its_share_of_the_l2_is_not_staggered():
    # w is 96 x 16 f32 = 6 KB: staggered with an L2 of 4 x 6 KB, not with a smaller one (blocks at different steps
    # would each fetch it from memory), nor where the L2 is unknown
    assert len(_staggers(_planned(_gate(), device=dataclasses.replace(H100, l2_bytes=4 * 6144))[1])) == 1
    assert _staggers(_planned(_gate(), device=dataclasses.replace(H100, l2_bytes=4 * 6144 - 1))[1]) == []
    assert _staggers(_planned(_gate(), device=dataclasses.replace(H100, l2_bytes=0))[1]) == []


def test_blocks_reading_only_their_own_rows_are_not_staggered():
    # no tile that every block reads at the same step: nothing to spread
    q = ProgramBuilder("rows_only")
    x = q.input("x", (64, 96), "f32")
    o = q.output("o", (64,), "f32")
    with q.nest("s", i=64, j=reduce(96)) as (i, j):
        o[i] = o[i] + x[i, j] * x[i, j]
    _, plan, _ = _planned(Schedule(q.build()).program)
    assert _staggers(plan) == []


@pytest.mark.nvcc
def test_staggered_sources_compile_for_sm90a():
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    op = ops.get("moe_routing")
    sizes = op.sizes("default")
    gpu, plan, target = _planned(default_schedule("moe_routing", "default", op.program("default", **sizes),
                                                  target="cuda").program)
    assert _staggers(plan)
    source = emit_planned(gpu, plan, target)
    compile_gpu(source.text, "moe_routing", "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)
    for name, program in (("gate", _gate()), ("gemm16", _gemm16())):
        gpu, plan, target = _planned(program)
        assert _staggers(plan)
        source = emit_planned(gpu, plan, target)
        compile_gpu(source.text, name, "cuda", "sm_90a", options=CompileOptions(werror=True), compile_only=True)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["test", "default"])
def test_moe_routing_staggered_gives_the_same_bits(preset):
    # the catalog's gate inputs make every logit exact in f32, so any order of the steps gives the same bits
    from polyfuse.pipeline import build

    op = ops.get("moe_routing")
    sizes = op.sizes("default") if preset == "test" else dict(op.presets["default"])
    program = op.program("default", **sizes)
    try:
        staggered = build(default_schedule("moe_routing", "default", program, target="cuda"), "cuda", sizes=sizes)
        plain = build(default_schedule("moe_routing", "default", program, target="cuda", options=OFF), "cuda",
                      sizes=sizes, codegen=OFF)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert "pf_step_h_0" in staggered.kernel_source.text and "pf_step_h_0" not in plain.kernel_source.text
    assert_same_bits_and_numpy(op, "default", sizes, staggered, plain, seed=3)


def _assert_within_any_order_bound(program, dtype, shape: tuple[int, int, int], seed: int, per_add: float) -> None:
    """The staggered and the plain kernel of ``program`` (z = x·w of ``shape`` = (S, H, E), ``dtype`` operands)
    on random normal operands: each output within ``gamma = n·e/(1 - n·e)`` (n = H terms, e = ``per_add`` units
    of 2^-24 per addition) times the sum of the magnitudes of its terms, the bound of a sum in any order."""
    from polyfuse.pipeline import build

    S, H, E = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, H)).astype(dtype)
    w = rng.standard_normal((H, E)).astype(dtype)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    e = per_add * 2.0 ** -24
    bound = H * e / (1 - H * e) * magnitude
    try:
        staggered = build(program, "cuda")
        plain = build(program, "cuda", codegen=OFF)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    assert "pf_step_h_0" in staggered.kernel_source.text and "pf_step_h_0" not in plain.kernel_source.text
    for kernel in (staggered, plain):
        z = np.asarray(kernel.run({"x": x, "w": w})["z"], dtype=np.float64)
        assert np.all(np.abs(z - exact) <= bound)


@pytest.mark.gpu
def test_a_staggered_sum_is_within_the_bound_of_any_order():
    # random f32 operands: each output is a sum of 96 products whose order differs per block; the error of a
    # sum of n terms in any order (FMA or not) is at most gamma_n = n·u/(1 - n·u) times the sum of their
    # magnitudes (u = 2^-24), for the staggered and the plain kernel alike
    _assert_within_any_order_bound(_gate(), np.float32, (64, 96, 16), seed=5, per_add=1.0)


@pytest.mark.gpu
def test_a_staggered_loop_copying_ahead_is_within_the_bound():
    # f16 operands: each product is exact in f32; the tensor cores add in f32 with at most a truncation (2u) per
    # addition, in another order per block when staggered
    _assert_within_any_order_bound(_gemm16(), np.float16, (512, 256, 64), seed=7, per_add=2.0)
