"""Tile programs to source text: one C-family emitter core and one small subclass per backend.

``emit(tile_program, target)`` returns a :class:`KernelSource` (text, entry point, signature).
Backends: ``cpp`` (host C++ with OpenMP, :mod:`polyfuse.emit_cpp.host`), ``cuda``
(:mod:`polyfuse.emit_cpp.cuda`) and ``hip`` (:mod:`polyfuse.emit_cpp.hip`).

The GPU backends decide first and print second.  Their inputs are the tile program, the target's
:class:`~polyfuse.device.DeviceSpec` (what the GPU has) and its :class:`CodegenOptions` (what the code
generator may do), both printed at the top of the source and so part of the kernel cache's key.  Where each
decision is made:

* :mod:`polyfuse.tiling.gpu` — the GPU tile passes (mask simplification, tile skipping, product inlining, the
  grid and split-k distribution into kernels): ``polyfuse show --stage tile --target cuda``;
* :mod:`polyfuse.emit_cpp.plan` — the :class:`~polyfuse.emit_cpp.plan.ProgramPlan`: threads, loops' register,
  resident and kept-tile decisions (:mod:`~polyfuse.emit_cpp.registers`, :mod:`~polyfuse.emit_cpp.resident`,
  :mod:`~polyfuse.emit_cpp.stream`), row groups (:mod:`~polyfuse.emit_cpp.rows`), loops run by warp groups
  (:mod:`~polyfuse.emit_cpp.groups`), f32 inputs split before the
  kernels (:mod:`~polyfuse.emit_cpp.presplit`), shared memory and its peak against the device, launch bounds:
  ``polyfuse show --stage plan``;
* :mod:`polyfuse.emit_cpp.dotplan` — each dot's :class:`~polyfuse.emit_cpp.dotplan.DotPlan` (instruction,
  operand layouts and sources, warp tiling, split ``k``) and the accumulator ``FragmentLayout``;
* the printers (:mod:`~polyfuse.emit_cpp.cuda`, :mod:`~polyfuse.emit_cpp.mma`, :mod:`~polyfuse.emit_cpp.staging`
  and the printing halves of the modules above) read the plan and write text once, front to back; the
  printed kernel's shared memory is checked against the plan's.

A new instruction family is one more ``DotPlan`` instruction with its operand layout and fragment layout,
decided in :mod:`~polyfuse.emit_cpp.dotplan` from the device's features, and one printer of it.
"""

from __future__ import annotations

from polyfuse.emit_cpp.cuda import CudaEmitter
from polyfuse.emit_cpp.hip import HipEmitter
from polyfuse.emit_cpp.host import emit_host
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.emit_cpp.plan import ProgramPlan, gpu_plan
from polyfuse.emit_cpp.target import CUDA, HIP, HOST, Arg, KernelSource, Launch, Target, entry_name
from polyfuse.errors import BackendUnavailable
from polyfuse.tiling.gpu import GpuProgram
from polyfuse.tiling.htile import TileProgram

__all__ = ["CUDA", "HIP", "HOST", "Arg", "CodegenOptions", "KernelSource", "Launch", "ProgramPlan", "Target", "emit",
           "emit_planned", "gpu_plan"]

_PRINTERS = {"cuda": CudaEmitter, "hip": HipEmitter}

_DEFAULTS = {"cpp": HOST, "cuda": CUDA, "hip": HIP}


def emit(tile_program: TileProgram, target: Target | str = HOST) -> KernelSource:
    """Source text of ``tile_program`` for ``target`` (a :class:`Target` or a backend name)."""
    target = _target(target)
    if target.backend == "cpp":
        return emit_host(tile_program)
    gpu, plan = gpu_plan(tile_program, target)
    return emit_planned(gpu, plan, target)


def emit_planned(gpu: GpuProgram, plan: ProgramPlan, target: Target) -> KernelSource:
    """The GPU source of a program cut into kernels (:func:`~polyfuse.tiling.gpu.lower_for_gpu`), printed as
    ``plan`` (:func:`gpu_plan`) says."""
    return _PRINTERS[target.backend](gpu, target, plan).kernel(entry_name(gpu.program.name))


def _target(target: Target | str) -> Target:
    if isinstance(target, str):
        if target not in _DEFAULTS:
            raise BackendUnavailable(f"no emitter for backend {target!r}; available: {', '.join(_DEFAULTS)}")
        return _DEFAULTS[target]
    if target.backend not in _DEFAULTS:
        raise BackendUnavailable(f"no emitter for backend {target.backend!r}; available: {', '.join(_DEFAULTS)}")
    return target
