"""Every access stays inside its tensor, for every value of the sizes.

Generated kernels index buffers without checks (their masks are the blocks'
domains, not the tensors' shapes): a C++ or CUDA load past the end returns
whatever lies there and a store corrupts a neighbour.  The interpreters check
bounds, but only when they run and only for the sizes they are given.  ISL
proves it once, for all sizes >= 1 (what the IR assumes, see
:func:`~polyfuse.deps.domains.positive_sizes`): an access is in bounds when its
relation over the block's iteration domain (its extents and ``where``; the
schedule checks that the loops run exactly those instances, however they bind
them) maps into ``0 <= e_d < shape_d`` in every dimension ``d``.  Indices with
``//`` and ``%`` of a constant (left by ``split`` and ``fuse``) are exact in ISL.

A refusal names the block, the reference, the dimension with its index and a
witness: the lexicographically smallest sizes, then the smallest instance, at
which the index leaves the tensor, and the element it would touch.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyfuse.deps.access import ACCUMULATOR, INIT, STORE, Access, block_accesses
from polyfuse.deps.domains import iteration_domain, param_names, positive_sizes
from polyfuse.deps.islconv import aff_text, build_set, param_env
from polyfuse.deps.memo import memoized
from polyfuse.errors import OutOfBounds
from polyfuse.ir.stmt import Block, Program, Tensor


@dataclass(frozen=True)
class BoundsViolation:
    """One access that leaves its tensor, with the first instance (and sizes) where it does."""

    block: str
    role: str
    text: str
    tensor: str
    dim: int
    index: str
    extent: str
    sizes: tuple[tuple[str, int], ...]
    instance: tuple[tuple[str, int], ...]
    element: tuple[int, ...]

    def message(self) -> str:
        verb = "writes" if self.role == STORE else "reads"
        where = " in its init" if self.role == INIT else ""
        at = ", ".join(f"{k} = {v}" for k, v in self.instance)
        if self.sizes:
            at += " with " + ", ".join(f"{k} = {v}" for k, v in self.sizes)
        element = f"{self.tensor}[{', '.join(str(e) for e in self.element)}]"
        return (f"block {self.block!r} {verb} tensor {self.tensor!r} out of bounds{where}: index {self.dim} of "
                f"{self.text} is {self.index}, which must lie in 0 <= {self.index} < {self.extent}; at {at} it is "
                f"{self.element[self.dim]}, so the block {verb} {element}. Restrict the block's instances (its "
                "extents or p.where(...)), or change the index or the tensor's shape.")


def out_of_bounds(program: Program) -> BoundsViolation | None:
    """The first access of ``program`` (blocks in program order) that can leave its tensor, or None."""
    params = param_names(program)
    for block in program.blocks():
        found = _block_violation(block, params)
        if found is not None:
            return found
    return None


def require_in_bounds(program: Program) -> Program:
    """``program`` itself, or :class:`~polyfuse.errors.OutOfBounds` naming the first access that can
    leave its tensor (see :meth:`BoundsViolation.message`)."""
    found = out_of_bounds(program)
    if found is not None:
        raise OutOfBounds(found.message())
    return program


@memoized(4096)
def _block_violation(block: Block, params: tuple[str, ...]) -> BoundsViolation | None:
    """Cached per block: a schedule step keeps most blocks, and the tensors they touch, as they are."""
    sizes = positive_sizes(params)
    for access in block_accesses(block, iteration_domain(block, params), params):
        if access.role == ACCUMULATOR:  # the store's own element, checked with the store
            continue
        tensor = access.ref.tensor
        outside = access.relation.intersect_params(sizes).subtract_range(_box(tensor, params))
        if outside.is_empty():
            continue
        for d in range(tensor.ndim):
            bad = outside.intersect_range(_box(tensor, params, d).complement())
            if not bad.is_empty():
                return _violation(access, d, bad)
    return None


@memoized(1024)
def _box(tensor: Tensor, params: tuple[str, ...], dim: int | None = None) -> isl.Set:
    """``{ X[e] : 0 <= e_d < shape_d }`` for every dimension ``d``, or only for ``dim``."""
    penv = param_env(params)
    cons = [f"0 <= _a{d} < {aff_text(extent, penv, what=f'tensor {tensor.name!r}, shape dimension {d}')}"
            for d, extent in enumerate(tensor.shape) if dim is None or d == dim]
    return build_set(params, tensor.name, [f"e{k}" for k in range(tensor.ndim)], cons)


def _violation(access: Access, d: int, bad: isl.Map) -> BoundsViolation:
    """The witness: ``bad`` (instances -> elements out of bounds in dimension ``d``) at its lexicographic
    minimum over (sizes, instance, element); the sizes are set dimensions for that, so they come first."""
    space = bad.get_space()
    sizes = [space.get_dim_name(isl.dim_type.param, k) for k in range(space.dim(isl.dim_type.param))]
    iters = [space.get_dim_name(isl.dim_type.in_, k) for k in range(space.dim(isl.dim_type.in_))]
    flat = bad.wrap().flatten()
    flat = flat.move_dims(isl.dim_type.set, 0, isl.dim_type.param, 0, len(sizes))
    point = flat.lexmin().sample_point()
    values = [point.get_coordinate_val(isl.dim_type.set, k).to_python() for k in range(flat.dim(isl.dim_type.set))]
    n, m = len(sizes), len(iters)
    ref = access.ref
    return BoundsViolation(
        block=access.block, role=access.role, text=access.text, tensor=ref.tensor.name, dim=d,
        index=str(ref.indices[d]), extent=str(ref.tensor.shape[d]),
        sizes=tuple(zip(sizes, values[:n], strict=True)), instance=tuple(zip(iters, values[n:n + m], strict=True)),
        element=tuple(values[n + m:]))


__all__ = ["BoundsViolation", "out_of_bounds", "require_in_bounds"]
