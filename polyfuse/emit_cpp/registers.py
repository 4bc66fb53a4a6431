"""Accumulators that stay in registers across a rolling loop (CUDA tensor cores).

A rolling update ``acc = acc·h + a·b`` (attention's ``pv``, a GEMM's ``C``) is one statement whose value holds
one tensor-core dot over exactly the statement's axes; the emitter computes it in the dot's epilogue
(``CudaEmitter.dot_in_place``), each thread holding the same output elements at every iteration — the m16n8
fragments of its warp's tile. When no other statement of the loop touches the accumulator tensor, those
elements need not go through memory at every step: they live in the thread's registers (``float acc[per][4]``,
laid out by the dot's :class:`~polyfuse.emit_cpp.dotplan.FragmentLayout`), read from the tensor once before
the loop and written back once after it. Per iteration that saves a read and a write of the whole accumulator
tile in shared memory — or in global memory, where a split-k partial lives there (decode and performer
partials).

It applies where each warp owns at most one tile of the output (true of every catalog plan: the
warps cover the output once), the accumulator is f32, the statement's index does not move with the
loop, and every read of the accumulator in the statement is of the element it writes, unmasked; and
where at least half of the fragment's 16 rows are real.  With fewer (decode of one query row per
head) the registers hold mostly padding and save little traffic, and they cost occupancy (more
registers per thread, fewer resident blocks).  :func:`plan` decides (the kernel plan records it);
:func:`load` and :func:`store` print the copies before and after the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.dotplan import M16N8, Frame, mma_type, staging, warp_tiling
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import INPUT, Loop, Seq
from polyfuse.tiling.htile import Dot, Slice, TileLoad, TileStore, axes_of, axis_sizes, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter


@dataclass(frozen=True)
class Accumulator:
    """The registers ``name[per][4]`` holding statement ``store``'s tensor across the loop: the output of its
    dot as the warps tile it (``mtiles × groups`` warp tiles of ``per`` 8-column tiles), ``rows × cols`` real
    elements over the axes ``row_axes`` and ``col_axes``."""

    store: TileStore
    dot: Dot
    name: str
    sizes: dict[str, int]
    mtiles: int
    groups: int
    per: int
    rows: int
    cols: int
    row_axes: tuple[str, ...]
    col_axes: tuple[str, ...]

    def describe(self) -> str:
        return (f"{self.store.block}: {self.store.tensor.name} in registers {self.name}[{self.per}][4] "
                f"(m16n8 fragments of {self.mtiles}x{self.groups} warp tiles)")


def plan(frame: Frame, loop: Loop, fresh: Callable[[str], str]) -> dict[str, Accumulator]:
    """The statements of ``loop`` whose accumulators can live in registers, by block."""
    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not frame.options.register_accumulators or not all(isinstance(s, TileStore) for s in body):
        return {}
    found: dict[str, Accumulator] = {}
    for at, s in enumerate(body):
        t = s.tensor
        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        if (len(dots) != 1 or s.mask is not None or s.reducer is not None or t.role == INPUT or t.dtype != dt.f32
                or any(isinstance(n, Var) and n.name == loop.var.name
                       for i in s.index if not isinstance(i, Slice) for n in walk_tile_expr(i))):
            continue
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        here = frame.at(axis_sizes(s))
        e = dots[0]
        if set(axes) != set(axes_of(e)) or mma_type(here, e) is None:
            continue
        reads = [n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == t.name]
        if any(n.index != s.index or n.mask is not None for n in reads):
            continue
        if any(isinstance(n, TileLoad) and n.tensor.name == t.name
               for x in (e.a, e.b, e.acc) for n in walk_tile_expr(x)):
            continue
        if any(_touches(other, t.name) for k, other in enumerate(body) if k != at):
            continue
        a, b = staging(here, e)
        mtiles, groups, per = warp_tiling(here, a.rows_pad, b.rows_pad)
        if mtiles * groups > here.warps or a.rows * 2 < a.rows_pad:
            continue
        found[s.block] = Accumulator(s, e, fresh("racc"), dict(here.sizes), mtiles, groups, per, a.rows, b.rows,
                                     a.rows_axes, b.rows_axes)
    return found


def _touches(s: TileStore, name: str) -> bool:
    if s.tensor.name == name:
        return True
    exprs = [s.value] + ([s.mask] if s.mask is not None else []) + [i for i in s.index if not isinstance(i, Slice)]
    return any(isinstance(n, TileLoad) and n.tensor.name == name for x in exprs for n in walk_tile_expr(x))


def load(em: CudaEmitter, acc: Accumulator) -> None:
    """Declare ``acc``'s registers and read the accumulator's elements into them (before the loop)."""
    em.line(f"float {acc.name}[{acc.per}][4] = {{}};  // {acc.store.block}: {acc.store.tensor.name} in registers")
    _each_element(em, acc, lambda target, env: em.line(
        f"{target} = {em.from_storage(em.access(acc.store.tensor, acc.store.index, env), dt.f32)};"))


def store(em: CudaEmitter, acc: Accumulator) -> None:
    """Write ``acc``'s registers back to the accumulator (after the loop)."""
    em.line(f"// {acc.store.block}: {acc.store.tensor.name} from registers")
    _each_element(em, acc, lambda target, env: em.line(
        f"{em.access(acc.store.tensor, acc.store.index, env)} = {em.to_storage(target, dt.f32)};"))


def _each_element(em: CudaEmitter, acc: Accumulator, body) -> None:
    """``body(register, env)`` for every output element this thread holds (the epilogue's mapping)."""
    saved, em.sizes = em.sizes, acc.sizes
    em.open("")
    em.line(f"const int pf_warp = pf_tid / {em.warp}, pf_lane = pf_tid % {em.warp};")
    em.open(f"if (pf_warp < {acc.mtiles * acc.groups})")
    em.line(f"const int pf_mt = pf_warp / {acc.groups}, pf_ng = pf_warp % {acc.groups};")
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {acc.per}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_q = 0; pf_q < 4; ++pf_q)")
    em.line(f"const int pf_m = pf_mt * 16 + {M16N8.row('pf_lane', '(pf_q / 2)')};")
    em.line(f"const int pf_n = (pf_ng * {acc.per} + pf_nb) * 8 + {M16N8.col('pf_lane', 'pf_q % 2')};")
    em.open(f"if (pf_m < {acc.rows} && pf_n < {acc.cols})")
    env = {**em.decode(acc.row_axes, "pf_m"), **em.decode(acc.col_axes, "pf_n")}
    body(f"{acc.name}[pf_nb][pf_q]", env)
    for _ in range(5):
        em.close()
    em.sizes = saved
