"""Execute a tile program with NumPy: named-axis arrays, every op rounded in its node dtype.

A tile value is an array with a list of axis names.  Elementwise operands are
aligned *by name* (the translator already made them agree; aligning again here
makes a mistake in the translator fail loudly instead of broadcasting wrongly).
Like :mod:`polyfuse.ir.interpreter`, temporaries and outputs start as NaN so a
read before a write shows up, and a masked-in access out of bounds is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polyfuse.errors import InternalError, IRError, PolyfuseError, UnboundSize
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Select, Var
from polyfuse.ir.gather import gather_error
from polyfuse.ir.interpreter import NUMPY_BINARY, NUMPY_UNARY, check_promises
from polyfuse.ir.stmt import INPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Broadcast, Dot, Gather, Index, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore,
    gathers, slice_axes,
)

_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "or": np.any}


@dataclass(frozen=True)
class _T:
    """A tile value: ``arr`` with one named axis per dimension."""

    arr: np.ndarray
    axes: tuple[str, ...]

    def to(self, axes: tuple[str, ...]) -> np.ndarray:
        """The array over ``axes`` (a superset, any order): transposed and with size-1 new axes."""
        if self.axes == axes:
            return self.arr
        missing = [a for a in self.axes if a not in axes]
        if missing:
            raise InternalError(f"tile over {self.axes} cannot be aligned to {axes}")
        present = [a for a in axes if a in self.axes]
        arr = np.transpose(self.arr, [self.axes.index(a) for a in present]) if self.arr.ndim else self.arr
        shape = [arr.shape[present.index(a)] if a in present else 1 for a in axes]
        return arr.reshape(shape)


def interpret(tile_program: TileProgram, inputs: Mapping[str, np.ndarray],
              sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Run ``tile_program`` on NumPy ``inputs`` (by tensor name) and return its outputs."""
    env: dict[str, np.ndarray] = {k: np.int64(v) for k, v in (sizes or {}).items()}
    params = {p.name for p in tile_program.params}
    for t in tile_program.tensors:
        if t.role == INPUT:
            if t.name not in inputs:
                raise IRError(f"tile program {tile_program.name!r} needs input {t.name!r}")
            for decl, got in zip(t.shape, np.shape(inputs[t.name]), strict=False):
                if isinstance(decl, Var) and decl.name in params:
                    env.setdefault(decl.name, np.int64(got))
    run = _Runner(env)
    for t in tile_program.tensors:
        try:
            shape = tuple(int(run.expr(d, env).arr) for d in t.shape)
        except KeyError as err:
            raise UnboundSize(f"tensor {t.name!r}: no value for size {err}") from None
        if t.role == INPUT:
            arr = np.asarray(inputs[t.name])
            if arr.dtype != t.dtype.numpy or arr.shape != shape:
                raise IRError(f"input {t.name!r} is {arr.dtype}{list(arr.shape)}, the program declares "
                              f"{t.dtype}{list(shape)}")
            check_promises(t, arr)
            run.buffers[t.name] = arr
        else:
            run.buffers[t.name] = np.full(shape, np.nan if t.dtype.is_float else 0, dtype=t.dtype.numpy)
    with np.errstate(all="ignore"):
        run.stmt(tile_program.body, env)
    return {t.name: run.buffers[t.name] for t in tile_program.outputs}


