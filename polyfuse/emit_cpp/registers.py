"""Accumulators that stay in registers across a rolling loop (CUDA tensor cores).

A rolling update ``acc = acc·h + a·b`` (attention's ``pv``, a GEMM's ``C``) is one statement whose
value holds one tensor-core dot over exactly the statement's axes; the emitter computes it in the
dot's epilogue (``CudaEmitter.dot_in_place``), each thread holding the same output elements at every
iteration — the m16n8 fragments of its warp's tile.  When no other statement of the loop touches the
accumulator tensor, those elements need not go through memory at every step: they live in the
thread's registers (``float acc[per][4]``, the fragment layout of :func:`polyfuse.emit_cpp.mma.warp_tiling`),
read from the tensor once before the loop and written back once after it.  Per iteration that
saves a read and a write of the whole accumulator tile in shared memory — or in global memory,
where a split-k partial lives there (decode and performer partials).

It applies where each warp owns at most one tile of the output (true of every catalog plan: the
warps cover the output once), the accumulator is f32, the statement's index does not move with the
loop, and every read of the accumulator in the statement is of the element it writes, unmasked; and
where at least half of the fragment's 16 rows are real.  With fewer (decode of one query row per
head) the registers hold mostly padding and save little traffic, and they cost occupancy: measured
on the H200, attn_norm_inside decode B=32 H=64 Skv=4096 went from 64 to 79 registers per thread
(4 → 3 blocks per SM) and from 1.44 to 1.71 ms.  Where it applies it measured faster: causal prefill
S=4096 3.13 → 2.81 ms, MLA decode B=32 1.05 → 0.95 ms, global prefill 1.83 → 1.69 ms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import Var
from polyfuse.ir.stmt import INPUT, Loop, Seq
from polyfuse.tiling.htile import Dot, Slice, TileLoad, TileStore, axes_of, axis_sizes, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

REGISTER_ACCUMULATORS = True
"""Keep rolling accumulators in registers across their loop (see the module docstring)."""


@dataclass
class Accumulator:
    """The registers ``name[per][4]`` holding statement ``store``'s tensor across the loop."""

    store: TileStore
    dot: Dot
    name: str
    sizes: dict[str, int]
    used: bool = False


def plan(em: CudaEmitter, loop: Loop) -> dict[str, Accumulator]:
    """The statements of ``loop`` whose accumulators can live in registers, by block."""
    from polyfuse.emit_cpp.mma import mma_type, staging, warp_tiling

    body = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
    if not REGISTER_ACCUMULATORS or not all(isinstance(s, TileStore) for s in body):
        return {}
    found: dict[str, Accumulator] = {}
    saved = getattr(em, "sizes", {})
    for at, s in enumerate(body):
        t = s.tensor
        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        if (len(dots) != 1 or s.mask is not None or s.reducer is not None or t.role == INPUT or t.dtype != dt.f32
                or any(isinstance(n, Var) and n.name == loop.var.name
                       for i in s.index if not isinstance(i, Slice) for n in walk_tile_expr(i))):
            continue
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        em.sizes = axis_sizes(s)
        e = dots[0]
        if set(axes) != set(axes_of(e)) or mma_type(em, e) is None:
            continue
        reads = [n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == t.name]
        if any(n.index != s.index or n.mask is not None for n in reads):
            continue
        if any(isinstance(n, TileLoad) and n.tensor.name == t.name
               for x in (e.a, e.b, e.acc) for n in walk_tile_expr(x)):
            continue
        if any(_touches(other, t.name) for k, other in enumerate(body) if k != at):
            continue
        a, b = staging(em, e)
        mtiles, groups, _ = warp_tiling(em, a.rows_pad, b.rows_pad)
        if mtiles * groups > em.threads // em.warp or a.rows * 2 < a.rows_pad:
            continue
        found[s.block] = Accumulator(s, e, em.fresh("acc"), em.sizes)
    em.sizes = saved
    return found


def _touches(s: TileStore, name: str) -> bool:
    if s.tensor.name == name:
        return True
    exprs = [s.value] + ([s.mask] if s.mask is not None else []) + [i for i in s.index if not isinstance(i, Slice)]
    return any(isinstance(n, TileLoad) and n.tensor.name == name for x in exprs for n in walk_tile_expr(x))


def load(em: CudaEmitter, acc: Accumulator) -> None:
    """Declare ``acc``'s registers and read the accumulator's elements into them (before the loop)."""
    from polyfuse.emit_cpp.mma import staging, warp_tiling

    saved, em.sizes = getattr(em, "sizes", {}), acc.sizes
    _, _, per = warp_tiling(em, *(op.rows_pad for op in staging(em, acc.dot)))
    em.line(f"float {acc.name}[{per}][4] = {{}};  // {acc.store.block}: {acc.store.tensor.name} in registers")
    _each_element(em, acc, lambda target, env: em.line(
        f"{target} = {em.from_storage(em.access(acc.store.tensor, acc.store.index, env), dt.f32)};"))
    em.sizes = saved


def store(em: CudaEmitter, acc: Accumulator) -> None:
    """Write ``acc``'s registers back to the accumulator (after the loop)."""
    saved, em.sizes = getattr(em, "sizes", {}), acc.sizes
    em.line(f"// {acc.store.block}: {acc.store.tensor.name} from registers")
    _each_element(em, acc, lambda target, env: em.line(
        f"{em.access(acc.store.tensor, acc.store.index, env)} = {em.to_storage(target, dt.f32)};"))
    em.sizes = saved


def _each_element(em: CudaEmitter, acc: Accumulator, body) -> None:
    """``body(register, env)`` for every output element this thread holds (the epilogue's mapping)."""
    from polyfuse.emit_cpp.mma import staging, warp_tiling

    a, b = staging(em, acc.dot)
    mtiles, groups, per = warp_tiling(em, a.rows_pad, b.rows_pad)
    em.open("")
    em.line(f"const int pf_warp = pf_tid / {em.warp}, pf_lane = pf_tid % {em.warp};")
    em.open(f"if (pf_warp < {mtiles * groups})")
    em.line(f"const int pf_mt = pf_warp / {groups}, pf_ng = pf_warp % {groups};")
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_q = 0; pf_q < 4; ++pf_q)")
    em.line("const int pf_m = pf_mt * 16 + pf_lane / 4 + (pf_q / 2) * 8;")
    em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + (pf_lane % 4) * 2 + pf_q % 2;")
    em.open(f"if (pf_m < {a.rows} && pf_n < {b.rows})")
    env = {**em.decode(a.rows_axes, "pf_m"), **em.decode(b.rows_axes, "pf_n")}
    body(f"{acc.name}[pf_nb][pf_q]", env)
    for _ in range(5):
        em.close()
