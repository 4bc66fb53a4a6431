"""A compiled GPU program as a Python callable: argument checks, then its kernels in order.

Arrays on the device — PyTorch tensors, and anything with ``__cuda_array_interface__`` (CuPy,
Numba) — are used in place, zero-copy; the outputs then come back as arrays of the same
framework on the same device, and nothing waits for the GPU (launches are asynchronous, on the
default stream, or the stream :meth:`GpuKernel.launch` is given).  PyTorch tensors on another
device than the loader's run there (the image is loaded onto each device it is used on).  NumPy
arrays are copied to the loader's device and the outputs copied back.  Every
argument is checked before anything is launched, as on the host (:mod:`polyfuse.runtime.kernel`):
count, kind and device, dtype, shape, C-contiguity; a mismatch raises
:class:`~polyfuse.errors.LaunchError` naming the argument.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polyfuse.emit_cpp.target import Arg, KernelSource
from polyfuse.errors import LaunchError
from polyfuse.ir.expr import BinOp, Const, Expr, Var
from polyfuse.ir.interpreter import check_promises
from polyfuse.runtime import tma
from polyfuse.runtime.compiler import CompileOptions
from polyfuse.runtime.kernel import KernelBase, raise_gather_fault
from polyfuse.runtime.loaders import Loader, loader

TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i32": "int32",
                "i64": "int64", "bool": "bool", "fp8e4m3": "float8_e4m3fn"}
"""The PyTorch dtype (``torch.NAME``) of each polyfuse dtype."""


@dataclass
class _Device:
    """A device array as the launch sees it: pointer, shape, dtype name, owner (kept alive)."""

    pointer: int
    shape: tuple[int, ...]
    dtype: str
    owner: Any
    framework: str  # "torch", "cai" or "numpy" (copied in)


class GpuKernel(KernelBase):
    """``kernel(*inputs, **sizes)`` returns the outputs; ``kernel(*inputs, *outputs)`` fills them."""

    def __init__(self, source: KernelSource, image: Path, loader: Loader, sizes: Mapping[str, int] | None = None,
                 options: CompileOptions | None = None):
        super().__init__(source, sizes, options)
        self.image = image
        self.loader = loader
        self._modules: dict[int, Any] = {}  # kept alive: pycuda unloads a module it frees
        self._functions: dict[int, list] = {}
        self._functions_on(loader)
        self.scratch = tuple(a for a in source.args if a.role not in ("input", "output"))
        self._scratch: dict[tuple, list] = {}
        self._encoded: dict[tuple, bytes] = {}
        self._calls: dict[tuple, tuple[dict[str, int], tuple[int, ...], list[int]]] = {}
        names = [a.name for a in source.args]
        self._map_args = tuple((m, names.index(m.tensor)) for m in source.maps)

    def __repr__(self) -> str:
        return f"GpuKernel({self.signature}, {len(self.kernel_source.launches)} launch(es) via {self.loader.name})"

    def _functions_on(self, driver: Loader) -> list:
        """The kernel's functions in the image loaded onto ``driver``'s device (loaded once per device)."""
        if driver.ordinal not in self._functions:
            module = self._modules[driver.ordinal] = driver.load(self.image.read_bytes())
            self._functions[driver.ordinal] = [driver.function(module, launch.kernel, launch.shared)
                                               for launch in self.kernel_source.launches]
        return self._functions[driver.ordinal]

    def _driver_for(self, described: list[_Device]) -> Loader:
        """The loader of the device the arrays are on: that of the PyTorch tensors' device, else the kernel's."""
        ordinals = {d.owner.device.index for d in described if d.framework == "torch"}
        if len(ordinals) > 1:
            raise LaunchError(f"kernel {self.name}: the tensors are on several devices (cuda:"
                              f"{', cuda:'.join(map(str, sorted(ordinals)))}); pass them on one")
        ordinal = ordinals.pop() if ordinals else self.loader.ordinal
        if ordinal == self.loader.ordinal:
            return self.loader
        if any(d.framework != "torch" for d in described):
            raise LaunchError(f"kernel {self.name}: the tensors are on cuda:{ordinal}; other arrays are copied to "
                              f"or live on device {self.loader.ordinal}: pass tensors on cuda:{ordinal} only")
        return loader(self.loader.backend, self.loader.name, ordinal)

    def synchronize(self) -> None:
        """Wait for every launch so far (errors inside kernels surface here)."""
        self.loader.synchronize()

    # ------------------------------------------------------------------ launch
    def launch(self, arrays: tuple[object, ...], sizes: Mapping[str, int], stream: int = 0) -> list:
        """Check, then launch every kernel on ``stream`` (a driver stream handle of the arrays' device, e.g.
        ``torch.cuda.current_stream().cuda_stream``; 0: the legacy default stream)."""
        self.check_counts(arrays, sizes)
        n_in, n_all = len(self.inputs), len(self.inputs) + len(self.outputs)
        described = [_describe(x, spec) for x, spec in zip(arrays, self.kernel_source.args, strict=False)]
        values, blocks, size_args = self._checked(described, sizes)
        driver = self._driver_for(described)
        functions = self._functions_on(driver)
        framework = next((d for d in described if d.framework != "numpy"), None)
        device = [self._on_device(d, spec) for d, spec in zip(described, self.kernel_source.args, strict=False)]
        if len(described) == n_in:
            device += [self._fresh(spec, values, framework) for spec in self.outputs]
        scratch = self._scratch_for(values, driver)
        pointers = [d.pointer for d in device] + scratch
        fault = np.zeros(3, dtype=np.int64) if self.kernel_source.gathers else None
        if fault is not None:  # the fault record is the last scratch buffer (see cuda.arguments)
            driver.to_device(scratch[-1], fault.ctypes.data, fault.nbytes)
        maps = self._maps_for(device) if self._map_args else ()
        for fn, launch, count in zip(functions, self.kernel_source.launches, blocks, strict=True):
            if count > 0:
                driver.launch(fn, count, launch.threads, launch.shared, pointers, size_args, stream, maps)
        if fault is not None:  # waits for the launches (on any stream): checked before the call returns
            driver.synchronize()
            driver.to_host(fault.ctypes.data, scratch[-1], fault.nbytes)
            raise_gather_fault(self.kernel_source, fault)
        results = []
        for k in range(len(self.outputs)):
            given, on_device = (described[n_in + k] if len(described) == n_all else None), device[n_in + k]
            if on_device.framework == "numpy-out":
                host = on_device.owner[1]
                self.loader.to_host(host.ctypes.data, on_device.pointer, host.nbytes)
                results.append(host)
            elif given is not None and given.framework == "numpy":
                host = given.owner
                self.loader.to_host(host.ctypes.data, on_device.pointer, host.nbytes)
                results.append(host)
            else:
                results.append(on_device.owner)
        return results

    def _checked(self, described: list[_Device], sizes: Mapping[str, int]
                 ) -> tuple[dict[str, int], tuple[int, ...], list[int]]:
        """The size values, each launch's block count and the size arguments of a call with these arrays, after
        checking their dtypes and shapes against the signature.  Arrays already on the device are checked once per
        combination of shapes, dtypes and sizes (the checks read nothing else): a short kernel's launch then pays
        a dictionary lookup, not the checks."""
        key = None
        if all(d.framework != "numpy" for d in described):
            key = (tuple((d.shape, d.dtype) for d in described), tuple(sizes.items()))
            found = self._calls.get(key)
            if found is not None:
                return found
        values = self.resolve_sizes([d.shape for d in described[:len(self.inputs)]], sizes)
        for d, spec in zip(described, self.kernel_source.args, strict=False):
            _check(d, spec, values)
        checked = (values, tuple(evaluate(launch.blocks, values) for launch in self.kernel_source.launches),
                   [values[s] for s in self.kernel_source.sizes])
        if key is not None:
            self._calls[key] = checked
        return checked

    def _on_device(self, d: _Device, spec: Arg) -> _Device:
        """A NumPy array copied to the device (an input checked against what it declares first; arrays
        already on the device are trusted: checking them would cost a pass over them)."""
        if d.framework != "numpy":
            return d
        host = d.owner
        if spec.role == "input":
            check_promises(spec, host)
        pointer, owner = self.loader.alloc(host.nbytes)
        self.loader.to_device(pointer, host.ctypes.data, host.nbytes)
        return _Device(pointer, d.shape, d.dtype, (owner, host), "numpy-in")

    def _fresh(self, spec: Arg, sizes: Mapping[str, int], like: _Device | None) -> _Device:
        shape = _shape(spec, sizes)
        if like is not None and like.framework == "torch":
            import torch

            t = torch.empty(shape, dtype=getattr(torch, TORCH_DTYPES[spec.dtype.name]), device=like.owner.device)
            return _Device(t.data_ptr(), shape, spec.dtype.name, t, "torch")
        if like is not None and like.framework == "cai" and type(like.owner).__module__.startswith("cupy"):
            import cupy

            a = cupy.empty(shape, dtype=spec.dtype.numpy)
            return _Device(a.data.ptr, shape, spec.dtype.name, a, "cai")
        host = np.empty(shape, dtype=spec.dtype.numpy)
        pointer, owner = self.loader.alloc(host.nbytes)
        return _Device(pointer, shape, spec.dtype.name, (owner, host), "numpy-out")

    def _maps_for(self, device: list[_Device]) -> tuple[bytes, ...]:
        """The source's tensor maps (:attr:`KernelSource.maps`) of the arrays at these addresses, encoded by the
        driver once per address and extents (the map is a function of them alone): a launch of a short kernel
        pays a dictionary lookup per map, not an encoding."""
        out = []
        for m, k in self._map_args:
            d = device[k]
            key = (m.name, d.pointer, d.shape)
            found = self._encoded.get(key)
            if found is None:
                dims, item = tuple(reversed(d.shape)), self.kernel_source.args[k].dtype.numpy.itemsize
                strides = tuple(item * int(np.prod(d.shape[i + 1:], dtype=np.int64))
                                for i in reversed(range(len(d.shape) - 1)))  # (of dimensions 1.., innermost first)
                try:
                    found = self._encoded[key] = tma.encode(d.pointer, d.dtype, dims, strides, m.box, m.swizzle)
                except LaunchError as err:
                    raise LaunchError(f"kernel {self.name}: argument {m.tensor!r} (its bulk tensor copies): {err}; "
                                      "pass a tensor whose address is 16-byte aligned, or build with "
                                      "CodegenOptions(tma=False)") from None
            out.append(found)
        return tuple(out)

    def _scratch_for(self, sizes: Mapping[str, int], driver: Loader) -> list[int]:
        """The scratch buffers of ``sizes`` on ``driver``'s device, allocated at the first call with those sizes
        (a CUDA graph captures only calls after that one); those the source names ``zeroed`` are zero-filled."""
        key = (driver.ordinal, *sizes.items())  # (in the order of the source's size parameters)
        if key not in self._scratch:
            buffers = []
            for spec in self.scratch:
                nbytes = int(np.prod(_shape(spec, sizes), dtype=np.int64)) * spec.dtype.numpy.itemsize
                buffers.append(driver.alloc(nbytes))
                if spec.name in self.kernel_source.zeroed and nbytes:  # ticket counters: launches leave them at 0
                    zeros = np.zeros(nbytes, np.uint8)
                    driver.to_device(buffers[-1][0], zeros.ctypes.data, nbytes)
            self._scratch[key] = buffers
        return [p for p, _ in self._scratch[key]]


    def read_scratch(self, name: str) -> np.ndarray:
        """The scratch buffer ``name`` as the launches left it on the loader's device (the only set of sizes
        called so far; for tests: a folded combine's ticket counters must be back at 0)."""
        spec = next((a for a in self.scratch if a.name == name), None)
        found = [(key, buffers) for key, buffers in self._scratch.items() if key[0] == self.loader.ordinal]
        if spec is None or len(found) != 1:
            raise LaunchError(f"kernel {self.name}: no single scratch buffer {name!r} to read (scratch "
                              f"{[a.name for a in self.scratch]}, {len(found)} set(s) of sizes called)")
        key, buffers = found[0]
        host = np.empty(_shape(spec, dict(key[1:])), dtype=spec.dtype.numpy)
        self.loader.synchronize()
        self.loader.to_host(host.ctypes.data, buffers[self.scratch.index(spec)][0], host.nbytes)
        return host


