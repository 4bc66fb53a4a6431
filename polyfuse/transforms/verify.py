"""The check every schedule primitive ends with: the new program means the same.

A primitive rewrites loops (or data placement) but keeps block instances; the
dependences of the program before the step, pushed through the schedule after
it, must all stay satisfied.  The dependence analysis also rejects a program in
which some instance would run twice or never.
"""

from __future__ import annotations

from collections.abc import Collection

from polyfuse import deps
from polyfuse.ir.stmt import Program
from polyfuse.ir.validate import validate


def verify(before: Program, after: Program, *, what: str, moved: Collection[str] | None = None) -> Program:
    """Return ``after`` if it is well formed and keeps every dependence of ``before``.

    ``moved`` names the blocks whose instances changed position; every other pair of
    instances keeps its relative order, so only dependences on the tensors those
    blocks touch need checking (a much smaller analysis).
    """
    validate(after)
    tensors = None if moved is None else deps.tensors_of(*(before.block(b) for b in moved))
    deps.require_legal(deps.analyze(before, tensors=tensors), after, what=what)
    return after
