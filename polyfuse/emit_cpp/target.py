"""What the emitters produce and for whom: the target, the kernel signature, the source."""

from __future__ import annotations

import re
from dataclasses import dataclass

from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Const, Expr, Var
from polyfuse.ir.stmt import Tensor


@dataclass(frozen=True)
class Target:
    """A code-generation target: ``backend`` (``cpp``, ``cuda``, ``hip``), ``arch``, ``warp_size``.

    The host backend ignores ``warp_size``; GPU backends need it (32 vs 64 changes reductions).
    """

    backend: str
    arch: str = "native"
    warp_size: int = 1


HOST = Target("cpp")
CUDA = Target("cuda", "sm_90a", 32)
HIP = Target("hip", "gfx90a", 64)


@dataclass(frozen=True)
class Launch:
    """One GPU kernel of a program, launched in order: ``blocks`` × ``threads``, ``shared`` bytes.

    ``blocks`` is an expression of the size parameters.
    """

    kernel: str
    blocks: Expr
    threads: int
    shared: int


@dataclass(frozen=True)
class Arg:
    """One array argument of a kernel: its tensor name, role, shape and dtype, and what an input
    promises about its values (``sign``, ``finite``: see :class:`~polyfuse.ir.stmt.Tensor`).

    ``shape`` entries are ints or the names of size parameters.
    """

    name: str
    role: str
    shape: tuple[int | str, ...]
    dtype: DType
    sign: str | None = None
    finite: bool = False


@dataclass(frozen=True)
class KernelSource:
    """Generated source text and how to call it.

    ``args`` are the array arguments in call order (inputs, then outputs), ``sizes`` the names of
    the size parameters passed after them, ``entry`` the name of the C-ABI entry point (host) or
    the prefix of the kernels' names (GPU).  GPU sources list their kernels in ``launches``; their
    ``args`` end with the temporaries that live in global memory (role ``temp``), which the
    runtime allocates.
    """

    text: str
    entry: str
    args: tuple[Arg, ...]
    sizes: tuple[str, ...]
    target: Target
    launches: tuple[Launch, ...] = ()

    @property
    def signature(self) -> str:
        parts = [f"{a.name}: {a.dtype}[{', '.join(str(d) for d in a.shape)}] ({a.role})" for a in self.args]
        parts += [f"{s}: int" for s in self.sizes]
        return f"{self.entry}({', '.join(parts)})"


def entry_name(program_name: str) -> str:
    """The C identifier a program's kernels are named after."""
    return "polyfuse_" + re.sub(r"\W", "_", program_name)


def arg_of(t: Tensor) -> Arg:
    """The signature entry of a tensor argument (constant dimensions as ints, parameters by name)."""
    def dim(d: Expr) -> int | str:
        if isinstance(d, Const):
            return int(d.value)
        if isinstance(d, Var):
            return d.name
        return str(d)

    return Arg(t.name, t.role, tuple(dim(d) for d in t.shape), t.dtype, t.sign, t.finite)
