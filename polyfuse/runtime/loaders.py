"""Load device code and launch kernels: pycuda, cuda-python (``cuda.bindings``) or hip-python.

Each loader offers the same small interface — load an image, find a function, allow it more
shared memory, launch it (on the legacy default stream unless a stream handle is given), allocate
and copy memory — over one device's primary context, the one PyTorch and CuPy use too, so pointers
from either work in place.  :func:`loader` picks pycuda where it is installed and cuda-python
otherwise (``prefer`` chooses), for device 0 unless told; HIP has hip-python only.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import functools
from typing import Any

from polyfuse.device import PRESETS, DeviceSpec, preset
from polyfuse.errors import BackendUnavailable, LaunchError, PolyfuseError

CUDA_LOADERS = ("pycuda", "cuda-python")


class Loader:
    """What the GPU runtime needs from a driver binding."""

    name = "?"
    backend = "cuda"
    ordinal = 0
    """The device's index (CUDA's ordinal)."""
    foreign_streams = True
    """Whether :meth:`launch` takes a stream another library made (PyTorch's current stream)."""
    _device_spec: DeviceSpec | None = None

    def arch(self) -> str:
        raise NotImplementedError

    def device_spec(self) -> DeviceSpec:
        """The loader's device as code generation sees it: the preset of its architecture, with the numbers the driver
        reports in place of the preset's (SMs, shared memory, registers, warp size, threads per block).

        The driver's numbers win because a part of an architecture may differ from the preset's (fewer SMs
        on a PCIe card, less shared memory on a consumer part); the preset still gives what the driver does
        not report (the instruction families, the default warps).  Asked once per loader.
        """
        if self._device_spec is None:
            name, numbers = self._attributes()
            # A zero count is a driver that does not fill the field (no device has 0 SMs); only the reserve may be 0.
            known = {k: int(v) for k, v in numbers.items()
                     if v is not None and (int(v) > 0 or k == "shared_reserved")}
            self._device_spec = dataclasses.replace(self._preset(name), **known,
                                                    source=f"device {self.ordinal}: {name}")
        return self._device_spec

    def _preset(self, name: str) -> DeviceSpec:
        arch = self.arch()
        try:
            return preset(arch)
        except PolyfuseError:
            raise BackendUnavailable(f"device {self.ordinal} ({name}) is {arch}, an architecture polyfuse has no "
                                     f"preset for (presets are {', '.join(PRESETS)}; newer sm_XY take the nearest "
                                     f"lower one): its instruction families are unknown") from None

    def _attributes(self) -> tuple[str, dict[str, int | None]]:
        """The device's name and the :class:`DeviceSpec` fields the driver reports (None: not reported)."""
        raise NotImplementedError

    def load(self, image: bytes) -> Any:
        raise NotImplementedError

    def function(self, module: Any, name: str, shared: int) -> Any:
        raise NotImplementedError

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0, maps: tuple[bytes, ...] = ()) -> None:
        """Launch ``fn`` on ``stream`` (a driver stream handle; 0: the legacy default stream), passing the 128-byte
        tensor ``maps`` first, by value, then the ``pointers`` and the ``sizes``."""
        raise NotImplementedError

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        """A device pointer and the object that owns it (freed when dropped)."""
        raise NotImplementedError

    def to_device(self, pointer: int, host: int, nbytes: int) -> None:
        raise NotImplementedError

    def to_host(self, host: int, pointer: int, nbytes: int) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError


def _packed(pointers: list[int], sizes: list[int], maps: tuple[bytes, ...] = ()) -> tuple[list, Any]:
    """ctypes values and the array of their addresses that cuLaunchKernel takes as kernelParams (the driver
    copies each from its address into the parameter's place, aligned as the kernel declares it), kept for the
    arguments of recent launches: a kernel called again with the same arrays builds nothing."""
    return _packed_of(tuple(pointers), tuple(sizes), maps)


@functools.lru_cache(maxsize=256)
def _packed_of(pointers: tuple[int, ...], sizes: tuple[int, ...], maps: tuple[bytes, ...]) -> tuple[list, Any]:
    values = ([(ctypes.c_uint8 * len(m)).from_buffer_copy(m) for m in maps] + [ctypes.c_void_p(p) for p in pointers]
              + [ctypes.c_int64(s) for s in sizes])
    array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return values, array


