"""The check every schedule primitive ends with: the new program means the same.

A primitive rewrites loops (or data placement) but keeps block instances; the
dependences of the program before the step, pushed through the schedule after
it, must all stay satisfied.  The dependence analysis also rejects a program in
which some instance would run twice or never.
"""

from __future__ import annotations

from polyfuse import deps
from polyfuse.ir.stmt import Program
from polyfuse.ir.validate import validate


def verify(before: Program, after: Program, *, what: str) -> Program:
    """Return ``after`` if it is well formed and keeps every dependence of ``before``."""
    validate(after)
    deps.require_legal(deps.analyze(before), after, what=what)
    return after
