"""Random schedules of a :class:`~fuzz_cascades.Cascade`: the fusion recipes and the ordinary primitives.

Each step is a line of Python applied at once (:func:`polyfuse.differential.apply_step`), so the next
step is drawn knowing the loops and blocks the last one left; the lines replay a case exactly.

Fusion recipes (those of ``polyfuse.ops.schedules``), over the reduce loop ``j`` of the first reduction:

- ``roll``: ``rolling_update`` of each consumer under ``j``;
- ``roll_tiles``: the same over the tile loop after ``split(j, [None, T])`` or ``tile([i, j], …)``;
- ``split_k``: ``split_k_update`` of each consumer over ``j_0`` after ``split(j, [S, None])`` (splits
  that need not divide M);
- ``split_k_roll``: ``split(j, [None, steps, T])``, split-k over ``j_0``, then each consumer's partial
  rolls over ``j_1`` (``_attention_decode_gpu``);
- ``none``: ordinary primitives only.

Ordinary primitives (split, reorder, fuse, tile, compute_at, reverse_compute_at, recompute_at, fuse_siblings,
compute_inline, reverse_compute_inline, cache_read, cache_write, set_scope, compact_buffers,
decompose_reduction, rfactor, annotate, bind) come before and after the fusion, on random blocks and loops:
most are refused, which must be a PolyfuseError.  (A ``parallel`` annotation of a reduction loop that is
accepted shows in the C++ kernel, which runs such loops with OpenMP; a loop that ``bind`` accepts runs backwards
in the differential check too, as a GPU may run its iterations in any order.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuzz_cascades import Cascade, Draw
from polyfuse.differential import CRASH, Finding, apply_step
from polyfuse.transforms import Schedule

RECIPES = ("roll", "roll", "roll_tiles", "split_k", "split_k_roll", "none")
ORDINARY = ("split", "reorder", "fuse", "tile", "compute_at", "reverse_compute_at", "compute_inline",
            "cache_read", "cache_write", "set_scope", "compact_buffers", "decompose_reduction", "rfactor",
            "recompute_at", "reverse_compute_inline", "annotate", "fuse_siblings", "bind")
KINDS = ("parallel", "unrolled", "vectorized")
SCOPES = ("global", "shared", "local")
FUSIONS = ("rolling_update", "split_k_update")


@dataclass
class Scheduled:
    """A schedule being drawn: the lines tried, what they found, the fusion steps asked and applied."""

    sch: Schedule
    recipe: str = "none"
    steps: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    fusion_steps: list[int] = field(default_factory=lambda: [0, 0])

    def step(self, text: str) -> bool:
        """Apply ``text``; True if it was applied."""
        self.steps.append(text)
        fusion = any(f in text for f in FUSIONS)
        self.fusion_steps[0] += fusion
        found = apply_step(self.sch, text)
        if found is not None:
            self.findings.append(found)
            return False
        self.fusion_steps[1] += fusion
        return True

    @property
    def fused(self) -> bool:
        return self.fusion_steps[1] > 0

    @property
    def crashed(self) -> bool:
        return any(f.kind == CRASH for f in self.findings)


def replay(program, steps: list[str]) -> Scheduled:
    """Apply recorded steps to ``program`` (refused ones are refused again)."""
    s = Scheduled(Schedule(program))
    for text in steps:
        s.step(text)
    return s


def schedule(draw: Draw, c: Cascade) -> Scheduled:
    """A drawn schedule of ``c`` (see the module docstring)."""
    s = Scheduled(Schedule(c.program), draw.choice(RECIPES))
    if s.recipe == "none" or draw.boolean(0.25):
        for _ in range(draw.integer(1, 4 if s.recipe == "none" else 2)):
            s.step(ordinary_step(draw, s.sch))
    if s.recipe != "none":
        _fusion(draw, s, c)
        if draw.boolean(0.35):
            for _ in range(draw.integer(1, 3)):
                s.step(ordinary_step(draw, s.sch))
    return s


def _loop(block: str, name: str) -> str:
    return f'sch.loop("{block}", "{name}")'


def _loop_names(s: Scheduled, block: str) -> list[str]:
    try:
        return [r.name for r in s.sch.get_loops(block)]
    except Exception:  # noqa: BLE001 - the block may be gone (inlined, renamed)
        return []


def _fusion(draw: Draw, s: Scheduled, c: Cascade) -> None:
    producer = c.reductions[0]
    loops = _loop_names(s, producer)
    j = "j" if "j" in loops else (loops[-1] if loops else "j")
    symbolic = not isinstance(c.m, int)
    if s.recipe == "roll":
        for cons in c.consumers:
            s.step(f"sch.rolling_update({cons!r}, {_loop(producer, j)})")
    elif s.recipe == "roll_tiles":
        if draw.boolean(0.7) or "i" not in loops:
            s.step(f"sch.split({_loop(producer, j)}, [None, {draw.integer(2, 8)}])")
        else:
            s.step(f"sch.tile([{_loop(producer, 'i')}, {_loop(producer, j)}], [{draw.integer(1, 2)}, "
                   f"{draw.integer(2, 8)}])")
        outer = _new_outer(s, producer, j)
        for cons in c.consumers:
            s.step(f"sch.rolling_update({cons!r}, {_loop(producer, outer)})")
    elif s.recipe == "split_k":
        factors = f"[None, {draw.integer(1, 8)}]" if symbolic or draw.boolean(0.3) else f"[{draw.integer(1, 5)}, None]"
        s.step(f"sch.split({_loop(producer, j)}, {factors})")
        outer = _new_outer(s, producer, j)
        _split_k(s, producer, outer, c.consumers)
    else:  # split_k_roll
        s.step(f"sch.split({_loop(producer, j)}, [None, {draw.integer(1, 3)}, {draw.integer(2, 4)}])")
        outer = _new_outer(s, producer, j)
        _split_k(s, producer, outer, c.consumers)
        local = f"{producer}_rf"
        inner = [n for n in _loop_names(s, local) if n.startswith(f"{j}_") and n != outer]
        for cons in c.consumers:
            if inner and any(b.name == f"{cons}_rf" for b in s.sch.program.blocks()):
                s.step(f"sch.rolling_update('{cons}_rf', {_loop(local, inner[0])})")


def _new_outer(s: Scheduled, producer: str, j: str) -> str:
    names = [n for n in _loop_names(s, producer) if n.startswith(f"{j}_")]
    return names[0] if names else j


def _split_k(s: Scheduled, producer: str, loop: str, consumers: list[str]) -> None:
    for cons in consumers:
        local = f"{producer}_rf"
        anchor = local if loop in _loop_names(s, local) else producer
        s.step(f"sch.split_k_update({cons!r}, {_loop(anchor, loop)})")


def ordinary_step(draw: Draw, sch: Schedule) -> str:
    """One call of an ordinary primitive with drawn (legal or illegal) arguments."""
    prim = draw.choice(ORDINARY)
    blocks = [b.name for b in sch.program.blocks()]
    reductions = [b.name for b in sch.program.blocks() if b.reducer is not None] or blocks
    block = draw.choice(reductions if prim in ("decompose_reduction", "rfactor", "cache_write") else blocks)
    loops = [r.name for r in sch.get_loops(block)] or ["i"]
    loop = _loop(block, draw.choice(loops))
    if prim == "split":
        factors = draw.choice(["[None, 2]", "[None, 3]", "[2, None]", "[3, None]", "[None, 2, 2]", "[None, 1]"])
        return f"sch.split({loop}, {factors})"
    if prim in ("reorder", "fuse", "tile"):
        at = draw.integer(0, len(loops) - 1)
        pair = [_loop(block, loops[at]), _loop(block, loops[min(at + 1, len(loops) - 1)])]
        if draw.boolean(0.3):
            pair.reverse()
        if prim == "tile":
            return f"sch.tile([{', '.join(pair)}], [{draw.integer(1, 3)}, {draw.integer(2, 4)}])"
        return f"sch.{prim}([{', '.join(pair)}])"
    if prim == "annotate":
        return f"sch.annotate({loop}, {draw.choice(KINDS)!r})"
    if prim == "bind":
        return f"sch.bind({loop}, 'threadIdx.y')"
    if prim in ("compute_at", "reverse_compute_at", "recompute_at", "fuse_siblings"):
        other = draw.choice(blocks)
        other_loops = [r.name for r in sch.get_loops(other)] or ["i"]
        return f"sch.{prim}({block!r}, {_loop(other, draw.choice(other_loops))})"
    if prim in ("compute_inline", "reverse_compute_inline"):
        return f"sch.{prim}({block!r})"
    if prim == "cache_read":
        return f"sch.cache_read({block!r}, {draw.choice([0, 1, 'x'])!r}, {draw.choice(SCOPES)!r})"
    if prim in ("cache_write", "set_scope"):
        return f"sch.{prim}({block!r}, {draw.choice(SCOPES)!r})"
    if prim == "compact_buffers":
        return "sch.compact_buffers()"
    if prim == "decompose_reduction":
        return f"sch.decompose_reduction({block!r}, {loop})"
    return f"sch.rfactor({loop})"
