"""The Schedule facade: handles to blocks and loops by name, and a replayable trace.

``Schedule(program)`` holds the current program; every primitive call rewrites
it through a function ``Program -> Program`` (one module per primitive, each
checked by the dependence analysis) and is recorded as a :class:`Step`.  The
trace prints as Python (``sch.split(sch.loop("s_sum", "i"), factors=[None, 4])``),
serialises to JSON, and replays on the original program to the same result.

Loops are named: a :class:`LoopRef` is "the loop called ``name`` that encloses
block ``block``", so handles stay meaningful across steps and in a printed trace.
A handle follows its block when a later step privatizes it (``split_k_update``, ``rfactor``,
a ``rolling_update`` over tiles): the reduction then runs in its partial ``B_rf`` while ``B``
becomes the combine of the partials, so a handle ``(B, n)`` taken before that step means
``(B_rf, n)`` after it (where ``B_rf`` has a loop ``n``), and the trace records it so.  A handle
that no step can carry over — a loop that ``split`` or ``tile`` replaced, a block a fusion inlined,
``sch.loop("B", n)`` written after ``B`` became a combine — raises :class:`IllegalTransform` saying which
step changed it and the name to use now (:mod:`~polyfuse.transforms.handles` lists how each step renames).
"""

from __future__ import annotations

import json
import functools
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polyfuse.errors import IllegalTransform
from polyfuse.ir.stmt import PARALLEL, UNROLLED, VECTORIZED, Program
from polyfuse.transforms.annotate import annotate as _annotate
from polyfuse.transforms.annotate import bind as _bind
from polyfuse.transforms.annotate import set_warps as _set_warps
from polyfuse.transforms.compact import outside_allocation
from polyfuse.transforms.fuse import fuse as _fuse
from polyfuse.transforms.handles import StepNames, stale_block, stale_loop, step_names
from polyfuse.transforms.reorder import reorder as _reorder
from polyfuse.transforms.split import split as _split
from polyfuse.transforms.tile import tile as _tile
from polyfuse.transforms.tree import loops_of


@dataclass(frozen=True)
class LoopRef:
    """The loop named ``name`` enclosing block ``block``; ``taken`` is the number of schedule steps when the
    facade handed it out (None for a handle written by hand: it means the current program)."""

    block: str
    name: str
    taken: int | None = field(default=None, compare=False)

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


def _follows_handles(method: Callable) -> Callable:
    """A primitive that takes its loop handles as of now (:meth:`Schedule._current`)."""
    @functools.wraps(method)
    def primitive(self: Schedule, *args: Any, **kwargs: Any) -> Any:
        return method(self, *(self._current(a) for a in args), **{k: self._current(v) for k, v in kwargs.items()})

    return primitive


