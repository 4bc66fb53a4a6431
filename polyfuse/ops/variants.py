"""Input variants: the inputs that break floating point, as data.

Random inputs rarely hit the cases where a repair divides by a running value that is still 0,
or where a reference and the program disagree on NaN and inf.  A variant rewrites an operator's
random inputs into such a case: rows that start with zeros, rows of zeros, tied values, sorted
rows, and a few ±inf, NaN, huge and tiny entries.  Which inputs a variant touches, and how their
rows run, is declared once per operator as its :class:`Operand` tuple (the operands that are
reduced); ``Operator.inputs(..., variant=NAME)`` applies :data:`VARIANTS` ``[NAME]`` to them.

Rows: an operand's ``axis`` is the axis its reduction runs along.  The other axes index rows,
except the ``shared`` ones, whose slices are one element (a key vector ``k[b, h, j, :]`` is one
element of the row ``k[b, h, :, :]``: a zero key is a zero vector).  Every row gets its own
pattern (how many leading zeros, which kind of special value), chosen by its flat index, so that
a few rows cover every case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.ir.stmt import Tensor


@dataclass(frozen=True)
class Operand:
    """An input that variants rewrite, and the shape of its rows.

    ``huge`` and ``tiny`` are the magnitudes of the ``special`` variant's extreme entries (``None``:
    none): values that the operator's tolerance note covers (see each operator's note), and that
    its dtype represents.  What the program's input declares holds too: a ``sign`` (masses) keeps
    values non-negative and not NaN, ``finite`` keeps out ±inf and NaN (:func:`declared`).
    """

    name: str
    axis: int
    shared: tuple[int, ...] = ()
    huge: float | None = None
    tiny: float | None = None
    nonnegative: bool = False
    finite: bool = False


def declared(operand: Operand, tensor: Tensor) -> Operand:
    """``operand`` with what its program input ``tensor`` declares (``sign``, ``finite``)."""
    return dataclasses.replace(operand, nonnegative=tensor.sign is not None, finite=tensor.finite)


Rewrite = Callable[[np.ndarray, np.random.Generator, Operand], None]
"""Rewrites rows in place: ``rows`` has shape (rows, shared elements, row length)."""


@dataclass(frozen=True)
class InputVariant:
    name: str
    description: str
    rewrite: Rewrite | None


def leading_zero_counts(n: int) -> list[int]:
    """How many leading zeros the rows of length ``n`` get, row after row (cyclically).

    First half the row (rounded up): once a row spans 32 elements, the rolling loops of the default GPU
    schedules step over at most half of it (``schedules._fit``), so their whole first tile is zero.  Then
    all but the last element (any shorter row's tile), then every power of two below ``n``, so that some
    row is zero over exactly one tile whatever the (power-of-two) tile size.
    """
    counts = [(n + 1) // 2, n - 1] + [1 << k for k in range(max(n - 1, 1).bit_length()) if (1 << k) < n]
    return list(dict.fromkeys(c for c in counts if c >= 1)) or [n]


def _leading_zeros(rows: np.ndarray, rng: np.random.Generator, operand: Operand) -> None:
    counts = leading_zero_counts(rows.shape[-1])
    for r in range(rows.shape[0]):
        rows[r, :, :counts[r % len(counts)]] = 0


def _zero_rows(rows: np.ndarray, rng: np.random.Generator, operand: Operand) -> None:
    rows[::3] = 0


def _ties(rows: np.ndarray, rng: np.random.Generator, operand: Operand) -> None:
    """Each row becomes its own smallest and largest element (by the sum over shared axes), half and half
    in random order: the maximum repeats, and the row's variance is (max - min)²/4 (for an even length),
    at least its own (Popoviciu), so a tolerance that relies on the spread of the random values holds."""
    n = rows.shape[-1]
    for r in range(rows.shape[0]):
        key = rows[r].sum(axis=0)
        extremes = np.array([np.argmin(key), np.argmax(key)])
        rows[r] = rows[r][:, extremes[rng.permutation(np.arange(n) % 2)]]


def _monotone(rows: np.ndarray, rng: np.random.Generator, operand: Operand) -> None:
    """Rows ascending, descending, then ascending in magnitude (a running max|x| grows at every step)."""
    for r in range(rows.shape[0]):
        key = (rows[r], -rows[r], np.abs(rows[r]))[r % 3]
        rows[r] = np.take_along_axis(rows[r], np.argsort(key, axis=-1, kind="stable"), axis=-1)


def special_kinds(operand: Operand) -> list[str | None]:
    """The special entry of each row, cyclically (``None``: the row stays random)."""
    infinite = not operand.finite
    kinds = ["+inf" if infinite else None, "-inf" if infinite and not operand.nonnegative else None,
             "nan" if infinite and not operand.nonnegative else None,
             "huge" if operand.huge is not None else None, "tiny" if operand.tiny is not None else None]
    return [k for k in kinds if k is not None] + [None]


_NON_FINITE = {"+inf": np.inf, "-inf": -np.inf, "nan": np.nan}


def _magnitudes(operand: Operand, dtype: np.dtype) -> dict[str, float]:
    """The operand's huge and tiny magnitudes, refused unless ``dtype`` holds them as finite non-zero numbers."""
    out = {}
    for kind, value in (("huge", operand.huge), ("tiny", operand.tiny)):
        if value is None:
            continue
        with np.errstate(over="ignore"):
            stored = dtype.type(value)
        if not (np.isfinite(stored) and stored != 0):
            raise PolyfuseError(f"operand {operand.name!r}: its {kind} value {value:g} is not a finite, "
                                f"non-zero {dtype} number")
        out[kind] = value
    return out


def _special(rows: np.ndarray, rng: np.random.Generator, operand: Operand) -> None:
    """One entry of each row (at a random place) becomes the row's kind of :func:`special_kinds`; huge and
    tiny entries keep the sign of the value they replace."""
    kinds, magnitudes = special_kinds(operand), _magnitudes(operand, rows.dtype)
    for r in range(rows.shape[0]):
        kind = kinds[r % len(kinds)]
        j = int(rng.integers(rows.shape[-1]))
        if kind in magnitudes:
            sign = 1.0 if operand.nonnegative else np.where(rows[r, :, j] < 0, -1.0, 1.0)
            rows[r, :, j] = sign * magnitudes[kind]
        elif kind is not None:
            rows[r, :, j] = _NON_FINITE[kind]


VARIANTS: dict[str, InputVariant] = {v.name: v for v in (
    InputVariant("random", "the operator's random inputs", None),
    InputVariant("leading_zeros", "rows that start with zeros (half the row, all but the last element, "
                                  "each power of two)", _leading_zeros),
    InputVariant("zero_rows", "every third row entirely zero", _zero_rows),
    InputVariant("ties", "rows of their own minimum and maximum, each repeated (half and half)", _ties),
    InputVariant("monotone", "rows sorted ascending, descending, or by magnitude", _monotone),
    InputVariant("special", "one +inf, -inf, NaN, huge or tiny entry per row", _special),
)}


def _as_rows(array: np.ndarray, operand: Operand) -> tuple[np.ndarray, list[int], tuple[int, ...]]:
    """A copy of ``array`` shaped (rows, shared, row length), and how to move it back."""
    ndim = array.ndim
    named = (*operand.shared, operand.axis)
    axes = [a % ndim for a in named if -ndim <= a < ndim]
    if len(set(axes)) != len(named):
        raise PolyfuseError(f"operand {operand.name!r}: axis {operand.axis} and shared axes {operand.shared} "
                            f"do not fit its {ndim} dimensions")
    order = [a for a in range(ndim) if a not in axes] + axes
    moved = np.moveaxis(array, order, range(ndim))
    shared = int(np.prod(moved.shape[ndim - len(axes):-1], dtype=np.int64))
    return moved.reshape(-1, shared, moved.shape[-1]).copy(), order, moved.shape


def apply_variant(name: str, arrays: Mapping[str, np.ndarray], operands: tuple[Operand, ...], *,
                  seed: int, op: str) -> dict[str, np.ndarray]:
    """``arrays`` with variant ``name`` applied to ``operands`` (the others unchanged).

    The rewrite draws from a generator of its own (seeded by ``seed`` and the variant), so the
    random draw of the inputs is the same for every variant.
    """
    variant = VARIANTS.get(name)
    if variant is None:
        raise PolyfuseError(f"no input variant {name!r}; known: {', '.join(VARIANTS)}")
    out = dict(arrays)
    if variant.rewrite is None:
        return out
    if not operands:
        raise PolyfuseError(f"operator {op!r} declares no operands for input variants")
    rng = np.random.default_rng([seed, list(VARIANTS).index(name)])
    for operand in operands:
        if operand.name not in out:
            raise PolyfuseError(f"operator {op!r}: operand {operand.name!r} is not one of its inputs "
                                f"({', '.join(out)})")
        rows, order, shape = _as_rows(np.asarray(out[operand.name]), operand)
        variant.rewrite(rows, rng, operand)
        out[operand.name] = np.ascontiguousarray(np.moveaxis(rows.reshape(shape), range(len(order)), order))
    return out
