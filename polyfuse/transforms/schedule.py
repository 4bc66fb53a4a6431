"""The Schedule facade: handles to blocks and loops by name, and a replayable trace.

``Schedule(program)`` holds the current program; every primitive call rewrites
it through a function ``Program -> Program`` (one module per primitive, each
checked by the dependence analysis) and is recorded as a :class:`Step`.  The
trace prints as Python (``sch.split(sch.loop("s_sum", "i"), factors=[None, 4])``),
serialises to JSON, and replays on the original program to the same result.

Loops are named: a :class:`LoopRef` is "the loop called ``name`` that encloses
block ``block``", so handles stay meaningful across steps and in a printed trace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

from polyfuse.errors import IllegalTransform
from polyfuse.ir.stmt import PARALLEL, UNROLLED, VECTORIZED, Program
from polyfuse.transforms.annotate import annotate as _annotate
from polyfuse.transforms.annotate import bind as _bind
from polyfuse.transforms.fuse import fuse as _fuse
from polyfuse.transforms.reorder import reorder as _reorder
from polyfuse.transforms.split import split as _split
from polyfuse.transforms.tile import tile as _tile
from polyfuse.transforms.tree import loops_of


@dataclass(frozen=True)
class LoopRef:
    """The loop named ``name`` enclosing block ``block``."""

    block: str
    name: str

    def __repr__(self) -> str:
        return f'sch.loop("{self.block}", "{self.name}")'


@dataclass(frozen=True)
class Step:
    """One recorded primitive call: the facade method and its arguments."""

    primitive: str
    args: tuple[tuple[str, Any], ...]

    def python(self) -> str:
        return f"sch.{self.primitive}({', '.join(f'{k}={_py(v)}' for k, v in self.args)})"

    def to_json(self) -> dict:
        return {"primitive": self.primitive, "args": {k: _to_json(v) for k, v in self.args}}

    @staticmethod
    def from_json(data: dict) -> Step:
        return Step(data["primitive"], tuple((k, _from_json(v)) for k, v in data["args"].items()))


def _py(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    return repr(v)


def _to_json(v: Any) -> Any:
    if isinstance(v, LoopRef):
        return {"loop": [v.block, v.name]}
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    return v


def _from_json(v: Any) -> Any:
    if isinstance(v, dict) and set(v) == {"loop"}:
        return LoopRef(*v["loop"])
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


class Trace:
    """The recorded steps; prints as Python, converts to and from JSON."""

    def __init__(self, steps: Sequence[Step] = ()):
        self.steps = list(steps)

    def python(self) -> str:
        return "\n".join(s.python() for s in self.steps)

    def to_json(self) -> str:
        return json.dumps([s.to_json() for s in self.steps], indent=1)

    @staticmethod
    def from_json(text: str) -> Trace:
        return Trace([Step.from_json(d) for d in json.loads(text)])

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        return self.python()


class Schedule:
    """A program being scheduled, with the trace of what was done to it."""

    def __init__(self, program: Program):
        self._original = program
        self._program = program
        self._trace = Trace()

    # ------------------------------------------------------------ state
    @property
    def program(self) -> Program:
        return self._program

    @property
    def original(self) -> Program:
        return self._original

    @property
    def trace(self) -> Trace:
        return self._trace

    def __str__(self) -> str:
        return str(self._program)

    # ------------------------------------------------------------ handles
    def get_block(self, name: str) -> str:
        """``name`` if the program has such a block (IllegalTransform listing the blocks otherwise)."""
        if name not in {b.name for b in self._program.blocks()}:
            known = ", ".join(b.name for b in self._program.blocks())
            raise IllegalTransform(f"program {self._program.name!r} has no block {name!r}; blocks: {known}")
        return name

    def get_loops(self, block: str) -> list[LoopRef]:
        """The loops enclosing ``block``, outermost first."""
        return [LoopRef(block, lp.var.name) for lp in loops_of(self._program, self.get_block(block))]

    def loop(self, block: str, name: str) -> LoopRef:
        """The loop called ``name`` enclosing ``block``."""
        for ref in self.get_loops(block):
            if ref.name == name:
                return ref
        names = ", ".join(r.name for r in self.get_loops(block)) or "none"
        raise IllegalTransform(f"block {block!r} is not inside a loop named {name!r}; its loops: {names}")

    # ------------------------------------------------------------ replay
    def replay(self, trace: Trace | str) -> Schedule:
        """Apply a trace (or its JSON) to this schedule; returns self."""
        steps = Trace.from_json(trace).steps if isinstance(trace, str) else trace.steps
        for step in steps:
            method = getattr(self, step.primitive, None)
            if method is None or step.primitive.startswith("_") or step.primitive not in _PRIMITIVES:
                raise IllegalTransform(f"a trace step names an unknown primitive {step.primitive!r}")
            method(**dict(step.args))
        return self

    def exec_python(self, text: str) -> Schedule:
        """Run a printed trace (``sch.…`` lines) on this schedule; returns self."""
        exec(compile(text, "<polyfuse trace>", "exec"), {"sch": self})
        return self

    def _apply(self, primitive: str, args: dict[str, Any], fn: Callable[[Program], Any]) -> Any:
        out = fn(self._program)
        program, result = out if isinstance(out, tuple) else (out, None)
        self._program = program
        self._trace.steps.append(Step(primitive, tuple(args.items())))
        return result

    # ------------------------------------------------------------ loop primitives
    def split(self, loop: LoopRef, factors: Sequence[int | None], names: Sequence[str] | None = None) -> list[LoopRef]:
        """Split ``loop`` by ``factors`` (one may be None); returns the new loops, outermost first."""
        args: dict[str, Any] = {"loop": loop, "factors": list(factors)}
        if names is not None:
            args["names"] = list(names)

        def run(p: Program) -> tuple[Program, list[str]]:
            before = {lp.var.name for lp in loops_of(p, loop.block)}
            new = _split(p, block=loop.block, loop=loop.name, factors=factors, names=names)
            return new, [lp.var.name for lp in loops_of(new, loop.block) if lp.var.name not in before]

        return [LoopRef(loop.block, n) for n in self._apply("split", args, run)]

    def reorder(self, loops: Sequence[LoopRef]) -> None:
        """Permute loops of a perfect nest into the given order."""
        block = _one_block(loops)
        self._apply("reorder", {"loops": list(loops)},
                    lambda p: _reorder(p, block=block, loops=[r.name for r in loops]))

    def fuse(self, loops: Sequence[LoopRef], name: str | None = None) -> LoopRef:
        """Fuse consecutive perfectly nested loops into one; returns it."""
        block = _one_block(loops)
        args: dict[str, Any] = {"loops": list(loops)}
        if name is not None:
            args["name"] = name

        def run(p: Program) -> tuple[Program, str]:
            new = _fuse(p, block=block, loops=[r.name for r in loops], name=name)
            fused = [lp.var.name for lp in loops_of(new, block) if lp.var.name not in {r.name for r in loops}
                     and lp.var.name not in {x.var.name for x in loops_of(p, block)}]
            return new, fused[0]

        return LoopRef(block, self._apply("fuse", args, run))

    def tile(self, loops: Sequence[LoopRef], sizes: Sequence[int]) -> list[LoopRef]:
        """Tile loops by ``sizes``: returns the tile loops then the intra-tile loops."""
        block = _one_block(loops)
        names = self._apply("tile", {"loops": list(loops), "sizes": list(sizes)},
                            lambda p: _tile(p, block=block, loops=[r.name for r in loops], sizes=sizes))
        return [LoopRef(block, n) for n in names]

    def annotate(self, loop: LoopRef, kind: str) -> None:
        """Mark a loop ``unrolled``, ``vectorized`` or ``parallel``."""
        self._apply("annotate", {"loop": loop, "kind": kind},
                    lambda p: _annotate(p, block=loop.block, loop=loop.name, kind=kind))

    def unroll(self, loop: LoopRef) -> None:
        self.annotate(loop, UNROLLED)

    def vectorize(self, loop: LoopRef) -> None:
        self.annotate(loop, VECTORIZED)

    def parallel(self, loop: LoopRef) -> None:
        self.annotate(loop, PARALLEL)

    def bind(self, loop: LoopRef, thread: str) -> None:
        """Bind a loop to a GPU index (``blockIdx.x`` … ``threadIdx.z``)."""
        self._apply("bind", {"loop": loop, "thread": thread},
                    lambda p: _bind(p, block=loop.block, loop=loop.name, thread=thread))

    # ------------------------------------------------------------ placement primitives
    # (compute_at, reverse_compute_at, compute_inline, reverse_compute_inline, cache_read, cache_write, set_scope)

    # ------------------------------------------------------------ reduction primitives
    # (decompose_reduction, rfactor / privatize)

    # ------------------------------------------------------------ reduction fusion
    # (rolling_update, split_k_update)


def _one_block(loops: Sequence[LoopRef]) -> str:
    if not loops:
        raise IllegalTransform("name at least one loop")
    return loops[0].block


# Facade methods that a trace may call (convenience aliases record as "annotate").
_PRIMITIVES = {"split", "reorder", "fuse", "tile", "annotate", "bind"}


def register_primitive(name: str) -> None:
    """Allow trace replay of a facade method added by another module."""
    _PRIMITIVES.add(name)