class _Runner:
    def __init__(self, env: dict[str, np.ndarray]):
        self.buffers: dict[str, np.ndarray] = {}
        self.block = ""  # the block of the statement being run, for error messages
        # values of the nodes of the statement being run (a tile statement reads before it writes)
        self.memo: dict[int, _T] = {}

    def stmt(self, s: Stmt, env: dict[str, np.ndarray]) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                self.stmt(c, env)
        elif isinstance(s, Loop):
            inner = dict(env)
            self.memo = {}
            for k in range(int(self.expr(s.extent, env).arr)):
                inner[s.var.name] = np.int64(k)
                self.stmt(s.body, inner)
        elif isinstance(s, TileStore):
            self.store(s, env)
        else:
            raise InternalError(f"cannot interpret statement {type(s).__name__}")

    def index(self, index: tuple[Index, ...], env: dict[str, np.ndarray]) -> tuple[list[np.ndarray], tuple[str, ...]]:
        """Index arrays of an access (open mesh over its slice axes) and those axes."""
        axes = slice_axes(index)
        out: list[np.ndarray] = []
        for i in index:
            if isinstance(i, Gather):
                out.append(np.asarray(self.expr(i.index, env).to(axes), dtype=np.int64))
            elif isinstance(i, Slice):
                shape = [1] * len(axes)
                shape[axes.index(i.axis)] = i.size
                start = self.expr(i.start, env).arr.astype(np.int64)
                out.append((start + np.arange(i.size, dtype=np.int64)).reshape(shape))
            else:
                out.append(np.asarray(self.expr(i, env).arr, dtype=np.int64).reshape([1] * len(axes)))
        return out, axes

    def _mask(self, mask: Expr | None, axes: tuple[str, ...], env: dict[str, np.ndarray]) -> np.ndarray:
        if mask is None:
            return np.ones([1] * len(axes), dtype=bool)
        return self.expr(mask, env).to(axes).astype(bool)

    def _check(self, where: str, tensor: str, idx: list[np.ndarray], mask: np.ndarray) -> None:
        shape = self.buffers[tensor].shape
        for d, (i, n) in enumerate(zip(idx, shape, strict=True)):
            if i.size and (i.min() < 0 or i.max() >= n) and np.any(((i < 0) | (i >= n)) & mask):
                raise PolyfuseError(f"{where} accesses tensor {tensor!r} out of bounds in dimension {d} "
                                    f"(size {n})")

    def _check_gathers(self, e: TileLoad, idx: list[np.ndarray], mask: np.ndarray) -> None:
        """A gathered index outside its dimension, in a lane the mask keeps, raises GatherOutOfBounds."""
        for d, g in gathers(e.index):
            n = self.buffers[e.tensor.name].shape[d]
            bad = ((idx[d] < 0) | (idx[d] >= n)) & mask
            if np.any(bad):
                access = f"{e.tensor.name}[{', '.join(g.text if k == d else '...' for k in range(len(e.index)))}]"
                raise gather_error(self.block, access, e.tensor.name, d, g.text, int(idx[d][bad].flat[0]), n)

    def store(self, s: TileStore, env: dict[str, np.ndarray]) -> None:
        self.block = s.block
        self.memo = {}
        if not any(isinstance(i, Slice) for i in s.index):
            self._scalar_store(s, env)
            return
        idx, axes = self.index(s.index, env)
        value = self.expr(s.value, env).to(axes)
        mask = self._mask(s.mask, axes, env)
        *ix, val, m = np.broadcast_arrays(*idx, value, mask)
        self._check(f"block {s.block!r}", s.tensor.name, ix, m)
        buf = self.buffers[s.tensor.name]
        sel = tuple(a[m] for a in ix)
        val = val[m]
        if s.reducer is not None:
            val = NUMPY_BINARY[{"sum": "+", "prod": "*", "max": "max", "min": "min"}[s.reducer]](buf[sel], val)
        buf[sel] = val.astype(buf.dtype, copy=False)

    def expr(self, e: Expr, env: dict[str, np.ndarray]) -> _T:
        found = self.memo.get(id(e))
        if found is None:
            found = self.memo[id(e)] = self._expr(e, env)
        return found

    def _expr(self, e: Expr, env: dict[str, np.ndarray]) -> _T:
        if isinstance(e, Var):
            return _T(np.asarray(env[e.name]), ())
        if isinstance(e, Const):
            return _T(np.asarray(e.value, dtype=e.dtype.numpy), ())
        if isinstance(e, TileLoad) and not any(isinstance(i, (Slice, Gather)) for i in e.index):
            return self._scalar_load(e, env)
        if isinstance(e, TileLoad):
            idx, axes = self.index(e.index, env)
            buf = self.buffers[e.tensor.name]
            mask = self._mask(e.mask, axes, env)
            *ix, m = np.broadcast_arrays(*idx, mask)
            self._check_gathers(e, ix, m)
            self._check(f"load of {e.tensor.name!r}", e.tensor.name, ix, m)
            safe = tuple(i if not i.size or (i.min() >= 0 and i.max() < n) else np.clip(i, 0, n - 1)
                         for i, n in zip(ix, buf.shape, strict=True))
            vals = buf[safe] if safe else buf[()]
            if e.mask is not None:
                vals = np.where(m, vals, np.asarray(e.other.value if e.other is not None else 0, dtype=buf.dtype))
            return _T(np.asarray(vals, dtype=buf.dtype), axes)
        if isinstance(e, Iota):
            return _T(np.arange(e.size, dtype=np.int64), (e.axis,))
        if isinstance(e, Broadcast):
            t = self.expr(e.tile, env)
            names = tuple(a for a, _ in e.axes)
            return _T(np.broadcast_to(t.to(names), tuple(n for _, n in e.axes)), names)
        if isinstance(e, Permute):
            t = self.expr(e.tile, env)
            if set(t.axes) != set(e.order):
                raise InternalError(f"permute of a tile over {t.axes} to {e.order}")
            return _T(t.to(e.order), e.order)
        if isinstance(e, Squeeze):
            t = self.expr(e.tile, env)
            return _T(np.squeeze(t.arr, t.axes.index(e.axis)), tuple(a for a in t.axes if a != e.axis))
        if isinstance(e, Reduce):
            t = self.expr(e.tile, env)
            out = _REDUCE[e.op](t.arr, axis=t.axes.index(e.axis))
            return _T(np.asarray(out, dtype=e.dtype.numpy), tuple(a for a in t.axes if a != e.axis))
        if isinstance(e, Dot):
            return self.dot(e, env)
        if isinstance(e, (BinOp, Select)):
            kids = [e.a, e.b] if isinstance(e, BinOp) else [e.cond, e.true_value, e.false_value]
            vals = [self.expr(k, env) for k in kids]
            axes = max((v.axes for v in vals), key=len)
            arrs = [v.to(axes) for v in vals]
            out = NUMPY_BINARY[e.op](*arrs) if isinstance(e, BinOp) else np.where(*arrs)
            return _T(np.asarray(out, dtype=e.dtype.numpy), axes)
        if isinstance(e, Call):
            x = self.expr(e.args[0], env)
            if e.fn == "sigmoid":
                one = np.asarray(1, dtype=x.arr.dtype)
                return _T(np.asarray(one / (one + np.exp(-x.arr)), dtype=x.arr.dtype), x.axes)
            return _T(np.asarray(NUMPY_UNARY[e.fn](x.arr), dtype=e.dtype.numpy), x.axes)
        if isinstance(e, Cast):
            x = self.expr(e.value, env)
            return _T(np.asarray(x.arr).astype(e.type.numpy), x.axes)
        raise InternalError(f"cannot interpret {type(e).__name__}")

    def _scalar_store(self, s: TileStore, env: dict[str, np.ndarray]) -> None:
        if s.mask is not None and not bool(self.expr(s.mask, env).arr):
            return
        buf = self.buffers[s.tensor.name]
        idx = tuple(int(self.expr(i, env).arr) for i in s.index)  # type: ignore[arg-type]
        for d, (i, n) in enumerate(zip(idx, buf.shape, strict=True)):
            if not 0 <= i < n:
                raise PolyfuseError(f"block {s.block!r} writes {s.tensor.name!r} out of bounds in dimension {d} "
                                    f"(size {n})")
        val = self.expr(s.value, env).arr
        if s.reducer is not None:
            val = NUMPY_BINARY[{"sum": "+", "prod": "*", "max": "max", "min": "min"}[s.reducer]](buf[idx], val)
        buf[idx] = np.asarray(val).astype(buf.dtype)

    def _scalar_load(self, e: TileLoad, env: dict[str, np.ndarray]) -> _T:
        """A load without slices: one element (the common case inside rolling loops), kept cheap."""
        buf = self.buffers[e.tensor.name]
        if e.mask is not None and not bool(self.expr(e.mask, env).arr):
            return _T(np.asarray(e.other.value if e.other is not None else 0, dtype=buf.dtype), ())
        idx = tuple(int(self.expr(i, env).arr) for i in e.index)  # type: ignore[arg-type]
        for d, (i, n) in enumerate(zip(idx, buf.shape, strict=True)):
            if not 0 <= i < n:
                raise PolyfuseError(f"load of {e.tensor.name!r} out of bounds in dimension {d} (size {n})")
        return _T(np.asarray(buf[idx]), ())

    def dot(self, e: Dot, env: dict[str, np.ndarray]) -> _T:
        a, b, acc = self.expr(e.a, env), self.expr(e.b, env), self.expr(e.acc, env)
        names = sorted(set(a.axes) | set(b.axes))
        letter = {n: chr(ord("a") + i) for i, n in enumerate(names)}
        out_axes = tuple(x for x in a.axes if x != e.axis) + tuple(
            x for x in b.axes if x != e.axis and x not in a.axes)
        spec = (f"{''.join(letter[x] for x in a.axes)},{''.join(letter[x] for x in b.axes)}"
                f"->{''.join(letter[x] for x in out_axes)}")
        dtype = e.dtype.numpy
        prod = np.einsum(spec, a.arr.astype(dtype), b.arr.astype(dtype))
        out = np.asarray(acc.to(out_axes) + prod, dtype=dtype)
        return _T(np.broadcast_to(out, prod.shape) if out.shape != prod.shape else out, out_axes)
