"""A compiled kernel as a Python callable: argument checks, then one ctypes call.

Every argument is checked before the launch — count, array kind and device, dtype, shape,
C-contiguity, writability of outputs, size parameters — and a mismatch raises
:class:`~polyfuse.errors.LaunchError` naming the argument and what was expected.  NumPy arrays
and objects with ``__dlpack__`` on the CPU (through ``np.from_dlpack``) are accepted.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from polyfuse.emit_cpp.target import Arg, KernelSource
from polyfuse.errors import InternalError, LaunchError
from polyfuse.ir.gather import gather_error
from polyfuse.ir.interpreter import check_promises
from polyfuse.runtime.compiler import CompileOptions

_DLPACK_CPU = 1


class KernelBase:
    """What every compiled kernel shares: its source, calling conventions and argument resolution.

    ``kernel(*inputs, **sizes)`` returns the outputs; ``kernel(*inputs, *outputs)`` fills them.
    Several outputs come back as a tuple, one as an array.  ``sizes`` default to those bound at
    build time and to what the input shapes say.  ``options`` are those it was compiled with.
    Subclasses implement :meth:`launch`.
    """

    def __init__(self, source: KernelSource, sizes: Mapping[str, int] | None = None,
                 options: CompileOptions | None = None):
        self.kernel_source = source
        self.options = options or CompileOptions()
        self.bound_sizes = dict(sizes or {})
        self.inputs = tuple(a for a in source.args if a.role == "input")
        self.outputs = tuple(a for a in source.args if a.role == "output")

    @property
    def source(self) -> str:
        return self.kernel_source.text

    @property
    def signature(self) -> str:
        return self.kernel_source.signature

    @property
    def name(self) -> str:
        return self.kernel_source.entry

    def __call__(self, *arrays: object, **sizes: int):
        outs = self.launch(arrays, sizes)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, inputs: Mapping[str, np.ndarray], **sizes: int) -> dict[str, np.ndarray]:
        """The outputs by name, from inputs by name."""
        missing = [a.name for a in self.inputs if a.name not in inputs]
        if missing:
            raise LaunchError(f"kernel {self.name}: missing input(s) {', '.join(missing)}")
        outs = self.launch(tuple(inputs[a.name] for a in self.inputs), sizes)
        return {a.name: o for a, o in zip(self.outputs, outs, strict=True)}

    def launch(self, arrays: tuple[object, ...], sizes: Mapping[str, int]) -> list:
        raise NotImplementedError

    def check_counts(self, arrays: tuple[object, ...], sizes: Mapping[str, int]) -> None:
        """LaunchError unless ``arrays`` are the inputs (and maybe the outputs) and ``sizes`` exist."""
        n_in, n_all = len(self.inputs), len(self.inputs) + len(self.outputs)
        if len(arrays) not in (n_in, n_all):
            names = ", ".join(a.name for a in self.inputs)
            outs = ", ".join(a.name for a in self.outputs)
            raise LaunchError(f"kernel {self.name} takes {n_in} input array(s) ({names}), or those followed by "
                              f"its output(s) ({outs}); got {len(arrays)} argument(s)")
        unknown = sorted(set(sizes) - set(self.kernel_source.sizes))
        if unknown:
            raise LaunchError(f"kernel {self.name} has no size parameter(s) {', '.join(unknown)}; "
                              f"its sizes are: {', '.join(self.kernel_source.sizes) or 'none'}")

    def resolve_sizes(self, shapes: list[tuple[int, ...]], sizes: Mapping[str, int]) -> dict[str, int]:
        """Size parameter values: given, else bound at build time, else read off the input ``shapes``."""
        values = {**self.bound_sizes, **{k: int(v) for k, v in sizes.items()}}
        for shape, spec in zip(shapes, self.inputs, strict=True):
            for d, got in zip(spec.shape, shape, strict=False):
                if isinstance(d, str) and d not in values:
                    values[d] = int(got)
        missing = [s for s in self.kernel_source.sizes if s not in values]
        if missing:
            raise LaunchError(f"kernel {self.name}: no value for size parameter(s) {', '.join(missing)}; "
                              f"pass them as keywords")
        limit = self.kernel_source.size_limit
        too_large = [f"{s}={values[s]}" for s in self.kernel_source.sizes if limit is not None and values[s] > limit]
        if too_large:
            raise LaunchError(f"kernel {self.name}: size parameter(s) {', '.join(too_large)} exceed {limit}, the "
                              f"largest its 32-bit index arithmetic was compiled for")
        return {s: values[s] for s in self.kernel_source.sizes}


class Kernel(KernelBase):
    """A host kernel: one ctypes call of the C-ABI entry point (see :mod:`polyfuse.emit_cpp.host`)."""

    def __init__(self, source: KernelSource, library: Path, sizes: Mapping[str, int] | None = None,
                 options: CompileOptions | None = None):
        super().__init__(source, sizes, options)
        self.library = library
        self._lib = ctypes.CDLL(str(library))
        self._fn = getattr(self._lib, source.entry)
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]
        self._fn.restype = ctypes.c_int

    def __repr__(self) -> str:
        return f"Kernel({self.signature})"

    def launch(self, arrays: tuple[object, ...], sizes: Mapping[str, int]) -> list[np.ndarray]:
        self.check_counts(arrays, sizes)
        n_in = len(self.inputs)
        given = [_as_array(x, spec) for x, spec in zip(arrays, self.kernel_source.args, strict=False)]
        values = self.resolve_sizes([a.shape for a in given[:n_in]], sizes)
        for arr, spec in zip(given, self.kernel_source.args, strict=False):
            _check(arr, spec, values)
        if len(given) == n_in:
            given += [_fresh(spec, values) for spec in self.outputs]
        for arr, spec in zip(given[n_in:], self.outputs, strict=True):
            if not arr.flags.writeable:
                raise LaunchError(f"output argument {spec.name!r} is read-only")
        fault = np.zeros(3, dtype=np.int64)  # the fault record of gathers (site, value, extent), after the arguments
        pointers = [a.ctypes.data for a in given] + [fault.ctypes.data]
        buffers = (ctypes.c_void_p * len(pointers))(*pointers)
        sizes_arr = (ctypes.c_int64 * max(1, len(values)))(*[values[s] for s in self.kernel_source.sizes])
        status = self._fn(buffers, sizes_arr)
        if status != 0:
            raise LaunchError(f"kernel {self.name} returned status {status}")
        raise_gather_fault(self.kernel_source, fault)
        return given[n_in:]


def raise_gather_fault(source: KernelSource, fault: np.ndarray) -> None:
    """Raise :class:`~polyfuse.errors.GatherOutOfBounds` if a kernel recorded a gather fault (see
    :attr:`~polyfuse.emit_cpp.target.KernelSource.gathers`)."""
    site = int(fault[0])
    if site == 0:
        return
    if not 1 <= site <= len(source.gathers):
        raise InternalError(f"kernel {source.entry} recorded gather fault site {site}; it has {len(source.gathers)}")
    g = source.gathers[site - 1]
    raise gather_error(g.block, g.access, g.tensor, g.dim, g.index, int(fault[1]), int(fault[2]))


def _as_array(x: object, spec: Arg) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        if hasattr(x, "__dlpack_device__"):
            device = x.__dlpack_device__()
            if int(device[0]) != _DLPACK_CPU:
                raise LaunchError(f"argument {spec.name!r} lives on DLPack device {tuple(device)}; the host kernel "
                                  f"needs a CPU array")
        try:
            return np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError) as err:
            raise LaunchError(f"argument {spec.name!r}: cannot view it as a CPU array through DLPack ({err})") from None
    raise LaunchError(f"argument {spec.name!r} must be a NumPy array or support __dlpack__; "
                      f"got {type(x).__name__}")


def _shape(spec: Arg, sizes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else sizes[d] for d in spec.shape)


def _check(arr: np.ndarray, spec: Arg, sizes: Mapping[str, int]) -> None:
    if arr.dtype != spec.dtype.numpy:
        raise LaunchError(f"argument {spec.name!r} has dtype {arr.dtype}; expected {spec.dtype} "
                          f"({spec.dtype.numpy})")
    expected = _shape(spec, sizes)
    if arr.shape != expected:
        raise LaunchError(f"argument {spec.name!r} has shape {arr.shape}; expected {expected}")
    if not arr.flags.c_contiguous:
        raise LaunchError(f"argument {spec.name!r} is not C-contiguous; pass np.ascontiguousarray(...)")
    if spec.role == "input":
        check_promises(spec, arr)


def _fresh(spec: Arg, sizes: Mapping[str, int]) -> np.ndarray:
    fill = np.nan if spec.dtype.is_float else 0
    return np.full(_shape(spec, sizes), fill, dtype=spec.dtype.numpy)