class Schedule:
    """A program being scheduled, with the trace of what was done to it."""

    def __init__(self, program: Program):
        self._original = program
        self._program = program
        self._trace = Trace()
        self._fusions: list = []
        self._names: list[StepNames] = []  # per step: the block and loop names it changed

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
            raise IllegalTransform(f"program {self._program.name!r} has no block {name!r}; blocks: {known}"
                                   f"{stale_block(self._names, name)}")
        return name

    def get_loops(self, block: str) -> list[LoopRef]:
        """The loops enclosing ``block``, outermost first."""
        return [LoopRef(block, lp.var.name, len(self._trace)) for lp in loops_of(self._program, self.get_block(block))]

    def loop(self, block: str, name: str) -> LoopRef:
        """The loop called ``name`` enclosing ``block``."""
        for ref in self.get_loops(block):
            if ref.name == name:
                return ref
        names = ", ".join(r.name for r in self.get_loops(block)) or "none"
        raise IllegalTransform(f"block {block!r} is not inside a loop named {name!r}; its loops: {names}"
                               f"{stale_loop(self._names, block, name, exists=self._has_loop)}")

    # ------------------------------------------------------------ replay
    def replay(self, trace: Trace | str) -> Schedule:
        """Apply a trace (or its JSON) to this schedule; returns self."""
        steps = Trace.from_json(trace).steps if isinstance(trace, str) else trace.steps
        for step in steps:
            method = getattr(self, step.primitive, None)
            if not _is_primitive(step.primitive):
                raise IllegalTransform(f"a trace step names an unknown primitive {step.primitive!r}")
            method(**dict(step.args))
        return self

    def exec_python(self, text: str) -> Schedule:
        """Run a printed trace (``sch.…`` lines) on this schedule; returns self."""
        exec(compile(text, "<polyfuse trace>", "exec"), {"sch": self})
        return self

    def _apply(self, primitive: str, args: dict[str, Any], fn: Callable[[Program], Any]) -> Any:
        for key in ("loop", "loops"):
            for ref in ([args[key]] if key == "loop" else args[key]) if key in args else ():
                if not isinstance(ref, LoopRef):
                    raise IllegalTransform(f"sch.{primitive}: {key} must be given as loop handles "
                                           f"(sch.loop(block, name)), got {ref!r}")
        out = fn(self._program)
        program, result = out if isinstance(out, tuple) else (out, None)
        stray = outside_allocation(program)
        if stray:
            raise IllegalTransform(f"sch.{primitive}: after it, {stray} outside the loop where compact_buffers "
                                   "allocated it (the tensor exists only per iteration of that loop); apply "
                                   f"{primitive} before compact_buffers")
        step = Step(primitive, tuple(args.items()))
        self._names.append(step_names(self._program, program, step.python()))
        self._program = program
        self._trace.steps.append(step)
        return result

    def _current(self, ref: Any) -> Any:
        """A handle (or a list of them) as of now: one taken before a step that privatized its block follows the
        block's partial (see the module docstring); anything else as it is."""
        if isinstance(ref, (list, tuple)):
            return [self._current(r) for r in ref]
        if not isinstance(ref, LoopRef) or ref.taken is None:
            return ref
        block = ref.block
        for names in self._names[ref.taken:]:
            partial = names.privatized.get(block)
            if partial is not None and self._has_loop(partial, ref.name):
                block = partial
        if not self._has_loop(block, ref.name):
            why = stale_loop(self._names, block, ref.name, since=ref.taken, exists=self._has_loop) or (
                stale_block(self._names, block))
            raise IllegalTransform(f"the handle sch.loop({ref.block!r}, {ref.name!r}), taken after {ref.taken} "
                                   f"step(s), no longer names a loop{why or ': its block has no such loop now'}")
        return LoopRef(block, ref.name, len(self._trace))

    def _has_loop(self, block: str, name: str) -> bool:
        """True if the current program has a block ``block`` inside a loop named ``name``."""
        if block not in {b.name for b in self._program.blocks()}:
            return False
        return any(lp.var.name == name for lp in loops_of(self._program, block))

    # ------------------------------------------------------------ loop primitives
    @_follows_handles
    def split(self, loop: LoopRef, factors: Sequence[int | None], names: Sequence[str] | None = None) -> list[LoopRef]:
        """Split ``loop`` by ``factors`` (one may be None); returns the new loops, outermost first."""
        args: dict[str, Any] = {"loop": loop, "factors": _listed("split", "factors", factors)}
        if names is not None:
            args["names"] = _listed("split", "names", names)

        def run(p: Program) -> tuple[Program, list[str]]:
            at = [lp.var.name for lp in loops_of(p, loop.block)].index(loop.name)
            new = _split(p, block=loop.block, loop=loop.name, factors=factors, names=names)
            return new, [lp.var.name for lp in loops_of(new, loop.block)[at:at + len(factors)]]

        return [LoopRef(loop.block, n, len(self._trace)) for n in self._apply("split", args, run)]

    @_follows_handles
    def reorder(self, loops: Sequence[LoopRef]) -> None:
        """Permute loops of a perfect nest into the given order."""
        block = _one_block("reorder", loops)
        self._apply("reorder", {"loops": list(loops)},
                    lambda p: _reorder(p, block=block, loops=[r.name for r in loops]))

    @_follows_handles
    def fuse(self, loops: Sequence[LoopRef], name: str | None = None) -> LoopRef:
        """Fuse consecutive perfectly nested loops into one; returns it."""
        block = _one_block("fuse", loops)
        args: dict[str, Any] = {"loops": list(loops)}
        if name is not None:
            args["name"] = name

        def run(p: Program) -> tuple[Program, str]:
            at = [lp.var.name for lp in loops_of(p, block)].index(loops[0].name)
            new = _fuse(p, block=block, loops=[r.name for r in loops], name=name)
            return new, loops_of(new, block)[at].var.name

        return LoopRef(block, self._apply("fuse", args, run), len(self._trace))

    @_follows_handles
    def tile(self, loops: Sequence[LoopRef], sizes: Sequence[int]) -> list[LoopRef]:
        """Tile loops by ``sizes``: returns the tile loops then the intra-tile loops."""
        block = _one_block("tile", loops)
        names = self._apply("tile", {"loops": list(loops), "sizes": _listed("tile", "sizes", sizes)},
                            lambda p: _tile(p, block=block, loops=[r.name for r in loops], sizes=sizes))
        return [LoopRef(block, n, len(self._trace)) for n in names]

    @_follows_handles
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

    @_follows_handles
    def warps(self, loop: LoopRef, warps: int) -> None:
        """Run the GPU kernel whose grid holds ``loop`` with ``warps`` warps per thread block (a launch hint;
        without it the device's default, :class:`~polyfuse.device.DeviceSpec`)."""
        self._apply("warps", {"loop": loop, "warps": warps},
                    lambda p: _set_warps(p, block=loop.block, loop=loop.name, warps=warps))

    @_follows_handles
    def bind(self, loop: LoopRef, thread: str) -> None:
        """Bind a loop to a GPU index (``blockIdx.x`` … ``threadIdx.z``)."""
        self._apply("bind", {"loop": loop, "thread": thread},
                    lambda p: _bind(p, block=loop.block, loop=loop.name, thread=thread))

    # ------------------------------------------------------------ placement primitives
    # (compute_at, recompute_at, reverse_compute_at, compute_inline, reverse_compute_inline, cache_read,
    #  cache_write, set_scope, fuse_siblings)
    @_follows_handles
    def compute_at(self, block: str, loop: LoopRef) -> None:
        """Move producer ``block`` under ``loop``, cut to the region one iteration reads (before its first reader)."""
        from polyfuse.transforms.compute_at import compute_at

        self._apply("compute_at", {"block": block, "loop": loop},
                    lambda p: compute_at(p, block=block, loop_block=loop.block, loop=loop.name))

    @_follows_handles
    def recompute_at(self, block: str, loop: LoopRef) -> None:
        """Like ``compute_at``, with one copy of producer ``block`` per iteration that needs its region
        (see :mod:`polyfuse.transforms.recompute`)."""
        from polyfuse.transforms.recompute import recompute_at

        self._apply("recompute_at", {"block": block, "loop": loop},
                    lambda p: recompute_at(p, block=block, loop_block=loop.block, loop=loop.name))

    @_follows_handles
    def reverse_compute_at(self, block: str, loop: LoopRef) -> None:
        """Move consumer ``block`` under ``loop``, cut to what one iteration produces (after its last producer)."""
        from polyfuse.transforms.compute_at import reverse_compute_at

        self._apply("reverse_compute_at", {"block": block, "loop": loop},
                    lambda p: reverse_compute_at(p, block=block, loop_block=loop.block, loop=loop.name))

    def compute_inline(self, block: str) -> None:
        """Substitute spatial ``block`` into the blocks that read its result, and remove it."""
        from polyfuse.transforms.inline import compute_inline

        self._apply("compute_inline", {"block": block}, lambda p: compute_inline(p, block=block))

    def reverse_compute_inline(self, block: str) -> None:
        """Merge spatial consumer ``block`` into the store of its (spatial) producer."""
        from polyfuse.transforms.inline import reverse_compute_inline

        self._apply("reverse_compute_inline", {"block": block}, lambda p: reverse_compute_inline(p, block=block))

    def hoist_divisor(self, block: str) -> None:
        """Divide sum ``block``'s terms by their common invariant divisor once, in the readers of its result."""
        from polyfuse.transforms.hoist_divisor import hoist_divisor

        self._apply("hoist_divisor", {"block": block}, lambda p: hoist_divisor(p, block=block))

    def cache_read(self, block: str, tensor: str | int, scope: str) -> str:
        """Stage ``tensor`` (a name, or its index among what ``block`` reads) in ``scope``; returns the copy block."""
        from polyfuse.transforms.cache import cache_read

        return self._apply("cache_read", {"block": block, "tensor": tensor, "scope": scope},
                           lambda p: cache_read(p, block=block, tensor=tensor, scope=scope))

    def cache_write(self, block: str, scope: str) -> str:
        """Make ``block`` write a ``scope`` buffer copied back afterwards; returns the copy-back block."""
        from polyfuse.transforms.cache import cache_write

        return self._apply("cache_write", {"block": block, "scope": scope},
                           lambda p: cache_write(p, block=block, scope=scope))

    def set_scope(self, block: str, scope: str) -> None:
        """Put the temp tensor ``block`` writes in memory ``scope`` (``global``, ``shared``, ``local``)."""
        from polyfuse.transforms.cache import set_scope

        self._apply("set_scope", {"block": block, "scope": scope}, lambda p: set_scope(p, block=block, scope=scope))

    @_follows_handles
    def fuse_siblings(self, block: str, loop: LoopRef) -> str:
        """Run ``block`` under ``loop`` bound as the loop's block, which has the same iteration space and no
        dependence on it (horizontal fusion: two statistics in one pass); see
        :mod:`polyfuse.transforms.fuse_siblings`.  Returns ``block``: its name and the names of the loops
        around the loop's block stay valid, and ``block``'s loops are now those (``sch.loop(block, name)``)."""
        from polyfuse.transforms.fuse_siblings import fuse_siblings

        def run(p: Program) -> tuple[Program, str]:
            return fuse_siblings(p, block=self.get_block(block), loop_block=loop.block, loop=loop.name), block

        return self._apply("fuse_siblings", {"block": block, "loop": loop}, run)

    # ------------------------------------------------------------ reduction primitives
    # (decompose_reduction, rfactor / privatize)
    @_follows_handles
    def decompose_reduction(self, block: str, loop: LoopRef) -> str:
        """Move ``block``'s init into a new block right before ``loop``; returns the init block's name."""
        from polyfuse.transforms.decompose import decompose_reduction

        self._require_encloses(loop, block, "decompose_reduction")
        return self._apply("decompose_reduction", {"block": block, "loop": loop},
                           lambda p: decompose_reduction(p, block=block, loop=loop.name))

    @_follows_handles
    def rfactor(self, loop: LoopRef, block: str | None = None, factor_axis: int | None = None) -> str:
        """Privatize a reduction over ``loop`` (Neptune's privatize); returns the new rf block's name.

        ``block`` defaults to the LoopRef's block; ``factor_axis`` places the new dimension (last by default).
        """
        from polyfuse.transforms.rfactor import rfactor

        target = loop.block if block is None else block
        self._require_encloses(loop, target, "rfactor")
        args: dict[str, Any] = {"loop": loop}
        if block is not None:
            args["block"] = block
        if factor_axis is not None:
            args["factor_axis"] = factor_axis
        return self._apply("rfactor", args,
                           lambda p: rfactor(p, block=target, loop=loop.name, factor_axis=factor_axis))

    def _require_encloses(self, loop: LoopRef, block: str, primitive: str) -> None:
        """``loop`` (a handle through any block) must be a loop around ``block``."""
        from polyfuse.transforms.tree import find_loop

        if loop.block != block and find_loop(self._program, loop.block, loop.name) is not find_loop(
                self._program, self.get_block(block), loop.name):
            raise IllegalTransform(f"{primitive}: {loop!r} does not enclose block {block!r}")

    # ------------------------------------------------------------ reduction fusion
    @_follows_handles
    def rolling_update(self, block: str, loop: LoopRef, approximate: bool = False,
                       signs: Mapping[str, str] | None = None) -> str:
        """Fuse reduction ``block`` under ``loop`` with a derived repair (FlashAttention-like); see
        :mod:`polyfuse.transforms.rolling_update`.  Returns the block that now holds the repaired update.

        ``signs`` promises the sign of values the repair reads that the compiler cannot prove
        (``{"r": "positive"}``; not checked at run time, see :mod:`polyfuse.transforms.signs`)."""
        from polyfuse.transforms.rolling_update import rolling_update

        args: dict[str, Any] = {"block": block, "loop": loop}
        if approximate:
            args["approximate"] = True
        if signs:
            args["signs"] = dict(signs)

        def run(p: Program) -> tuple[Program, str]:
            new, fusion = rolling_update(p, block=self.get_block(block), loop_block=loop.block, loop=loop.name,
                                         approximate=approximate, signs=signs)
            self._fusions.append(fusion)
            return new, block

        return self._apply("rolling_update", args, run)

    @_follows_handles
    def split_k_update(self, block: str, loop: LoopRef, approximate: bool = False,
                       factor_axis: int | None = None, signs: Mapping[str, str] | None = None) -> str:
        """Fuse reduction ``block`` with its producers as partials over the split loop ``loop`` and a repaired
        combine (FlashDecoding-like); see :mod:`polyfuse.transforms.split_k_update`.  Returns the local block.

        ``factor_axis`` places the split dimension in ``block``'s partial results (last by default); ``signs``
        as in :meth:`rolling_update`."""
        from polyfuse.transforms.split_k_update import split_k_update

        args: dict[str, Any] = {"block": block, "loop": loop}
        if approximate:
            args["approximate"] = True
        if factor_axis is not None:
            args["factor_axis"] = factor_axis
        if signs:
            args["signs"] = dict(signs)

        def run(p: Program) -> tuple[Program, str]:
            new, fusion = split_k_update(p, block=self.get_block(block), loop_block=loop.block, loop=loop.name,
                                         approximate=approximate, factor_axis=factor_axis, signs=signs)
            self._fusions.append(fusion)
            return new, fusion.created[0] if fusion.created else block

        return self._apply("split_k_update", args, run)

    def compact_buffers(self) -> None:
        """Shrink each temporary to the region one iteration of its allocation loop uses (run it last:
        see :mod:`polyfuse.transforms.compact`)."""
        from polyfuse.transforms.compact import compact_buffers

        self._apply("compact_buffers", {}, compact_buffers)

    @property
    def fusions(self) -> list:
        """The reduction fusions applied so far (:class:`~polyfuse.transforms.fusion_common.Fusion` records)."""
        return list(self._fusions)

    def fusion(self, block: str):
        """The reduction fusion whose consumer is ``block`` (the latest, if it was fused more than once), as a
        :class:`~polyfuse.transforms.fusion_common.Fusion` record: its repair, the dependences it broke, the
        blocks it inlined or created.  Found by name, because the order of :attr:`fusions` depends on the
        recipe (attention's first fusion is the row max, which needs no repair).  IllegalTransform names the
        blocks that were fused where ``block`` was not."""
        found = [f for f in self._fusions if f.consumer == block]
        if found:
            return found[-1]
        fused = ", ".join(dict.fromkeys(f.consumer for f in self._fusions)) or "none yet"
        raise IllegalTransform(f"sch.fusion: block {block!r} was not fused by rolling_update or split_k_update in "
                               f"this schedule; fused blocks: {fused}")


def _one_block(primitive: str, loops: Sequence[LoopRef]) -> str:
    """The block of the first of ``loops``: a non-empty sequence of loop handles."""
    refs = _listed(primitive, "loops", loops)
    if not refs or not all(isinstance(r, LoopRef) for r in refs):
        raise IllegalTransform(f"sch.{primitive}: name at least one loop, as loop handles (sch.loop(block, name)); "
                               f"got {loops!r}")
    return refs[0].block


def _listed(primitive: str, what: str, values: Any) -> list:
    """``values`` as a list, if it is a list or tuple (a string or a number is a mistake, not a sequence)."""
    if not isinstance(values, (list, tuple)):
        raise IllegalTransform(f"sch.{primitive}: {what} must be a list, got {values!r}")
    return list(values)


# Public methods of Schedule that are not schedule primitives (everything else records a step).
_NOT_PRIMITIVES = frozenset({"get_block", "get_loops", "loop", "replay", "exec_python", "program", "original", "trace",
                             "fusions", "fusion"})


def _is_primitive(name: str) -> bool:
    return not name.startswith("_") and name not in _NOT_PRIMITIVES and callable(getattr(Schedule, name, None))
