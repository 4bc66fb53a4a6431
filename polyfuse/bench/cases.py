"""Which sizes a benchmark runs: an operator's benchmark presets, its test sizes, or a sweep of one size axis.

A sweep moves one axis of each preset, so that a rule of the code generator is judged on more than one shape.
The axis is the size the work grows with: queries = keys for attention prefill, the keys for decode, the reduced
length of the row reductions, the rows of the products.  Where the axis has values of its own
(:attr:`SweepAxis.values`: the row lengths 1024–32768, decode's 1024–32768 keys, prefill's 1024–16384 queries,
the shapes the code generator's rules change at) those are run; otherwise the preset's value is scaled by
``2**k`` for ``k`` in :data:`SWEEP_STEPS` (a quarter to four times the model shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from polyfuse.errors import PolyfuseError
from polyfuse.ops.base import Operator

SWEEP_STEPS = (-2, -1, 0, 1, 2)
"""Powers of two the preset's axis is scaled by in a sweep."""


@dataclass(frozen=True)
class SweepAxis:
    """The sizes a sweep sets (all to one value), the label of the case keys (``prefill_s1024``) and the values
    it runs (empty: the preset's value scaled by :data:`SWEEP_STEPS`)."""

    names: tuple[str, ...]
    label: str
    values: tuple[int, ...] = ()


ROW_LENGTHS = (1024, 4096, 8192, 32768)
"""Row lengths of the row reductions' sweep: rows that fit in registers, in shared memory, and rows that roll."""
DECODE_KEYS = (1024, 4096, 32768)
"""Keys of the decode sweep (each decode preset: batch 1 and 32)."""
PREFILL_LENGTHS = (1024, 2048, 4096, 8192, 16384)
"""Queries = keys of the prefill sweep."""

_AXES = {
    **{name: SweepAxis(("M",), "m", ROW_LENGTHS) for name in ("softmax_sum", "softmax", "logsumexp",
                                                              "l2norm_stable", "rmsnorm_amax", "sum_sum",
                                                              "layernorm_stats")},
    **{name: SweepAxis(("M",), "m") for name in ("quant_gemm", "quant_gemm_fp8")},
    "variance": SweepAxis(("L",), "l", ROW_LENGTHS),
    "inertia": SweepAxis(("N",), "n"),
    "moe_routing": SweepAxis(("S",), "s"),
    "performer": SweepAxis(("L",), "l"),
}
"""The sweep axis of the operators that are not attention. quant_gemm sweeps its rows only: the float64 NumPy
reference of a cube four times as large would take minutes."""


@dataclass(frozen=True)
class Case:
    """One benchmark case: an operator at a mode and sizes. ``group`` is the preset it comes from (the cases of
    one sweep share it) and ``axis`` the sizes the sweep moves (empty outside a sweep)."""

    operator: str
    key: str
    mode: str
    sizes: Mapping[str, int]
    group: str
    axis: tuple[str, ...] = ()


def sweep_axis(name: str, mode: str) -> SweepAxis:
    if name.startswith("attn_"):
        return (SweepAxis(("Sq", "Skv"), "s", PREFILL_LENGTHS) if mode == "prefill"
                else SweepAxis(("Skv",), "skv", DECODE_KEYS))
    try:
        return _AXES[name]
    except KeyError:
        raise PolyfuseError(f"operator {name!r} has no sweep axis") from None


def cases(op: Operator, which: str, wanted: set[str] = frozenset(),
          overrides: Mapping[str, int] | None = None) -> list[Case]:
    """The cases of ``op``: ``which`` is ``bench`` (its presets), ``test`` (its test sizes) or ``sweep`` (each
    preset along its axis); ``wanted`` keeps the preset keys or modes named (all if empty); ``overrides`` set
    sizes of every preset before a sweep scales it (an unknown name is a PolyfuseError)."""
    overrides = dict(overrides or {})
    unknown = sorted(wanted - set(op.modes) - set(op.presets))
    if unknown:
        raise PolyfuseError(f"operator {op.name!r} has no mode or preset {', '.join(map(repr, unknown))}; "
                            f"its modes: {', '.join(op.modes)}; presets: {', '.join(op.presets)}")
    if which == "test":
        presets = [(m, m, op.sizes(m, overrides)) for m in op.modes]
    else:
        presets = []
        for key, preset in op.presets.items():
            mode = key if key in op.modes else key.split("_")[0]
            presets.append((key, mode, op.sizes(mode, {**preset, **overrides})))
    presets = [p for p in presets if not wanted or p[0] in wanted or p[1] in wanted]
    if which != "sweep":
        return [Case(op.name, key, mode, sizes, key) for key, mode, sizes in presets]
    found = []
    for key, mode, sizes in presets:
        axis = sweep_axis(op.name, mode)
        base = sizes[axis.names[0]]
        values = axis.values or tuple(max(1, base * 2**k if k >= 0 else base >> -k) for k in SWEEP_STEPS)
        for value in values:
            swept = op.sizes(mode, {**sizes, **dict.fromkeys(axis.names, value)})
            found.append(Case(op.name, f"{key}_{axis.label}{value}", mode, swept, key, axis.names))
    return found
