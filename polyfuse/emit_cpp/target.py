"""What the emitters produce and for whom: the target, the kernel signature, the source."""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.ir.dtypes import DType


@dataclass(frozen=True)
class Target:
    """A code-generation target: ``backend`` (``cpp``, ``cuda``, ``hip``), ``arch``, ``warp_size``.

    The host backend ignores ``warp_size``; GPU backends need it (32 vs 64 changes reductions).
    """

    backend: str
    arch: str = "native"
    warp_size: int = 1


HOST = Target("cpp")


@dataclass(frozen=True)
class Arg:
    """One array argument of a kernel: its tensor name, role, shape and dtype.

    ``shape`` entries are ints or the names of size parameters.
    """

    name: str
    role: str
    shape: tuple[int | str, ...]
    dtype: DType


@dataclass(frozen=True)
class KernelSource:
    """Generated source text and how to call it.

    ``args`` are the array arguments in call order (inputs, then outputs), ``sizes`` the names of
    the size parameters passed after them, ``entry`` the name of the C-ABI entry point.
    """

    text: str
    entry: str
    args: tuple[Arg, ...]
    sizes: tuple[str, ...]
    target: Target

    @property
    def signature(self) -> str:
        parts = [f"{a.name}: {a.dtype}[{', '.join(str(d) for d in a.shape)}] ({a.role})" for a in self.args]
        parts += [f"{s}: int" for s in self.sizes]
        return f"{self.entry}({', '.join(parts)})"