class CudaPython(Loader):
    """NVIDIA's cuda-python driver bindings (``cuda.bindings.driver``, or ``cuda.cuda`` before 12.6)."""

    name = "cuda-python"

    def __init__(self, ordinal: int = 0) -> None:
        try:
            from cuda.bindings import driver
        except ImportError:
            try:
                from cuda import cuda as driver
            except ImportError:
                raise BackendUnavailable("cuda-python is not installed (pip install cuda-python)") from None
        self.cu = driver
        try:
            self.check(driver.cuInit(0), "cuInit")
        except (RuntimeError, OSError, LaunchError) as err:
            # cuda.pathfinder's DynamicLibNotFoundError (a RuntimeError) where there is no libcuda, or cuInit's
            # error code (no device, driver too old): nothing this process can launch on.
            raise BackendUnavailable(f"cuda-python cannot load the CUDA driver ({type(err).__name__}: {err}); "
                                     f"is an NVIDIA driver installed?") from None
        count = self.check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        if not count:
            raise BackendUnavailable("cuda-python found no CUDA device")
        if not 0 <= ordinal < count:
            raise BackendUnavailable(f"cuda-python found {count} CUDA device(s); there is no device {ordinal}")
        self.ordinal = ordinal
        self.device = self.check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = self.check(driver.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.check(driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def check(self, result: tuple, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            _, text = self.cu.cuGetErrorString(err)
            message = text.decode() if isinstance(text, bytes) else str(err)
            raise LaunchError(f"{what} failed: {message}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else tuple(rest)

    def arch(self) -> str:
        attr = self.cu.CUdevice_attribute
        major = self.check(self.cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                        self.device), "cuDeviceGetAttribute")
        minor = self.check(self.cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                        self.device), "cuDeviceGetAttribute")
        return _sm(int(major), int(minor))

    def _attributes(self) -> tuple[str, dict[str, int | None]]:
        numbers = {field: self._attribute(attr) for field, attr in _CUDA_ATTRIBUTES.items()}
        err, name = self.cu.cuDeviceGetName(256, self.device)
        return (_text(name) if int(err) == 0 else "?"), numbers

    def _attribute(self, attr: str) -> int | None:
        """One ``CU_DEVICE_ATTRIBUTE_*`` of the device; None where the binding or the driver lacks it."""
        which = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{attr}", None)
        if which is None:
            return None
        err, value = self.cu.cuDeviceGetAttribute(which, self.device)
        return int(value) if int(err) == 0 else None

    def load(self, image: bytes) -> Any:
        self.check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        return self.check(self.cu.cuModuleLoadData(image), "cuModuleLoadData")

    def function(self, module: Any, name: str, shared: int) -> Any:
        fn = self.check(self.cu.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
        if shared > 48 * 1024:
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(self.cu.cuFuncSetAttribute(fn, attr, shared), f"cuFuncSetAttribute({name})")
        return fn

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0, maps: tuple[bytes, ...] = ()) -> None:
        _values, array = _packed(pointers, sizes, maps)
        self.check(self.cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, shared, stream,
                                          ctypes.addressof(array), 0), "cuLaunchKernel")

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        ptr = self.check(self.cu.cuMemAlloc(max(1, nbytes)), "cuMemAlloc")
        return int(ptr), _Freed(lambda: self.cu.cuMemFree(ptr))

    def to_device(self, pointer: int, host: int, nbytes: int) -> None:
        self.check(self.cu.cuMemcpyHtoD(pointer, host, nbytes), "cuMemcpyHtoD")

    def to_host(self, host: int, pointer: int, nbytes: int) -> None:
        self.check(self.cu.cuMemcpyDtoH(host, pointer, nbytes), "cuMemcpyDtoH")

    def synchronize(self) -> None:
        self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")


class PyCuda(Loader):
    """pycuda (built from its source distribution; see the README)."""

    name = "pycuda"
    foreign_streams = False  # prepared_call takes pycuda's own Stream objects only

    def __init__(self, ordinal: int = 0) -> None:
        if ordinal != 0:
            raise BackendUnavailable(f"the pycuda loader runs on device 0 only (it keeps one context pushed); "
                                     f"device {ordinal} needs cuda-python")
        try:
            import pycuda.driver as drv
        except ImportError:
            raise BackendUnavailable("pycuda is not installed") from None
        self.drv = drv
        try:
            drv.init()
            if drv.Device.count() == 0:
                raise BackendUnavailable("pycuda found no CUDA device")
            self.device = drv.Device(0)
            self.context = self.device.retain_primary_context()
            self.context.push()
            atexit.register(self._close)
        except drv.Error as err:
            raise BackendUnavailable(f"pycuda could not open the device: {err}") from None

    def _close(self) -> None:
        # pycuda aborts at exit if a context it pushed is still current.
        try:
            self.drv.Context.synchronize()
            self.context.pop()
        except self.drv.Error:
            pass

    def arch(self) -> str:
        major, minor = self.device.compute_capability()
        return _sm(major, minor)

    def _attributes(self) -> tuple[str, dict[str, int | None]]:
        numbers = {}
        for field, attr in _CUDA_ATTRIBUTES.items():
            which = getattr(self.drv.device_attribute, attr, None)
            try:
                numbers[field] = None if which is None else int(self.device.get_attribute(which))
            except self.drv.Error:
                numbers[field] = None
        return self.device.name(), numbers

    def load(self, image: bytes) -> Any:
        return self.drv.module_from_buffer(image)

    def function(self, module: Any, name: str, shared: int) -> Any:
        fn = module.get_function(name)
        if shared > 48 * 1024:
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        return fn

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0, maps: tuple[bytes, ...] = ()) -> None:
        if stream:
            raise LaunchError("the pycuda loader launches on the default stream only; build with "
                              "loader='cuda-python' to launch on another library's stream")
        # pycuda packs the parameters as struct does: the maps first keep their 64-byte alignment (128 bytes each)
        fmt = "".join(f"{len(m)}s" for m in maps) + "P" * len(pointers) + "q" * len(sizes)
        if getattr(fn, "_polyfuse_format", None) != fmt:
            fn.prepare(fmt)
            fn._polyfuse_format = fmt
        try:
            fn.prepared_call((blocks, 1), (threads, 1, 1), *maps, *pointers, *sizes, shared_size=shared)
        except self.drv.Error as err:
            raise LaunchError(f"launch failed: {err}") from None

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        buf = self.drv.mem_alloc(max(1, nbytes))
        return int(buf), buf

    def to_device(self, pointer: int, host: int, nbytes: int) -> None:
        self.drv.memcpy_htod(pointer, _host_view(host, nbytes))

    def to_host(self, host: int, pointer: int, nbytes: int) -> None:
        self.drv.memcpy_dtoh(_host_view(host, nbytes), pointer)

    def synchronize(self) -> None:
        self.drv.Context.synchronize()