def evaluate(e: Expr, sizes: Mapping[str, int]) -> int:
    """The integer value of a size expression (launch grids, shapes)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return int(sizes[e.name])
    if isinstance(e, BinOp):
        a, b = evaluate(e.a, sizes), evaluate(e.b, sizes)
        ops = {"+": a + b, "-": a - b, "*": a * b, "max": max(a, b), "min": min(a, b)}
        if e.op in ops:
            return ops[e.op]
        if e.op in ("//", "%") and b != 0:
            return a // b if e.op == "//" else a % b
    raise LaunchError(f"cannot evaluate the size expression {e}")


def _describe(x: object, spec: Arg) -> _Device:
    if isinstance(x, np.ndarray):
        return _Device(x.ctypes.data, x.shape, _numpy_name(x.dtype), x, "numpy")
    if hasattr(x, "data_ptr") and hasattr(x, "is_cuda"):
        if not x.is_cuda:
            raise LaunchError(f"argument {spec.name!r} is a PyTorch tensor on {x.device}; the GPU kernel needs a "
                              f"CUDA tensor (or a NumPy array, copied in)")
        if not x.is_contiguous():
            raise LaunchError(f"argument {spec.name!r} is not contiguous; pass .contiguous()")
        return _Device(x.data_ptr(), tuple(x.shape), _torch_name(x.dtype), x, "torch")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        dtype = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
            raise LaunchError(f"argument {spec.name!r} is not C-contiguous (strides {tuple(strides)})")
        return _Device(int(cai["data"][0]), shape, _numpy_name(dtype), x, "cai")
    raise LaunchError(f"argument {spec.name!r} must be a NumPy array, a CUDA PyTorch tensor or an array with "
                      f"__cuda_array_interface__; got {type(x).__name__}")


@functools.cache
def _torch_name(dtype: object) -> str:
    """polyfuse's name of a PyTorch dtype (its own where polyfuse has none: the check then names it)."""
    name = str(dtype).removeprefix("torch.")
    return next((k for k, v in TORCH_DTYPES.items() if v == name), name)


