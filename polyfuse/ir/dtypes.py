"""Scalar data types of the IR and their NumPy counterparts.

bfloat16 and float8 e4m3 come from ``ml_dtypes`` so that the interpreter rounds
exactly as the hardware formats do.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from polyfuse.errors import IRError


@dataclass(frozen=True)
class DType:
    """A scalar type: its short name, kind (``float``, ``int``, ``bool``) and width."""

    name: str
    kind: str
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY[self.name]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.name


f16 = DType("f16", "float", 16)
bf16 = DType("bf16", "float", 16)
f32 = DType("f32", "float", 32)
f64 = DType("f64", "float", 64)
fp8e4m3 = DType("fp8e4m3", "float", 8)
i32 = DType("i32", "int", 32)
i64 = DType("i64", "int", 64)
bool_ = DType("bool", "bool", 1)

ALL_DTYPES = (f16, bf16, f32, f64, fp8e4m3, i32, i64, bool_)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_ALIASES = {
    "float16": f16, "half": f16, "bfloat16": bf16, "float32": f32, "float": f32,
    "float64": f64, "double": f64, "int32": i32, "int64": i64, "e4m3": fp8e4m3,
    "float8_e4m3fn": fp8e4m3, "fp8": fp8e4m3,
}
_NUMPY = {
    "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
    "fp8e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64), "bool": np.dtype(np.bool_),
}
_FROM_NUMPY = {v: _BY_NAME[k] for k, v in _NUMPY.items()}

# Float types ordered by how much they can represent; promotion picks the widest.
_FLOAT_RANK = {"fp8e4m3": 0, "f16": 1, "bf16": 1, "f32": 2, "f64": 3}


def dtype(spec: DType | str | np.dtype | type) -> DType:
    """Normalise a dtype given as a DType, a name (``"f16"``, ``"float16"``) or a NumPy dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        found = _BY_NAME.get(spec) or _ALIASES.get(spec)
        if found is None:
            names = ", ".join(sorted(_BY_NAME))
            raise IRError(f"unknown dtype {spec!r}; known dtypes: {names}")
        return found
    try:
        return _FROM_NUMPY[np.dtype(spec)]
    except (TypeError, KeyError):
        raise IRError(f"dtype {spec!r} has no polyfuse counterpart") from None


def promote(a: DType, b: DType) -> DType:
    """The type two operands of an arithmetic operation are converted to.

    Floats win over ints; among floats the wider one wins; f16 with bf16 gives f32
    (neither holds the other).
    """
    if a == b:
        return a
    if a.is_float and b.is_float:
        ra, rb = _FLOAT_RANK[a.name], _FLOAT_RANK[b.name]
        if ra == rb:
            return f32
        return a if ra > rb else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    return a if a.bits >= b.bits else b


def lowest(dt: DType) -> float | int | bool:
    """The smallest value of a type (``-inf`` for floats that have it)."""
    if dt == fp8e4m3:
        return -448.0
    if dt.is_float:
        return float("-inf")
    if dt.is_bool:
        return False
    return int(np.iinfo(dt.numpy).min)


def highest(dt: DType) -> float | int | bool:
    """The largest value of a type (``inf`` for floats that have it)."""
    if dt == fp8e4m3:
        return 448.0
    if dt.is_float:
        return float("inf")
    if dt.is_bool:
        return True
    return int(np.iinfo(dt.numpy).max)