class HipPython(Loader):
    """AMD's hip-python (``hip.hip``)."""

    name = "hip-python"
    backend = "hip"

    def __init__(self, ordinal: int = 0) -> None:
        try:
            from hip import hip
        except ImportError:
            raise BackendUnavailable("hip-python is not installed (pip install hip-python)") from None
        self.hip = hip
        count = self.check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        if not count:
            raise BackendUnavailable("hip-python found no HIP device")
        if not 0 <= ordinal < count:
            raise BackendUnavailable(f"hip-python found {count} HIP device(s); there is no device {ordinal}")
        self.ordinal = ordinal
        self.check(hip.hipSetDevice(ordinal), "hipSetDevice")

    def check(self, result: tuple, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise LaunchError(f"{what} failed: {self.hip.hipGetErrorString(err)}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else tuple(rest)

    def _properties(self) -> Any:
        props = self.hip.hipDeviceProp_t()
        self.check(self.hip.hipGetDeviceProperties(props, self.ordinal), "hipGetDeviceProperties")
        return props

    def arch(self) -> str:
        # gcnArchName carries the target features after the architecture: "gfx90a:sramecc+:xnack-".
        return _text(self._properties().gcnArchName).split(":")[0]

    def _attributes(self) -> tuple[str, dict[str, int | None]]:
        props = self._properties()
        numbers = {field: getattr(props, prop, None) for field, prop in _HIP_PROPERTIES.items()}
        return _text(getattr(props, "name", "?")), numbers

    def load(self, image: bytes) -> Any:
        return self.check(self.hip.hipModuleLoadData(image), "hipModuleLoadData")

    def function(self, module: Any, name: str, shared: int) -> Any:
        return self.check(self.hip.hipModuleGetFunction(module, name.encode()), f"hipModuleGetFunction({name})")

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0, maps: tuple[bytes, ...] = ()) -> None:
        if maps:
            raise LaunchError("a HIP kernel takes no tensor maps (bulk tensor copies are NVIDIA sm_90a's)")
        _values, array = _packed(pointers, sizes)
        self.check(self.hip.hipModuleLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, shared, stream or None,
                                                  ctypes.addressof(array), None), "hipModuleLaunchKernel")

    def alloc(self, nbytes: int) -> tuple[int, Any]:
        ptr = self.check(self.hip.hipMalloc(max(1, nbytes)), "hipMalloc")
        return int(ptr), _Freed(lambda: self.hip.hipFree(ptr))

    def to_device(self, pointer: int, host: int, nbytes: int) -> None:
        kind = self.hip.hipMemcpyKind.hipMemcpyHostToDevice
        self.check(self.hip.hipMemcpy(pointer, host, nbytes, kind), "hipMemcpy")

    def to_host(self, host: int, pointer: int, nbytes: int) -> None:
        kind = self.hip.hipMemcpyKind.hipMemcpyDeviceToHost
        self.check(self.hip.hipMemcpy(host, pointer, nbytes, kind), "hipMemcpy")

    def synchronize(self) -> None:
        self.check(self.hip.hipDeviceSynchronize(), "hipDeviceSynchronize")


