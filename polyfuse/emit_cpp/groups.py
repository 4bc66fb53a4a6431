"""Loops run by groups of a thread block's warps (CUDA, HIP): a loop bound to ``threadIdx.y``
(:data:`~polyfuse.ir.stmt.WARP_GROUPS`, :meth:`~polyfuse.transforms.schedule.Schedule.bind`).

A block kernel spreads each statement over all its threads, with a block barrier between statements.  A loop
whose iterations are independent can instead run each iteration on a group of the block's warps, its
statements spread over the group's threads, its barriers the group's own (``__syncwarp`` for one warp, a named
barrier for several), and the block meets once, after the loop.  That is split-k inside a block: a decode
block's keys split again over its warps (each streaming its own key tiles, with its own copies in flight and no
block barrier in the loop), the warps' partial results combined by the whole block after the loop.

The statements inside such a loop are planned for one group's threads (:class:`WarpGroups`); what they take of
shared memory (their scratch, the operand tiles their loops keep) and the temporaries allocated inside the
loop are one copy per group.  Iteration ``y`` runs on group ``y mod groups``.  Groups are the most, up to the
loop's extent, that divide the block's warps; several warps per group need a named barrier each (NVIDIA's
``bar.sync id, n``, ids 1..15), so elsewhere each group is one wavefront and wavefronts beyond the loop's
extent wait at the barrier after it.  Loops inside a group loop run their statements one by one (no warp
fragments: those are planned for the block's warps), and a group loop inside another is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.device import DeviceSpec
from polyfuse.errors import UnsupportedPattern
from polyfuse.ir.expr import Const
from polyfuse.ir.stmt import BOUND, WARP_GROUPS, Loop, Seq, Stmt
from polyfuse.tiling.parallel import allocated_at, on_warp_groups

NAMED_BARRIERS = 15
"""Named barriers a block may use besides barrier 0 (``__syncthreads``)."""
ALIGN = 128
"""Byte alignment of each group's copy of the loop's shared memory (every array inside is at most 128-aligned:
the swizzled tiles of warp fragments, 1024-aligned, are not planned inside a group loop)."""


@dataclass(frozen=True)
class WarpGroups:
    """A loop run by ``groups`` groups of ``threads`` threads each (whole warps); ``stride``: bytes from one
    group's shared memory to the next (the loop body's, :data:`ALIGN`-aligned; 0 before the body is planned)."""

    var: str
    extent: int
    groups: int
    threads: int
    warp: int
    stride: int = 0

    @property
    def barrier(self) -> str:
        """The C statement that orders the group's threads (its shared and global memory accesses)."""
        if self.threads == self.warp:
            return "pf::syncwarp();"
        return f"pf::named_sync(1 + pf_group, {self.threads});"

    def describe(self) -> str:
        per = "one warp" if self.threads == self.warp else f"{self.threads // self.warp} warps"
        return (f"run by {self.groups} groups of {per} (iteration {self.var} on group {self.var} mod {self.groups}), "
                f"their shared memory one copy of {self.stride} bytes per group")


def shape(loop: Loop, threads: int, device: DeviceSpec) -> WarpGroups:
    """The groups that run ``loop`` in a block of ``threads`` threads on ``device``."""
    if not isinstance(loop.extent, Const):
        raise UnsupportedPattern(f"loop {loop.var.name!r} is bound to {WARP_GROUPS} but its extent {loop.extent} is "
                                 f"not a constant; groups of warps are fixed when the kernel is compiled")
    extent, warps = int(loop.extent.value), threads // device.warp_size
    if device.vendor != "nvidia":
        groups = min(extent, warps)
        return WarpGroups(loop.var.name, extent, groups, device.warp_size, device.warp_size)
    groups = max(d for d in range(1, min(extent, warps) + 1)
                 if warps % d == 0 and (d == warps or d <= NAMED_BARRIERS))
    return WarpGroups(loop.var.name, extent, groups, threads // groups, device.warp_size)


def plan(body: Stmt, threads: int, device: DeviceSpec) -> dict[int, WarpGroups]:
    """The loops of a kernel ``body`` run by warp groups, by identity; refuses a thread binding other than
    :data:`~polyfuse.ir.stmt.WARP_GROUPS` and a group loop inside another."""
    found: dict[int, WarpGroups] = {}

    def visit(s: Stmt, inside: str | None) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                visit(c, inside)
        elif isinstance(s, Loop):
            if s.kind == BOUND and not on_warp_groups(s):
                raise UnsupportedPattern(
                    f"loop {s.var.name!r} is bound to {s.thread} inside a GPU kernel; a block spreads its statements "
                    f"over its threads itself: bind a loop to {WARP_GROUPS} to run its iterations on groups of "
                    f"the block's warps, or leave it unbound")
            if on_warp_groups(s):
                if inside is not None:
                    raise UnsupportedPattern(f"loop {s.var.name!r} is bound to {WARP_GROUPS} inside loop {inside!r}, "
                                             f"bound to it too; bind one loop of the nest to the warp groups")
                found[id(s)] = shape(s, threads, device)
                inside = s.var.name
            visit(s.body, inside)

    visit(body, None)
    return found


def copies(body: Stmt, found: dict[int, WarpGroups]) -> dict[str, WarpGroups]:
    """The temporaries allocated in (or at) a group loop of ``body``, with its groups: one copy per group."""
    out: dict[str, WarpGroups] = {}

    def visit(s: Stmt, g: WarpGroups | None) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                visit(c, g)
        elif isinstance(s, Loop):
            g = found.get(id(s), g)
            if g is not None:
                out.update((name, g) for name in allocated_at(s))
            visit(s.body, g)

    visit(body, None)
    return out


def copy_address(offset: int, nbytes: int, g: WarpGroups) -> str:
    """The address of this thread's group's copy of a temporary of ``nbytes`` at byte ``offset`` (declared at
    the top of the kernel, where ``pf_tid`` is the block's thread)."""
    return f"pf_smem + {offset} + (pf_tid / {g.threads}) * {_copy_stride(nbytes)}"


def copy_bytes(nbytes: int, g: WarpGroups) -> int:
    """Shared memory of a temporary of ``nbytes`` copied once per group."""
    return _copy_stride(nbytes) * g.groups


def _copy_stride(nbytes: int) -> int:
    """Bytes from one group's copy of a temporary of ``nbytes`` to the next (:data:`ALIGN`-aligned)."""
    return -(-nbytes // ALIGN) * ALIGN


def emit(em, g: WarpGroups, body: Callable[[], None]) -> None:
    """Print the loop run by groups ``g``: ``pf_group``, the thread's group; inside, ``pf_tid`` the thread of the group
    and the group's barriers (:meth:`~polyfuse.emit_cpp.cuda.CudaEmitter.in_groups`); the loop variable the
    group's iteration (a loop over its iterations where there are more of them than groups, or idle
    wavefronts); a block barrier after it (what the groups wrote is read by the block)."""
    em.open("")
    em.line(f"const int pf_group = pf_tid / {g.threads};  // ({g.groups} groups of {g.threads} threads run "
            f"{g.var}'s iterations)")
    t = em.widths.loop
    with em.in_groups(g):
        if g.groups == g.extent and g.groups * g.threads == em.block_threads:
            em.open("")
            em.line(f"const {t} {g.var} = pf_group;")
        else:
            em.open(f"for ({t} {g.var} = pf_group; {g.var} < {g.extent}; {g.var} += {g.groups})")
        body()
        em.close()
    em.close()
    em.barrier()
