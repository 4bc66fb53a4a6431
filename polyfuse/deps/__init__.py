"""Polyhedral dependence analysis: Program -> ISL domains, tagged accesses, schedule, dependences.

``analyze(program)`` returns :class:`Dependences` (``.flow``, ``.anti``,
``.output``, ``.temporal``, ``.between(src, dst)``); ``violated(deps, new)``
says which of them a transformed program (same blocks, new loops) breaks, and
``check_naive_fusion`` refuses a fusion that breaks anything but temporal
dependences; ``require_in_bounds`` proves every access inside its tensor for
all sizes (or raises ``OutOfBounds`` with a witness).  Modules:
:mod:`~polyfuse.deps.islconv` (IR expressions to ISL), :mod:`~polyfuse.deps.domains`,
:mod:`~polyfuse.deps.access`, :mod:`~polyfuse.deps.schedule`, :mod:`~polyfuse.deps.direct`,
:mod:`~polyfuse.deps.analysis`, :mod:`~polyfuse.deps.legality`, :mod:`~polyfuse.deps.describe`,
:mod:`~polyfuse.deps.bounds`; :mod:`~polyfuse.deps.memo` holds the caches (``clear_caches()``
empties them).
"""

from polyfuse.deps.access import Access
from polyfuse.deps.analysis import Dependences, analyze, tensors_of
from polyfuse.deps.bounds import BoundsViolation, out_of_bounds, require_in_bounds
from polyfuse.deps.dependence import ANTI, FLOW, OUTPUT, Dependence
from polyfuse.deps.describe import describe
from polyfuse.deps.domains import domains, iteration_domain
from polyfuse.deps.legality import check_naive_fusion, require_legal, violated, violation
from polyfuse.deps.memo import clear_caches
from polyfuse.deps.schedule import instance_schedule

__all__ = [
    "ANTI", "FLOW", "OUTPUT", "Access", "BoundsViolation", "Dependence", "Dependences", "analyze",
    "check_naive_fusion", "clear_caches", "describe", "domains", "instance_schedule", "iteration_domain",
    "out_of_bounds", "require_in_bounds", "require_legal", "tensors_of", "violated", "violation",
]