def _numpy_name(dtype: np.dtype) -> str:
    from polyfuse.ir import dtypes as dt

    for d in (dt.f16, dt.bf16, dt.f32, dt.f64, dt.i32, dt.i64, dt.bool_, dt.fp8e4m3):
        if np.dtype(d.numpy) == dtype:
            return d.name
    return str(dtype)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _shape(spec: Arg, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The array's shape at ``sizes``: a dimension that is an expression of them (scratch of a tiled loop over a
    size parameter) is evaluated."""
    return tuple(d if isinstance(d, int) else sizes[d] if d in sizes else evaluate(e, sizes)
                 for d, e in zip(spec.shape, spec.extents, strict=True))


def _check(d: _Device, spec: Arg, sizes: Mapping[str, int]) -> None:
    if d.dtype != spec.dtype.name:
        raise LaunchError(f"argument {spec.name!r} has dtype {d.dtype}; expected {spec.dtype}")
    expected = _shape(spec, sizes)
    if tuple(d.shape) != expected:
        raise LaunchError(f"argument {spec.name!r} has shape {tuple(d.shape)}; expected {expected}")
    if d.framework == "numpy" and not d.owner.flags.c_contiguous:
        raise LaunchError(f"argument {spec.name!r} is not C-contiguous; pass np.ascontiguousarray(...)")
