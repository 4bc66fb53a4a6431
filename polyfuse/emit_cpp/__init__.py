"""Tile programs to source text: one C-family emitter core and one small subclass per backend.

``emit(tile_program, target)`` returns a :class:`KernelSource` (text, entry point, signature).
Backends: ``cpp`` (host C++ with OpenMP, :mod:`polyfuse.emit_cpp.host`).
"""

from __future__ import annotations

from polyfuse.emit_cpp.target import HOST, Arg, KernelSource, Target
from polyfuse.errors import BackendUnavailable
from polyfuse.tiling.htile import TileProgram

__all__ = ["HOST", "Arg", "KernelSource", "Target", "emit"]


def emit(tile_program: TileProgram, target: Target | str = HOST) -> KernelSource:
    """Source text of ``tile_program`` for ``target`` (a :class:`Target` or a backend name)."""
    if isinstance(target, str):
        target = Target(target)
    if target.backend == "cpp":
        from polyfuse.emit_cpp.host import emit_host

        return emit_host(tile_program)
    raise BackendUnavailable(f"no emitter for backend {target.backend!r} yet; available: cpp")
