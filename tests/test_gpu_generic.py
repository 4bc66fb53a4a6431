"""One GPU kernel for every value of a catalog operator's outer sizes (``Operator.gpu_symbolic``).

The generic kernel takes the rows or the batch as size parameters; every decision of the GPU schedule and plan
is the one for fixed sizes, so at each bench preset its source and plan equal the fixed kernel's but for the size
parameters.  It compiles with warnings as errors for sm_90a, one cached image serves several values of a size,
the launch refuses a size past what its 32-bit indices were compiled for, and (marked ``gpu``) one kernel runs at
several sizes, 1 and a prime among them, against NumPy.
"""

from __future__ import annotations

import difflib
import re

import numpy as np
import pytest

import polyfuse.pipeline
from polyfuse import ops
from polyfuse.cli.stages import Subject
from polyfuse.emit_cpp import CUDA, Target, emit
from polyfuse.emit_cpp.widths import INT32_MAX, index_widths
from polyfuse.errors import BackendUnavailable, LaunchError
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build, stages
from polyfuse.runtime.cache import CACHE_ENV, cache_info
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.runtime.kernel import KernelBase
from polyfuse import tiling

GENERIC = [(n, m) for n in ops.names() for m in ops.get(n).gpu_symbolic]
BUILD = CompileOptions(fp_contract=True, werror=True)
"""As ``polyfuse check --backend cuda`` builds (contracted multiply-adds), with warnings as errors."""


def _preset(name: str, mode: str) -> dict[str, int]:
    """The bench preset of ``mode``, a symbolic size of 1 taken as 2: at 1 the fixed kernel folds its index to 0."""
    op = ops.get(name)
    sizes = dict(op.presets[mode])
    return {k: max(v, 2) if k in op.gpu_symbolic[mode] else v for k, v in sizes.items()}


def _as_fixed(text: str, values: dict[str, int], number: str) -> str:
    """``text`` of a generic kernel with its size parameters dropped from the signatures and each use replaced by
    its value (``number`` formats it as the fixed kernel prints constants); the device line is kept as it is."""
    lines = []
    for line in text.split("\n"):
        if not line.lstrip("/ ").startswith("device:"):
            line = re.sub(rf", const int64_t (?:{'|'.join(values)})\b", "", line)
            for k, v in values.items():
                line = re.sub(rf"\b{k}\b", number.format(v), line)
        lines.append(line)
    return "\n".join(lines)


def _differences(fixed: str, generic: str) -> list[str]:
    return list(difflib.unified_diff(fixed.split("\n"), generic.split("\n"), lineterm="", n=0))[2:]


@pytest.mark.parametrize(("name", "mode"), GENERIC)
def test_generic_kernel_equals_the_fixed_one_but_for_the_size_parameters(name, mode):
    op, sizes = ops.get(name), _preset(name, mode)
    fixed = stages(default_schedule(name, mode, op.program(mode, **sizes), "cuda"), "cuda")
    generic = stages(default_schedule(name, mode, op.generic_program(mode, "cuda", **sizes), "cuda"), "cuda")
    symbolic = {k: sizes[k] for k in op.gpu_symbolic[mode]}
    assert generic.source.sizes == tuple(symbolic)
    assert _differences(fixed.source.text, _as_fixed(generic.source.text, symbolic, "({})")) == []
    assert _differences(str(fixed.plan), _as_fixed(str(generic.plan), symbolic, "{}")) == []
    assert generic.source.size_limit == INT32_MAX


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "mode"), GENERIC)
def test_generic_kernel_compiles_with_warnings_as_errors_for_sm90a(name, mode):
    op = ops.get(name)
    source = stages(default_schedule(name, mode, op.generic_program(mode, "cuda", **op.presets[mode]), "cuda"),
                    "cuda").source
    assert source.target.arch == "sm_90a"
    compile_gpu(source.text, source.entry, "cuda", source.target.arch, options=BUILD, compile_only=True)


def test_operators_declare_only_sizes_of_the_mode():
    for name, mode in GENERIC:
        op = ops.get(name)
        assert set(op.gpu_symbolic[mode]) <= set(op.defaults[mode]) and op.gpu_symbolic_note
        assert op.symbolic_sizes(mode, "cuda") == op.symbolic_sizes(mode, "hip") == op.gpu_symbolic[mode]
    assert ops.get("attn_causal").symbolic_sizes("decode", "cuda") == ()
    assert ops.get("rmsnorm_amax").symbolic_sizes(None, "cpp") == ("N",)


