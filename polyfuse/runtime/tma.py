"""Tensor maps for the Hopper bulk tensor copy (TMA), encoded on the host by the CUDA driver.

A kernel that copies tiles with ``pf::tma_load_2d`` (``polyfuse/runtime/include/polyfuse_gpu.h``) takes a
128-byte ``CUtensorMap`` by value (a ``const __grid_constant__`` parameter): the tensor's address, shape and
strides, the box one copy brings, and the shared-memory swizzle.  :func:`encode_2d` asks the driver
(``cuTensorMapEncodeTiled`` of ``libcuda``, through ctypes: the same entry point on every binding) and returns
the map's bytes.
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
    if dtype not in DATA_TYPES or swizzle not in SWIZZLES:
        raise LaunchError(f"tensor map: dtype {dtype!r} or swizzle {swizzle} not supported "
                          f"(dtypes {', '.join(DATA_TYPES)}; swizzles {', '.join(map(str, SWIZZLES))})")
    tensor_map = (ctypes.c_uint64 * 16)()
    err = _driver().cuTensorMapEncodeTiled(
        ctypes.byref(tensor_map), ctypes.c_int(DATA_TYPES[dtype]), ctypes.c_uint32(2), ctypes.c_void_p(pointer),
        (ctypes.c_uint64 * 2)(cols, rows), (ctypes.c_uint64 * 1)(row_bytes), (ctypes.c_uint32 * 2)(box_cols, box_rows),
        (ctypes.c_uint32 * 2)(1, 1), ctypes.c_int(0), ctypes.c_int(SWIZZLES[swizzle]), ctypes.c_int(0), ctypes.c_int(0))
    if err != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {rows}x{cols} {dtype} tensor, "
                          f"box {box_rows}x{box_cols}, swizzle {swizzle}")
    return bytes(tensor_map)
