"""Tensor maps for the Hopper bulk tensor copy (TMA), encoded on the host by the CUDA driver.

A kernel that copies tiles with ``pf::tma_load_2d`` … ``_5d`` (``polyfuse/runtime/include/polyfuse_gpu.h``) takes
a 128-byte ``CUtensorMap`` by value (a ``const __grid_constant__`` parameter): the tensor's address, shape and
strides, the box one copy brings, and the shared-memory swizzle.  :func:`encode` asks the driver
(``cuTensorMapEncodeTiled`` of ``libcuda``, through ctypes: the same entry point on every binding) and returns
the map's bytes; the GPU runtime encodes the maps a generated source lists (``KernelSource.maps``) at launch.
"""

from __future__ import annotations

import ctypes
import functools

from polyfuse.errors import BackendUnavailable, LaunchError

DATA_TYPES = {"u8": 0, "u16": 1, "u32": 2, "i32": 3, "u64": 4, "i64": 5, "f16": 6, "f32": 7, "f64": 8, "bf16": 9}
"""``CUtensorMapDataType`` values (cuda.h)."""
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}
"""``CUtensorMapSwizzle`` values by swizzle width in bytes (0: none)."""


@functools.cache
def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise BackendUnavailable(f"TMA tensor maps need the CUDA driver (libcuda.so.1): {err}") from None


def encode_2d(pointer: int, dtype: str, rows: int, cols: int, row_bytes: int, box_rows: int, box_cols: int,
              swizzle: int = 128) -> bytes:
    """The 128-byte tensor map of a row-major ``rows × cols`` tensor of ``dtype`` at device address ``pointer``
    (rows ``row_bytes`` apart, a multiple of 16), copied ``box_rows × box_cols`` at a time into shared memory
    swizzled by ``swizzle`` bytes (the inner box then spans at most that many bytes); out-of-bounds elements are
    filled with zeros."""
    return encode(pointer, dtype, (cols, rows), (row_bytes,), (box_cols, box_rows), swizzle)


def encode(pointer: int, dtype: str, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
           swizzle: int = 128) -> bytes:
    """The 128-byte tensor map of a tensor of ``dtype`` at device address ``pointer`` with extents ``dims``
    (innermost first, at most five), dimension ``d + 1`` ``strides[d]`` bytes apart (multiples of 16), copied
    ``box`` at a time (innermost first) into shared memory swizzled by ``swizzle`` bytes; elements outside the
    tensor, in any dimension, are filled with zeros."""
    if dtype not in DATA_TYPES or swizzle not in SWIZZLES:
        raise LaunchError(f"tensor map: dtype {dtype!r} or swizzle {swizzle} not supported "
                          f"(dtypes {', '.join(DATA_TYPES)}; swizzles {', '.join(map(str, SWIZZLES))})")
    rank = len(dims)
    if not 1 <= rank <= 5 or len(strides) != rank - 1 or len(box) != rank:
        raise LaunchError(f"tensor map: {rank} dimensions with {len(strides)} strides and a box of {len(box)} "
                          "(one to five dimensions, one stride fewer, a box entry per dimension)")
    if any(s % 16 for s in strides) or pointer % 16:
        raise LaunchError(f"tensor map: the address {pointer:#x} and the strides {strides} (bytes) must be "
                          "multiples of 16")
    tensor_map = (ctypes.c_uint64 * 16)()
    err = _driver().cuTensorMapEncodeTiled(
        ctypes.byref(tensor_map), ctypes.c_int(DATA_TYPES[dtype]), ctypes.c_uint32(rank), ctypes.c_void_p(pointer),
        (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(1, rank - 1))(*strides),
        (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*([1] * rank)), ctypes.c_int(0),
        ctypes.c_int(SWIZZLES[swizzle]), ctypes.c_int(0), ctypes.c_int(0))
    if err != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {dtype} tensor of extents {dims} "
                          f"(innermost first), strides {strides} bytes, box {box}, swizzle {swizzle}")
    return bytes(tensor_map)
