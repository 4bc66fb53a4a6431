"""What a catalog operator is, and how results are compared with its reference."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping

import ml_dtypes
import numpy as np

from polyfuse.errors import PolyfuseError
from polyfuse.ir import ProgramBuilder
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import Program
from polyfuse.ops.variants import Operand, apply_variant, declared

Sizes = dict[str, int]
Extent = int | Var
"""A size as a builder sees it: a Python int, or a size parameter of a generic program
(:meth:`Operator.generic_program`)."""
Arrays = dict[str, np.ndarray]


def ieee_reference(reference: Callable[..., Arrays]) -> Callable[..., Arrays]:
    """Marks a reference that meets NaN and inf where the program does (input variants put ±inf and NaN
    in the inputs, and rows of zeros give 0/0): it computes them silently, as the program does."""
    @functools.wraps(reference)
    def quiet(*args: object, **kwargs: object) -> Arrays:
        with np.errstate(invalid="ignore", divide="ignore"):
            return reference(*args, **kwargs)
    return quiet


ROWS_ON_THE_GRID = ("N is the rows, the grid of every GPU kernel (one thread block per row); M, the row length, "
                    "decides whether a row stays on chip and the tile of the rolling loop, so it stays a number")
"""Why a row operator's GPU kernels take only the rows as a size parameter (``Operator.gpu_symbolic``)."""


def extents(p: ProgramBuilder, sizes: Mapping[str, Extent], *names: str) -> tuple[Extent, ...]:
    """The sizes ``names`` for a builder: ints as given, a symbolic one declared on ``p`` as its size parameter."""
    return tuple(p.size(name) if isinstance(sizes[name], Var) else sizes[name] for name in names)


@dataclass(frozen=True)
class Operator:
    """One catalog entry.

    - ``build(mode, sizes) -> Program``: the plain, unfused program, written as a user would.
    - ``make_inputs(rng, mode, sizes, magnitude) -> {input name: array}`` in the program's input
      dtypes; ``magnitude`` scales values (e.g. 1e4 for logits where an unstable formula overflows).
    - ``reference(inputs, mode, sizes) -> {output name: float64 array}``: NumPy in float64.
    - ``tolerance(mode, sizes) -> {output name: (atol, rtol)}`` with the reason in ``tolerance_note``.
    - ``defaults[mode]``: small test sizes; ``presets[mode]``: benchmark sizes (model shapes).
    - ``operands``: the inputs that input variants (:mod:`polyfuse.ops.variants`) rewrite: the reduced ones.
    - ``symbolic``: the outer sizes (rows, batch, heads, sequence lengths) that the host kernel takes as size
      parameters, so that one compiled kernel serves every value (:meth:`generic_program`); the other sizes
      stay Python ints, because a schedule tiles them or a formula of the program needs their value.
    - ``gpu_symbolic[mode]``: the sizes that the GPU kernels (cuda, hip) take as parameters, a subset of the
      sizes of ``mode``: those that only the grid depends on (one thread block per row, per batch entry), so
      that no decision of the GPU schedule or plan reads them — not the row length that decides rows on chip
      and the tile, not a dimension split into tiles, not a count the split rules divide the device by.  A
      GPU kernel of the generic program then equals the one of fixed sizes but for the size parameters (a
      test compares them at every bench preset).  ``gpu_symbolic_note`` says why these and not the others.
    """

    name: str
    description: str
    build: Callable[[str, Sizes], Program]
    make_inputs: Callable[[np.random.Generator, str, Sizes, float], Arrays]
    reference: Callable[[Arrays, str, Sizes], Arrays]
    tolerance: Callable[[str, Sizes], dict[str, tuple[float, float]]]
    tolerance_note: str
    defaults: Mapping[str, Sizes]
    presets: Mapping[str, Sizes] = field(default_factory=dict)
    modes: tuple[str, ...] = ("default",)
    magnitudes: tuple[float, ...] = (1.0,)
    operands: tuple[Operand, ...] = ()
    symbolic: tuple[str, ...] = ()
    gpu_symbolic: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gpu_symbolic_note: str = ""

    def __post_init__(self) -> None:
        for mode, names in self.gpu_symbolic.items():
            unknown = [n for n in names if mode not in self.defaults or n not in self.defaults[mode]]
            if unknown:
                raise PolyfuseError(f"operator {self.name!r}: gpu_symbolic names {', '.join(unknown)}, not sizes of "
                                    f"mode {mode!r}")

    def symbolic_sizes(self, mode: str | None = None, target: str = "cpp") -> tuple[str, ...]:
        """The sizes that ``target``'s kernel of ``mode`` takes as size parameters: ``symbolic`` on the host,
        ``gpu_symbolic[mode]`` on a GPU (cuda, hip)."""
        if target in ("cuda", "hip"):
            return tuple(self.gpu_symbolic.get(self.mode_or_default(mode), ()))
        return self.symbolic

    def mode_or_default(self, mode: str | None) -> str:
        if mode is None:
            return self.modes[0]
        if mode not in self.modes:
            raise PolyfuseError(f"operator {self.name!r} has modes {', '.join(self.modes)}, not {mode!r}")
        return mode

    def sizes(self, mode: str | None = None, overrides: Mapping[str, int] | None = None) -> Sizes:
        """Default test sizes of ``mode`` with ``overrides`` applied (unknown names are an error)."""
        m = self.mode_or_default(mode)
        out = dict(self.defaults[m])
        for k, v in (overrides or {}).items():
            if k not in out:
                raise PolyfuseError(f"operator {self.name!r} has no size {k!r}; its sizes: {', '.join(out)}")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PolyfuseError(f"operator {self.name!r}: size {k} must be a positive integer, got {v!r}")
            out[k] = v
        return out

    def program(self, mode: str | None = None, **sizes: int) -> Program:
        m = self.mode_or_default(mode)
        return self.build(m, self.sizes(m, sizes))

    def generic_program(self, mode: str | None = None, target: str = "cpp", **sizes: int) -> Program:
        """The program with ``target``'s symbolic sizes (:meth:`symbolic_sizes`) as size parameters and the others at
        ``sizes`` (defaults): the kernel compiled from it runs at every value of the symbolic sizes."""
        m = self.mode_or_default(mode)
        symbolic = self.symbolic_sizes(m, target)
        return self.build(m, {k: Var(k) if k in symbolic else v for k, v in self.sizes(m, sizes).items()})

    def static_sizes(self, mode: str | None = None, overrides: Mapping[str, int] | None = None,
                     target: str = "cpp") -> Sizes:
        """The sizes that :meth:`generic_program` builds in for ``target``: all but its symbolic ones."""
        symbolic = self.symbolic_sizes(mode, target)
        return {k: v for k, v in self.sizes(mode, overrides).items() if k not in symbolic}

    def inputs(self, seed: int = 0, mode: str | None = None, sizes: Mapping[str, int] | None = None,
               magnitude: float = 1.0, variant: str = "random") -> Arrays:
        """Random inputs (``seed``, ``magnitude``) rewritten by the input ``variant`` (``variants.VARIANTS``)."""
        m = self.mode_or_default(mode)
        self.require_magnitude(magnitude, m, self.sizes(m, sizes))
        arrays = self.make_inputs(np.random.default_rng(seed), m, self.sizes(m, sizes), magnitude)
        if variant == "random":
            return arrays
        inputs = {t.name: t for t in self.build(m, self.sizes(m, sizes)).inputs}
        operands = tuple(declared(o, inputs[o.name]) if o.name in inputs else o for o in self.operands)
        return apply_variant(variant, arrays, operands, seed=seed, op=self.name)


    def require_magnitude(self, magnitude: float, mode: str, sizes: Sizes) -> None:
        """PolyfuseError unless random inputs scaled by ``magnitude`` can be finite.

        A NaN or infinite scale, or one beyond a floating input's largest finite value, makes every nonzero
        input inf or NaN; the outputs and the reference are then NaN alike and the comparison passes without
        checking anything, so such a scale is refused instead.
        """
        if not math.isfinite(magnitude):
            raise PolyfuseError(f"magnitude {magnitude} is not finite: every input would be inf or NaN and the "
                                f"check would compare NaN with NaN; give a finite scale")
        for tensor in self.build(mode, sizes).inputs:
            if tensor.dtype.is_float:
                largest = float(ml_dtypes.finfo(tensor.dtype.numpy).max)
                if abs(magnitude) > largest:
                    raise PolyfuseError(f"magnitude {magnitude:g} overflows input {tensor.name!r} of {self.name} "
                                        f"({tensor.dtype}, largest finite {largest:.5g}): every nonzero entry would "
                                        f"be inf; give at most {largest:.5g}")


