"""Which loop a reduction fusion may roll or split over, checked on the block instances with ISL.

Both fusions rewrite a producer reduction P under a loop L on the assumption that L cuts
P's updates of each element (each spatial point of P) into consecutive parts, the first
of which starts with the element's init:

- ``rolling_update`` keeps P's value from before each iteration of L (``P_save``: the
  identity in iteration 0, P's value otherwise) and repairs the consumer from it, so the
  value P has at the start of an iteration must be what the iterations before reduced;
- ``split_k_update`` privatizes P over L: each iteration of L must hold complete partial
  results, independent of the other iterations.

Checked for every element, on P's iteration domain and the program's schedule:

  1. *whole*: all its instances run inside one execution of L (the loops around L take
     one value for all of them) — else an iteration of L holds only part of a split
     (the inner loop of ``split(j, [None, T])``), and the parts of other executions
     interleave with it;
  2. *forward*: its first instance in program order is its init (all reduce iterations
     0) — a reduction run backwards (``j = M - 1 - j'``) initialises the element after
     updating it, so the value before an iteration is not what the earlier ones reduced;
  3. *first iteration* (rolling): the init runs in iteration 0 of L, where ``P_save``
     stores the identity — a loop that also carries a spatial dimension (``fuse(i, j)``)
     starts the reduction of row 1 in the middle;
  4. *split* (split-k): a loop inside L binds a reduce iteration too, so each split
     reduces, rather than holding one element.

Each refusal is an :class:`IllegalTransform` naming the block, the loop, an element and
what to do instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import islpy as isl

from polyfuse import deps
from polyfuse.deps.domains import first_reduce_instances, iteration_domain, param_names
from polyfuse.deps.islconv import build_map
from polyfuse.deps.schedule import loop_point_to_instance
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import const
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Block, Loop, Program
from polyfuse.ir.visit import substitute
from polyfuse.transforms.tree import binding_loop_vars, find_loop, loops_of


def require_rolling_loop(program: Program, blocks: Sequence[str], *, loop_block: str, loop: str, what: str) -> None:
    """Conditions 1-3 of the module docstring for each reduction in ``blocks`` (all under the loop)."""
    for name in blocks:
        _Instances(program, name, find_loop(program, loop_block, loop), what).require(first_iteration=True)


def require_split_loop(program: Program, blocks: Sequence[str], *, loop_block: str, loop: str, what: str) -> None:
    """Conditions 1, 2 and 4 of the module docstring for each reduction in ``blocks`` (all under the loop)."""
    for name in blocks:
        inst = _Instances(program, name, find_loop(program, loop_block, loop), what)
        inst.require(first_iteration=False)
        inst.require_reduction_inside()


class _Instances:
    """A reduction block's instances, the loops around it and their relations, for the checks."""

    def __init__(self, program: Program, block: str, loop: Loop, what: str):
        self.program = program
        self.block: Block = program.block(block)
        self.loops = loops_of(program, block)
        self.depth = next(k for k, lp in enumerate(self.loops) if lp is loop)
        self.loop = loop.var.name
        self.what = what
        self.params = param_names(program)
        self.domain = iteration_domain(self.block, self.params)
        # { B[iters] -> [l_0, …, l_d] }: the loop point each instance runs at.
        self.points = loop_point_to_instance(self.block, self.loops, self.params, self.domain).reverse()
        spatial = [f"_a{k}" for k, iv in enumerate(self.block.iters) if not iv.is_reduce]
        # { B[iters] -> [spatial iters] }: the element each instance updates.
        self.element = build_map(self.params, [iv.var.name for iv in self.block.iters], spatial, [],
                                 in_name=block).intersect_domain(self.domain)

    def require(self, *, first_iteration: bool) -> None:
        self._require_whole()
        self._require_forward()
        if first_iteration:
            self._require_first_iteration()

    def _require_whole(self) -> None:
        """Condition 1: the loops around L take one value per element."""
        for k in range(self.depth):
            coordinate = self.points.project_out(isl.dim_type.out, k + 1, self.points.dim(isl.dim_type.out) - k - 1)
            coordinate = coordinate.project_out(isl.dim_type.out, 0, k)
            per_element = self.element.reverse().apply_range(coordinate)
            if per_element.is_single_valued():
                continue
            outer = self.loops[k].var.name
            witness = self._element_text(_not_single_valued(per_element))
            raise IllegalTransform(
                f"{self.what}: loop {outer!r}, outside loop {self.loop!r}, also binds the reduction of block "
                f"{self.block.name!r} ({self._bindings()}): element {witness} is reduced in several iterations of "
                f"{outer!r}, so one iteration of {self.loop!r} holds only part of it; use the outermost loop "
                f"binding the reduction, {self._outermost_reduce_loop()!r} (the outer loop of a split)")

    def _require_forward(self) -> None:
        """Condition 2: no instance of an element runs before the element's init."""
        time = deps.instance_schedule(self.program, deps.domains(self.program))[self.block.name]
        same = self.element.apply_range(self.element.reverse())
        init = first_reduce_instances(self.block, self.domain)
        early = time.lex_lt_map(time).intersect(same).intersect_range(init)
        if early.is_empty():
            return
        before = time.intersect_range(time.intersect_domain(early.domain()).range().lexmin()).domain()
        first = same.intersect_domain(before).range().intersect(init)
        raise IllegalTransform(
            f"{self.what}: the loops run the reduction of block {self.block.name!r} backwards "
            f"({self._bindings()}): instance {self._instance_text(before)} runs before the init of its element, "
            f"at {self._instance_text(first)}; the fusion takes the first iteration of loop {self.loop!r} to "
            "start each element's reduction, so run the reduction forward (bind it with increasing loops)")

    def _require_first_iteration(self) -> None:
        """Condition 3: each element's init runs in iteration 0 of L."""
        init = first_reduce_instances(self.block, self.domain)
        at = self.points.intersect_domain(init)
        later = at.intersect_range(at.range().lower_bound_val(
            isl.dim_type.set, self.depth, isl.Val.one(at.get_ctx())))
        if later.is_empty():
            return
        point = later.domain().lexmin()
        iteration = later.intersect_domain(point).range().lexmin().sample_point().get_coordinate_val(
            isl.dim_type.set, self.depth).to_python()
        why = (f"loop {self.loop!r} also binds the spatial iteration(s) of {self.block.name!r} "
               f"({self._bindings(reduce=False)}), so each element's reduction starts in the middle of it; roll over "
               "a loop that binds only the reduction (fuse the loops after the rolling update, not before)"
               if self.loop in binding_loop_vars(self.block, reduce=False) else
               f"its first iterations hold no instance of that element ({self._bindings()}); roll over a loop whose "
               "first iteration starts every element's reduction")
        raise IllegalTransform(
            f"{self.what}: the reduction of element {self._element_text(self.element.intersect_domain(point).range())}"
            f" of block {self.block.name!r} starts (its init, {self._instance_text(point)}) in iteration "
            f"{iteration} of loop {self.loop!r}, not in its first, where the fusion keeps the reducer's identity as "
            f"the value before the loop: {why}")

    def require_reduction_inside(self) -> None:
        """Condition 4: a loop inside L binds a reduce iteration, so each split holds a reduction."""
        reduce_loops = binding_loop_vars(self.block, reduce=True)
        if any(lp.var.name in reduce_loops for lp in self.loops[self.depth + 1:]):
            return
        raise IllegalTransform(
            f"{self.what}: no loop inside loop {self.loop!r} binds the reduction of block {self.block.name!r} "
            f"({self._bindings()}), so each split would hold a single update; split the loop first "
            f"(sch.split(sch.loop({self.block.name!r}, {self.loop!r}), [n_splits, None])) and split-k over its "
            "outer loop")

    # ------------------------------------------------------------------ message pieces
    def _bindings(self, *, reduce: bool = True) -> str:
        return ", ".join(f"{iv.var.name} = {b}" for iv, b in zip(self.block.iters, self.block.bindings, strict=True)
                         if iv.is_reduce == reduce)

    def _outermost_reduce_loop(self) -> str:
        reduce_loops = binding_loop_vars(self.block, reduce=True)
        return next(lp.var.name for lp in self.loops if lp.var.name in reduce_loops)

    def _instance_text(self, instances: isl.Set) -> str:
        point = instances.lexmin().sample_point()
        coords = ", ".join(f"{iv.var.name} = {point.get_coordinate_val(isl.dim_type.set, k).to_python()}"
                           for k, iv in enumerate(self.block.iters))
        return f"{self.block.name}[{coords}]" + self._sizes_text(point)

    def _element_text(self, elements: isl.Set) -> str:
        """The element the block stores at a point of its spatial iterations: ``xmax[1]``."""
        point = elements.lexmin().sample_point()
        values = {iv.var.name: const(point.get_coordinate_val(isl.dim_type.set, k).to_python())
                  for k, iv in enumerate(self.block.spatial_iters)}
        store = self.block.store
        index = ", ".join(str(simplify(substitute(e, values))) for e in store.indices)
        return f"{store.tensor.name}[{index}]" + self._sizes_text(point)

    def _sizes_text(self, point: isl.Point) -> str:
        if not self.params:
            return ""
        space = point.get_space()
        values = [point.get_coordinate_val(isl.dim_type.param, space.find_dim_by_name(isl.dim_type.param, p))
                  for p in self.params]
        return " (with " + ", ".join(f"{p} = {v.to_python()}" for p, v in zip(self.params, values, strict=True)) + ")"


def _not_single_valued(per_element: isl.Map) -> isl.Set:
    """The elements a map sends to two different values."""
    lower = per_element.apply_range(isl.Map.lex_lt(per_element.range().get_space()))
    return lower.intersect(per_element).domain()


__all__ = ["require_rolling_loop", "require_split_loop"]
