"""annotate / bind: say how a loop runs (unrolled, vectorized, parallel, bound to GPU indices).

Preconditions (checked first):
  1. the loop encloses the block;
  2. for ``parallel``, ``vectorized`` and GPU bindings: no dependence is carried by the
     loop — checked by reversing the loop with the dependence analysis: a carried
     dependence would then run backwards and is reported with a witness;
  3. a bound loop gets one of the thread tags ``blockIdx.x`` … ``threadIdx.z``.

``unrolled`` only changes how code is emitted, never the order, so it is always legal.
No kind changes the sequential order the program means, so precondition 2 is the
whole legality check.
"""

from __future__ import annotations

from polyfuse import deps
from polyfuse.errors import IllegalTransform
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import BOUND, PARALLEL, THREAD_TAGS, UNROLLED, VECTORIZED, WARPS, Program
from polyfuse.transforms.tree import blocks_under, find_loop, rebind, replace_node
from polyfuse.ir.validate import validate


def _require_no_carried_dependence(program: Program, block: str, loop: str, what: str) -> None:
    lp = find_loop(program, block, loop)
    reversed_loop = lp.replace(body=rebind(lp.body, {loop: (lp.extent - 1) - Var(loop)}))
    backwards = program.replace(body=replace_node(program.body, lp, reversed_loop))
    # Reversing the loop reorders only the instances inside it.
    touched = deps.tensors_of(*blocks_under(lp))
    broken = deps.violated(deps.analyze(program, tensors=touched), backwards)
    if broken:
        first = broken[0]
        raise IllegalTransform(f"{what}: loop {loop!r} carries a dependence, so its iterations cannot run in "
                               f"parallel: {first}")


def annotate(program: Program, *, block: str, loop: str, kind: str,
             annotations: tuple[tuple[str, object], ...] = ()) -> Program:
    """Mark loop ``loop`` (enclosing ``block``) as ``unrolled``, ``vectorized`` or ``parallel``."""
    what = f"annotate loop {loop!r} (block {block!r}) as {kind}"
    if kind not in (UNROLLED, VECTORIZED, PARALLEL):
        raise IllegalTransform(f"{what}: kind must be one of {UNROLLED}, {VECTORIZED}, {PARALLEL}")
    lp = find_loop(program, block, loop)
    if kind != UNROLLED:
        _require_no_carried_dependence(program, block, loop, what)
    new = lp.replace(kind=kind, thread=None, annotations=lp.annotations + tuple(annotations))
    return validate(program.replace(body=replace_node(program.body, lp, new)))


def set_warps(program: Program, *, block: str, loop: str, warps: int) -> Program:
    """Ask for ``warps`` warps per thread block in the GPU kernel whose grid holds loop ``loop``.

    A launch hint, not a reordering: always legal.  It is a ``("warps", n)`` annotation of the loop,
    replacing an earlier one; the grid stage reads it from the kernel's grid loops (the host backend
    ignores it).
    """
    what = f"set warps of loop {loop!r} (block {block!r}) to {warps!r}"
    if isinstance(warps, bool) or not isinstance(warps, int) or not 1 <= warps <= 32:
        raise IllegalTransform(f"{what}: warps must be an integer from 1 to 32 (a block has at most 1024 threads)")
    lp = find_loop(program, block, loop)
    kept = tuple((k, v) for k, v in lp.annotations if k != WARPS)
    new = lp.replace(annotations=(*kept, (WARPS, warps)))
    return validate(program.replace(body=replace_node(program.body, lp, new)))


def bind(program: Program, *, block: str, loop: str, thread: str) -> Program:
    """Bind loop ``loop`` (enclosing ``block``) to a GPU index such as ``blockIdx.x``."""
    what = f"bind loop {loop!r} (block {block!r}) to {thread}"
    if thread not in THREAD_TAGS:
        raise IllegalTransform(f"{what}: thread tag must be one of {', '.join(THREAD_TAGS)}")
    lp = find_loop(program, block, loop)
    _require_no_carried_dependence(program, block, loop, what)
    new = lp.replace(kind=BOUND, thread=thread)
    return validate(program.replace(body=replace_node(program.body, lp, new)))