@dataclass(frozen=True)
class Comparison:
    """Errors of a result against the float64 reference, and whether they are in tolerance."""

    max_abs_err: float
    max_rel_err: float
    tol: str
    ok: bool
    worst: str

    def line(self) -> str:
        return (f"max_abs_err={self.max_abs_err:.3e} max_rel_err={self.max_rel_err:.3e} "
                f"tol={self.tol} {'OK' if self.ok else 'FAIL'}")


def compare(results: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
            tolerance: Mapping[str, tuple[float, float]]) -> Comparison:
    """Elementwise ``|out - ref| <= atol + rtol·|ref|`` for every output; NaN/inf must match exactly.

    ``max_rel_err`` is ``|out - ref| / max(|ref|, atol)`` so that it is meaningful near zero.  A
    non-finite result where the reference is finite is an infinite error; ``worst`` names the first
    mismatch of special values with both values.
    """
    max_abs = max_rel = 0.0
    ok = True
    worst = ""
    tols = []
    for name, ref in reference.items():
        if name not in results:
            raise PolyfuseError(f"result has no output {name!r}")
        out = np.asarray(results[name]).astype(np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape:
            raise PolyfuseError(f"output {name!r} has shape {out.shape}, the reference {ref.shape}")
        atol, rtol = tolerance[name]
        tols.append(f"{name}:{atol:.0e}+{rtol:.0e}*|ref|" if len(reference) > 1 else f"{atol:.0e}+{rtol:.0e}*|ref|")
        finite = np.isfinite(ref)
        special = ~np.isfinite(out) | ~finite
        same = (out == ref) | (np.isnan(out) & np.isnan(ref))
        if np.any(special & ~same):
            i = int(np.flatnonzero((special & ~same).ravel())[0])
            ok = False
            worst = worst or f"{name}: {out.ravel()[i]} where the reference is {ref.ravel()[i]} at flat index {i}"
        with np.errstate(invalid="ignore"):
            err = np.abs(out[finite] - ref[finite])
        err[np.isnan(err)] = np.inf
        if err.size:
            bound = atol + rtol * np.abs(ref[finite])
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.where(err == 0, 0.0, err / np.maximum(np.abs(ref[finite]), atol))
            a, r = float(np.max(err)), float(np.max(rel))
            if a > max_abs:
                max_abs, worst = a, worst or name
            max_rel = max(max_rel, r)
            if np.any(~(err <= bound)) and np.all(np.isfinite(err)):
                ok = False
                i = int(np.argmax(err / bound))
                at = int(np.flatnonzero(finite.ravel())[i])
                worst = f"{name}: err {err[i]:.3e} > {bound[i]:.3e} at flat index {at}"
    return Comparison(max_abs, max_rel, ",".join(tols), ok, worst)
