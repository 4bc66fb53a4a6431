"""One dependence between two references of two blocks, and how it prints.

A :class:`Dependence` relates block *instances* (untagged) through one pair of
references (the tags say which).  Two flags carry Neptune's distinction:

- ``temporal``: a flow dependence from a reduction's *final* update to a read in
  another block, i.e. the reader needs the reduction's last value (Neptune's tag
  ⟨last⟩).  Naive fusion may break exactly these; the repair fixes them.
- ``self_reduction``: the chain of updates of one reduction on its own
  accumulator (``s_max[i, j] -> s_max[i, j + 1]``).  Naive fusion keeps these.

A dependence returned by :func:`polyfuse.deps.violated` is the same dependence
restricted to the violating pairs, with ``witness`` set to their lexicographic
minimum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

FLOW = "flow"
ANTI = "anti"
OUTPUT = "output"
KINDS = (FLOW, ANTI, OUTPUT)


@dataclass(frozen=True)
class Dependence:
    """``source`` instances must run before ``sink`` instances: ``relation`` maps one to the other.

    ``kind`` is ``flow`` (write then read), ``anti`` (read then write) or
    ``output`` (write then write); ``source_ref``/``sink_ref`` are the reference
    tags (see :mod:`polyfuse.deps.access`).  ``witness``, set only on violations,
    is the lexicographically smallest violating pair (parametric when sizes are).
    """

    kind: str
    source: str
    sink: str
    tensor: str
    source_ref: str
    sink_ref: str
    relation: isl.Map = field(hash=False)
    temporal: bool = False
    self_reduction: bool = False
    witness: isl.Map | None = field(default=None, hash=False, compare=False)

    @property
    def is_violation(self) -> bool:
        return self.witness is not None

    @property
    def label(self) -> str:
        """``flow s_max -> s_exp on xmax (temporal)``: kind, blocks, tensor and flags."""
        flags = [f for f, on in (("temporal", self.temporal), ("reduction", self.self_reduction)) if on]
        suffix = f" ({', '.join(flags)})" if flags else ""
        return f"{self.kind} {self.source} -> {self.sink} on {self.tensor}{suffix}"

    def example(self) -> str:
        """One concrete violating (or dependent) pair, with size values when sizes are symbolic."""
        rel = self.witness if self.witness is not None else self.relation
        return str(rel.wrap().sample_point())

    def __str__(self) -> str:
        text = f"{self.label}: {self.relation}"
        if self.witness is not None:
            text += f"\n    witness (first violating pair): {self.witness}"
            if self.relation.dim(isl.dim_type.param):
                text += f"\n    for example: {self.example()}"
        return text


__all__ = ["ANTI", "FLOW", "KINDS", "OUTPUT", "Dependence"]
