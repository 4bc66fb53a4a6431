"""Tile programs to source text: one C-family emitter core and one small subclass per backend.

``emit(tile_program, target)`` returns a :class:`KernelSource` (text, entry point, signature).
Backends: ``cpp`` (host C++ with OpenMP, :mod:`polyfuse.emit_cpp.host`), ``cuda``
(:mod:`polyfuse.emit_cpp.cuda`) and ``hip`` (:mod:`polyfuse.emit_cpp.hip`).
"""

from __future__ import annotations

from polyfuse.emit_cpp.target import CUDA, HIP, HOST, Arg, KernelSource, Launch, Target
from polyfuse.errors import BackendUnavailable
from polyfuse.tiling.htile import TileProgram

__all__ = ["CUDA", "HIP", "HOST", "Arg", "KernelSource", "Launch", "Target", "emit"]

_DEFAULTS = {"cpp": HOST, "cuda": CUDA, "hip": HIP}


def emit(tile_program: TileProgram, target: Target | str = HOST) -> KernelSource:
    """Source text of ``tile_program`` for ``target`` (a :class:`Target` or a backend name)."""
    if isinstance(target, str):
        if target not in _DEFAULTS:
            raise BackendUnavailable(f"no emitter for backend {target!r}; available: {', '.join(_DEFAULTS)}")
        target = _DEFAULTS[target]
    if target.backend == "cpp":
        from polyfuse.emit_cpp.host import emit_host

        return emit_host(tile_program)
    if target.backend == "cuda":
        from polyfuse.emit_cpp.cuda import emit_cuda

        return emit_cuda(tile_program, target)
    if target.backend == "hip":
        from polyfuse.emit_cpp.hip import emit_hip

        return emit_hip(tile_program, target)
    raise BackendUnavailable(f"no emitter for backend {target.backend!r}; available: {', '.join(_DEFAULTS)}")
