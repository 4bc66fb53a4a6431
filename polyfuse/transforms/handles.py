"""What each schedule step did to the names a user holds, so that a stale handle says what it became.

Names are stable unless a step changes them, and the steps that do change them do so predictably:

- ``split``, ``tile`` and ``fuse`` replace a loop ``j`` of a block by the loops they return (``j_0``,
  ``j_1`` by default);
- ``compute_at``, ``reverse_compute_at``, ``recompute_at`` and the fusions place a block under another
  block's loops (its own loops are then that nest's, e.g. ``i_0, ax0``);
- ``split_k_update``, ``rfactor`` and ``rolling_update`` over tiles *privatize* a reduction ``B``: its
  reduce loops move to the partial ``B_rf``, and ``B`` becomes the combine of the partials (a handle taken
  before the step follows to ``B_rf``, see :mod:`~polyfuse.transforms.schedule`);
- ``compute_inline``, ``reverse_compute_inline`` and a fusion's inlining of the maps between a producer
  and its consumer remove a map block.

Steps are counted from 1, as the printed trace lists them.  A :class:`StepNames` records this for one
step, from the programs before and after it; :func:`stale_block` and :func:`stale_loop` turn the history
into the sentence an error appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.ir.stmt import Program
from polyfuse.transforms.tree import loops_of


@dataclass(frozen=True)
class StepNames:
    """The names one step changed: ``call`` is the step as Python, ``privatized`` maps a block to its new
    partial, ``removed`` lists blocks that no longer exist, ``loops`` maps each surviving block whose loops
    changed to ``(loops before, loops after)``."""

    call: str
    privatized: dict[str, str]
    removed: tuple[str, ...]
    loops: dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def step_names(before: Program, after: Program, call: str) -> StepNames:
    """What the step ``call`` that turned ``before`` into ``after`` did to block and loop names."""
    old = {b.name: tuple(lp.var.name for lp in loops_of(before, b.name)) for b in before.blocks()}
    new = {b.name: tuple(lp.var.name for lp in loops_of(after, b.name)) for b in after.blocks()}
    privatized = {b: f"{b}_rf" for b in old if f"{b}_rf" not in old and f"{b}_rf" in new}
    removed = tuple(b for b in old if b not in new)
    loops = {b: (old[b], new[b]) for b in old if b in new and old[b] != new[b]}
    return StepNames(call, privatized, removed, loops)


def stale_block(history: Sequence[StepNames], block: str) -> str:
    """Why ``block`` is not in the program, if a step of ``history`` removed it ("" otherwise)."""
    for k in range(len(history) - 1, -1, -1):
        if block in history[k].removed:
            return (f"; step {k + 1} ({history[k].call}) removed it (a map inlined into its readers, or blocks "
                    "merged): take the handle from a block that exists")
    return ""


def stale_loop(history: Sequence[StepNames], block: str, loop: str, since: int = 0,
               exists=lambda block, loop: False) -> str:
    """Why block ``block`` has no loop ``loop`` now, from the latest step of ``history`` (at or after step
    ``since``) under which it lost that loop: the new handle to use where one exists (``exists(block, loop)``
    says whether the current program has it), else the block's loops after that step."""
    for k in range(len(history) - 1, since - 1, -1):
        names = history[k]
        partial = names.privatized.get(block)
        if partial is not None and exists(partial, loop):
            return (f"; step {k + 1} ({names.call}) privatized block {block!r}: its reduction runs in the partial "
                    f"{partial!r}, and {block!r} is the combine of the partials; the loop is "
                    f'sch.loop("{partial}", "{loop}")')
        change = names.loops.get(block)
        if change is not None and loop in change[0] and loop not in change[1]:
            added = [n for n in change[1] if n not in change[0]]
            return (f"; step {k + 1} ({names.call}) replaced it: block {block!r} is inside loops "
                    f"{', '.join(change[1]) or 'none'} since" + (f" (new: {', '.join(added)})" if added else ""))
        if block in names.removed:
            return stale_block(history[: k + 1], block)
    return ""
