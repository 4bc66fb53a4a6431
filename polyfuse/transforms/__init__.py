"""Schedule primitives (``Program -> Program``, one module each) and the Schedule facade."""

from polyfuse.transforms.schedule import LoopRef, Schedule, Step, Trace

__all__ = ["LoopRef", "Schedule", "Step", "Trace"]
