"""Load device code and launch kernels: pycuda, cuda-python (``cuda.bindings``) or hip-python.

Each loader offers the same small interface — load an image, find a function, allow it more
shared memory, launch it, allocate and copy memory — over the device's primary context, the
one PyTorch and CuPy use too, so pointers from either work in place.  :func:`loader` picks
pycuda where it is installed and cuda-python otherwise (``prefer`` chooses); HIP has
hip-python only.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
from typing import Any

from polyfuse.errors import BackendUnavailable, LaunchError

CUDA_LOADERS = ("pycuda", "cuda-python")


class Loader:
    """What the GPU runtime needs from a driver binding."""

    name = "?"
    backend = "cuda"

    def arch(self) -> str:
        raise NotImplementedError

    def load(self, image: bytes) -> Any:
        raise NotImplementedError

    def function(self, module: Any, name: str, shared: int) -> Any:
        raise NotImplementedError

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0) -> None:
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


def _packed(pointers: list[int], sizes: list[int]) -> tuple[list, Any]:
    """ctypes values and the array of their addresses that cuLaunchKernel takes as kernelParams."""
    values = [ctypes.c_void_p(p) for p in pointers] + [ctypes.c_int64(s) for s in sizes]
    array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return values, array


class CudaPython(Loader):
    """NVIDIA's cuda-python driver bindings (``cuda.bindings.driver``, or ``cuda.cuda`` before 12.6)."""

    name = "cuda-python"

    def __init__(self) -> None:
        try:
            from cuda.bindings import driver
        except ImportError:
            try:
                from cuda import cuda as driver
            except ImportError:
                raise BackendUnavailable("cuda-python is not installed (pip install cuda-python)") from None
        self.cu = driver
        self.check(driver.cuInit(0), "cuInit")
        count = self.check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        if not count:
            raise BackendUnavailable("cuda-python found no CUDA device")
        self.device = self.check(driver.cuDeviceGet(0), "cuDeviceGet")
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
               sizes: list[int], stream: int = 0) -> None:
        _values, array = _packed(pointers, sizes)
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

    def __init__(self) -> None:
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

    def load(self, image: bytes) -> Any:
        return self.drv.module_from_buffer(image)

    def function(self, module: Any, name: str, shared: int) -> Any:
        fn = module.get_function(name)
        if shared > 48 * 1024:
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        return fn

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0) -> None:
        fmt = "P" * len(pointers) + "q" * len(sizes)
        if getattr(fn, "_polyfuse_format", None) != fmt:
            fn.prepare(fmt)
            fn._polyfuse_format = fmt
        try:
            fn.prepared_call((blocks, 1), (threads, 1, 1), *pointers, *sizes, shared_size=shared)
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

    def __init__(self) -> None:
        try:
            from hip import hip
        except ImportError:
            raise BackendUnavailable("hip-python is not installed (pip install hip-python)") from None
        self.hip = hip
        count = self.check(hip.hipGetDeviceCount(), "hipGetDeviceCount")
        if not count:
            raise BackendUnavailable("hip-python found no HIP device")
        self.check(hip.hipSetDevice(0), "hipSetDevice")

    def check(self, result: tuple, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise LaunchError(f"{what} failed: {self.hip.hipGetErrorString(err)}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else tuple(rest)

    def arch(self) -> str:
        props = self.hip.hipDeviceProp_t()
        self.check(self.hip.hipGetDeviceProperties(props, 0), "hipGetDeviceProperties")
        name = props.gcnArchName
        return (name.decode() if isinstance(name, bytes) else str(name)).split(":")[0]

    def load(self, image: bytes) -> Any:
        return self.check(self.hip.hipModuleLoadData(image), "hipModuleLoadData")

    def function(self, module: Any, name: str, shared: int) -> Any:
        return self.check(self.hip.hipModuleGetFunction(module, name.encode()), f"hipModuleGetFunction({name})")

    def launch(self, fn: Any, blocks: int, threads: int, shared: int, pointers: list[int],
               sizes: list[int], stream: int = 0) -> None:
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


def _host_view(address: int, nbytes: int):
    import numpy as np

    return np.ctypeslib.as_array((ctypes.c_uint8 * max(1, nbytes)).from_address(address))[:nbytes]


def _sm(major: int, minor: int) -> str:
    # Hopper's wgmma/setmaxnreg need the architecture-specific target sm_90a.
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


@functools.cache
def loader(backend: str = "cuda", prefer: str | None = None) -> Loader:
    """The loader for ``backend``: pycuda, else cuda-python (``prefer`` names one); hip-python for HIP."""
    if backend == "hip":
        return HipPython()
    if backend != "cuda":
        raise BackendUnavailable(f"no loader for backend {backend!r}")
    order = [prefer] if prefer else list(CUDA_LOADERS)
    reasons = []
    for name in order:
        if name not in CUDA_LOADERS:
            raise BackendUnavailable(f"unknown CUDA loader {name!r}; loaders are {', '.join(CUDA_LOADERS)}")
        try:
            return PyCuda() if name == "pycuda" else CudaPython()
        except BackendUnavailable as err:
            reasons.append(f"{name}: {err}")
    raise BackendUnavailable("no CUDA loader works here: " + "; ".join(reasons))