@pytest.mark.nvcc
@pytest.mark.parametrize(("size", "images"), [("N", 1), ("M", 3)])
def test_one_cached_gpu_image_for_every_value_of_a_symbolic_size(monkeypatch, tmp_path, size, images):
    """The CLI's CUDA kernel of softmax at three row counts is one image in the cache; at three row lengths three."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    sources = set()
    for value in (40, 41, 42):
        subject = Subject.of("softmax", None, {size: value})
        source = stages(subject.generic_schedule("cuda"), Target("cuda")).source
        compile_gpu(source.text, source.entry, "cuda", source.target.arch, options=CompileOptions(fp_contract=True))
        sources.add(source.text)
    assert len(sources) == cache_info(tmp_path).entries == images


def test_show_prints_the_generic_kernel(capsys):
    from polyfuse.cli import main

    assert main(["show", "softmax", "--stage", "cuda", "--set", "N=7"]) == 0
    out = capsys.readouterr().out
    assert "size parameters: N)" in out and "const int64_t N)" in out and "pf_bid % N" in out


def test_widths_assume_sizes_up_to_the_limit_and_the_launch_refuses_larger_ones():
    op = ops.get("softmax")
    tiles = tiling.to_tiles(default_schedule("softmax", "default", op.generic_program(None, "cuda"), "cuda").program)
    host = index_widths(tiles)
    assert host.loop == "int64_t" and host.size_limit is None
    gpu = index_widths(tiles, INT32_MAX)
    assert gpu.loop == "int" and gpu.size_limit == INT32_MAX and "N up to 2147483647" in gpu.reason
    assert emit(tiles, CUDA).size_limit == INT32_MAX and emit(tiles, "cpp").size_limit is None
    kernel = KernelBase(emit(tiles, CUDA))
    assert kernel.resolve_sizes([(INT32_MAX, 40)], {}) == {"N": INT32_MAX}
    with pytest.raises(LaunchError, match=r"N=2147483648 exceed 2147483647"):
        kernel.resolve_sizes([(INT32_MAX + 1, 40)], {})


# ------------------------------------------------------------------ on the GPU

RUNS = [("softmax", "default", "N", (1, 7, 97, 1000)),
        ("layernorm_stats", "default", "N", (1, 13, 256)),
        ("variance", "default", "B", (1, 31, 64)),
        ("inertia", "default", "B", (1, 5, 32)),
        ("attn_causal", "prefill", "B", (1, 3, 4)),
        ("attn_gqa", "prefill", "B", (1, 3))]


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "mode", "size", "values"), RUNS, ids=[r[0] for r in RUNS])
def test_one_gpu_kernel_runs_at_every_outer_size(name, mode, size, values):
    op = ops.get(name)
    try:
        kernel = build(default_schedule(name, mode, op.generic_program(mode, "cuda"), "cuda"), "cuda",
                       fp_contract=True, werror=True)
    except BackendUnavailable as err:
        pytest.skip(str(err))
    for value in values:
        sizes = op.sizes(mode, {size: value})
        inputs = op.inputs(3, mode, sizes)
        results = kernel.run(inputs)  # the size read off the inputs' shapes
        comparison = ops.compare({k: np.asarray(v) for k, v in results.items()}, op.reference(inputs, mode, sizes),
                                 op.tolerance(mode, sizes))
        assert comparison.ok, f"{name} {size}={value}: {comparison.line()} {comparison.worst}"


@pytest.mark.gpu
def test_check_builds_one_gpu_kernel_for_every_row_count(capsys, monkeypatch, tmp_path):
    """``check --backend cuda`` at three values of N compiles one image and builds one kernel object."""
    from polyfuse.cli import main

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(polyfuse.pipeline, "_KERNELS", type(polyfuse.pipeline._KERNELS)())
    for value in (40, 41, 43):
        assert main(["check", "softmax", "--backend", "cuda", "--set", f"N={value}"]) == 0
        assert capsys.readouterr().out.rstrip().endswith(" OK")
    assert cache_info(tmp_path).entries == 1 and len(polyfuse.pipeline._KERNELS) == 1
