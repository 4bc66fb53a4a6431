"""What the emitters produce and for whom: the target, the kernel signature, the source."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from polyfuse.device import DEFAULT_ARCH, DeviceSpec, for_backend
from polyfuse.emit_cpp.options import CodegenOptions

from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Const, Expr, Var
from polyfuse.ir.stmt import Tensor


@dataclass(frozen=True)
class Target:
    """A code-generation target: the ``backend`` (``cpp``, ``cuda``, ``hip``), the ``device`` the GPU
    backends emit for (its architecture, warp size, shared memory and instructions) and the code
    generator's ``options``.  The host backend has no device and ignores the options.
    """

    backend: str
    device: DeviceSpec | None = None
    options: CodegenOptions = field(default_factory=CodegenOptions)

    def __post_init__(self) -> None:
        if self.backend in DEFAULT_ARCH and self.device is None:
            object.__setattr__(self, "device", for_backend(self.backend))

    @property
    def arch(self) -> str:
        return self.device.arch if self.device is not None else "native"

    @property
    def warp_size(self) -> int:
        return self.device.warp_size if self.device is not None else 1

    def with_options(self, **changes) -> Target:
        """This target with some options changed (``CUDA.with_options(row_groups=False)``)."""
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))


HOST = Target("cpp")
CUDA = Target("cuda")
HIP = Target("hip")


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
    """One array argument of a kernel: its tensor name, role, dimensions (``extents``) and dtype, and what an
    input promises about its values (``sign``, ``finite``: see :class:`~polyfuse.ir.stmt.Tensor`)."""

    name: str
    role: str
    extents: tuple[Expr, ...]
    dtype: DType
    sign: str | None = None
    finite: bool = False

    @property
    def shape(self) -> tuple[int | str, ...]:
        """The dimensions as a signature shows them: ints, the names of size parameters, or the text of an
        expression of them (a scratch array of a loop tiled over a size: ``(M + 3) // 4`` partials), whose
        value the runtime computes from :attr:`extents`."""
        return tuple(int(d.value) if isinstance(d, Const) else d.name if isinstance(d, Var) else str(d)
                     for d in self.extents)


@dataclass(frozen=True)
class TensorMapArg:
    """A tensor map a GPU source's kernels take first, by value (``const __grid_constant__ CUtensorMap name``):
    input ``tensor`` copied ``box`` elements at a time (innermost dimension first), ``swizzle``-byte swizzled.  The
    runtime encodes it at launch from the tensor's address and extents (:mod:`polyfuse.runtime.tma`)."""

    name: str
    tensor: str
    box: tuple[int, ...]
    swizzle: int


@dataclass(frozen=True)
class GatherSite:
    """One gathered access of a kernel (:mod:`polyfuse.ir.gather`): a fault the kernel records names its
    site by position (from 1) in :attr:`KernelSource.gathers`, with the value read and the extent."""

    block: str
    access: str
    tensor: str
    dim: int
    index: str


GATHER_FAULT = "pf_gather_fault"
"""The name of the fault record of a kernel with gathers: ``int64[3]`` = (site, value, extent), site 0 for none."""


@dataclass(frozen=True)
class KernelSource:
    """Generated source text and how to call it.

    ``args`` are the array arguments in call order (inputs, then outputs), ``sizes`` the names of
    the size parameters passed after them, ``entry`` the name of the C-ABI entry point (host) or
    the prefix of the kernels' names (GPU).  GPU sources list their kernels in ``launches``; their
    ``args`` end with the temporaries that live in global memory (role ``temp``), which the
    runtime allocates.  ``gathers`` are the gathered accesses, checked when the kernel runs: it records
    the first index out of bounds in a fault record (:data:`GATHER_FAULT`) that the runtime reads after
    the call and turns into :class:`~polyfuse.errors.GatherOutOfBounds`.  ``size_limit`` is the largest size
    parameter value the kernel's 32-bit index arithmetic assumed (:mod:`polyfuse.emit_cpp.widths`): the runtime
    refuses larger ones; None if it assumed none.  ``zeroed`` names the scratch
    arguments that must be zero at the first launch and that every launch leaves at zero (the ticket counters of a
    folded split-k combine, :mod:`polyfuse.emit_cpp.fold`): the runtime zero-fills them when it allocates them.
    ``maps`` are the tensor maps every kernel takes before the arrays (:class:`TensorMapArg`).
    """

    text: str
    entry: str
    args: tuple[Arg, ...]
    sizes: tuple[str, ...]
    target: Target
    launches: tuple[Launch, ...] = ()
    gathers: tuple[GatherSite, ...] = ()
    size_limit: int | None = None
    zeroed: tuple[str, ...] = ()
    maps: tuple[TensorMapArg, ...] = ()

    @property
    def signature(self) -> str:
        parts = [f"{a.name}: {a.dtype}[{', '.join(str(d) for d in a.shape)}] ({a.role})" for a in self.args]
        parts += [f"{s}: int" for s in self.sizes]
        return f"{self.entry}({', '.join(parts)})"


def entry_name(program_name: str) -> str:
    """The C identifier a program's kernels are named after."""
    return "polyfuse_" + re.sub(r"\W", "_", program_name)


def arg_of(t: Tensor) -> Arg:
    """The signature entry of a tensor argument."""
    return Arg(t.name, t.role, tuple(t.shape), t.dtype, t.sign, t.finite)