class _Freed:
    """Calls ``free`` when garbage-collected (owner of a raw device allocation)."""

    def __init__(self, free) -> None:
        self.free = free

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the driver may be gone already
            pass


_CUDA_ATTRIBUTES = {
    "sms": "MULTIPROCESSOR_COUNT",
    "shared_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "shared_per_block": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "shared_reserved": "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "warp_size": "WARP_SIZE",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "l2_bytes": "L2_CACHE_SIZE",
}
"""The :class:`DeviceSpec` fields a CUDA driver reports, by device attribute (``CU_DEVICE_ATTRIBUTE_`` + name in
cuda-python, ``device_attribute.`` + name in pycuda)."""
_HIP_PROPERTIES = {
    "sms": "multiProcessorCount",
    "shared_per_sm": "maxSharedMemoryPerMultiProcessor",
    "shared_per_block": "sharedMemPerBlock",
    "registers_per_sm": "regsPerMultiprocessor",
    "warp_size": "warpSize",
    "max_threads_per_block": "maxThreadsPerBlock",
    "threads_per_sm": "maxThreadsPerMultiProcessor",
    "l2_bytes": "l2CacheSize",
}
"""The :class:`DeviceSpec` fields HIP reports, by ``hipDeviceProp_t`` field (HIP reserves no shared memory)."""


def _text(value: Any) -> str:
    """A C string from a binding (bytes padded with NULs, or str) as text."""
    text = value.decode(errors="replace") if isinstance(value, bytes | bytearray) else str(value)
    return text.split("\x00", 1)[0].strip()


def _host_view(address: int, nbytes: int):
    import numpy as np

    return np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(address))[:nbytes]


def _sm(major: int, minor: int) -> str:
    # Hopper's wgmma/setmaxnreg need the architecture-specific target sm_90a.
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def loader(backend: str = "cuda", prefer: str | None = None, ordinal: int = 0) -> Loader:
    """The loader for ``backend`` on device ``ordinal``: pycuda, else cuda-python (``prefer`` names one);
    hip-python for HIP.

    One per (backend, prefer, ordinal), however the arguments are spelled, so that the device a schedule was
    made for (:meth:`Loader.device_spec`) and the one :func:`~polyfuse.pipeline.build` loads onto are one object.
    """
    return _loader(backend, prefer, ordinal)


@functools.cache
def _loader(backend: str, prefer: str | None, ordinal: int) -> Loader:
    if backend == "hip":
        return HipPython(ordinal)
    if backend != "cuda":
        raise BackendUnavailable(f"no loader for backend {backend!r}")
    order = [prefer] if prefer else list(CUDA_LOADERS)
    reasons = []
    for name in order:
        if name not in CUDA_LOADERS:
            raise BackendUnavailable(f"unknown CUDA loader {name!r}; loaders are {', '.join(CUDA_LOADERS)}")
        try:
            return PyCuda(ordinal) if name == "pycuda" else CudaPython(ordinal)
        except BackendUnavailable as err:
            reasons.append(f"{name}: {err}")
    raise BackendUnavailable("no CUDA loader works here: " + "; ".join(reasons))
