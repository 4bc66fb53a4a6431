"""f32 input operands of tensor-core products split into bf16 hi + lo once, by a kernel of their own.

A product of two f32 operands runs on tensor cores on bf16 parts, ``hi = bf16(x)`` and
``lo = bf16(x - hi)`` (:mod:`polyfuse.emit_cpp.mma`).  Staging computes them per tile, so where an input
tensor's tile does not move with every grid loop of its kernel, every block that reads the tile converts
it again, at every step of its loop: quant_gemm's ``W[k, n]`` is read by all M/64 row blocks.  For such a
tensor the CUDA source starts with a kernel that splits it once into two bf16 scratch arrays ``T_pf_hi``
and ``T_pf_lo`` (by :func:`~polyfuse.emit_cpp.mma.split_parts`, as staging does, so the same parts), and
the product copies both parts into shared memory with cp.async, as it copies a 16-bit operand: no conversion and no
registers in the loop, for one more pass over the tensor (read 4 bytes, write 2 + 2 per element).

Only plain loads qualify (no mask, a static shape whose element count is a multiple of 4): the split
kernel reads the tensor four elements at a time.  :func:`plan` decides (the options' ``presplit``), the
program plan records it, :func:`emit_kernels` prints the split kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.cfamily import static_numel
from polyfuse.emit_cpp.dotplan import Frame, mma_type, plain_f32_load
from polyfuse.emit_cpp.staging import split_parts
from polyfuse.emit_cpp.target import Launch
from polyfuse.ir import dtypes as dt
from polyfuse.ir.expr import Const, Var
from polyfuse.ir.stmt import TEMP, Tensor
from polyfuse.tiling.grid import CTA, GridNest
from polyfuse.tiling.htile import Dot, Slice, TileLoad, TileStore, axis_sizes, walk_tile_expr, walk_tile_stmts
from polyfuse.tiling.parallel import unit_loop

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

VEC = 4
"""f32 elements a thread of the split kernel reads with one 128-bit load."""


def plan(nests: tuple[GridNest, ...], frame_of: Callable[[GridNest], Frame]) -> dict[str, tuple[Tensor, Tensor]]:
    """The input tensors to split before the kernels, each with its hi and lo scratch arrays (``frame_of``:
    the frame of a kernel's statements)."""
    found: dict[str, tuple[Tensor, Tensor]] = {}
    for nest in nests:
        if nest.kind != CTA:
            continue
        frame = frame_of(nest)
        if not frame.options.presplit or not frame.tensor_cores:
            return found
        grid = {lp.var.name for lp in nest.chain if not unit_loop(lp)}
        for s in walk_tile_stmts(nest.body):
            if not isinstance(s, TileStore):
                continue
            here = frame.at(axis_sizes(s))
            for e in walk_tile_expr(s.value):
                if not isinstance(e, Dot) or mma_type(here, e) != dt.bf16:
                    continue
                for x in (e.a, e.b):
                    load = plain_f32_load(x)
                    if load is None or load.tensor.name in found or not grid - _variables(load):
                        continue
                    t = load.tensor
                    size = static_numel(t)
                    names = [f"{t.name}_pf_{part}" for part in ("hi", "lo")]
                    if size is None or size % VEC or any(n in frame.tensors for n in names):
                        continue  # (a program tensor of that name: the operand is converted per tile instead)
                    found[t.name] = tuple(Tensor(n, t.shape, dt.bf16, TEMP) for n in names)
    return found


def emit_kernels(em: CudaEmitter, entry: str) -> tuple[Launch, ...]:
    """One kernel per split tensor, each thread splitting ``VEC`` neighbours per step of a grid-stride loop."""
    launches = []
    threads = em.options.map_threads  # (one element group per thread, as a map kernel)
    for name, (hi, lo) in em.presplit.items():
        total = static_numel(em.tensors[name]) // VEC
        kernel = f"{entry}_split_{name}"
        em.line(f"{em.kernel_qualifiers(threads)} {kernel}({em.parameters()})")
        em.line("{")
        em.depth += 1
        em.line(f"// {name} into bf16 {hi.name} + {lo.name}, as tensor-core staging splits it")
        em.open(f"for (int64_t pf_g = static_cast<int64_t>(blockIdx.x) * {threads} + threadIdx.x; pf_g < {total}; "
                f"pf_g += static_cast<int64_t>(gridDim.x) * {threads})")
        em.line(f"alignas(16) float pf_v[{VEC}];")
        em.line(f"*reinterpret_cast<uint4*>(pf_v) = reinterpret_cast<const uint4*>({name})[pf_g];")
        em.line(f"alignas(8) uint16_t pf_hi[{VEC}];")
        em.line(f"alignas(8) uint16_t pf_lo[{VEC}];")
        em.line("#pragma unroll")
        em.open(f"for (int pf_l = 0; pf_l < {VEC}; ++pf_l)")
        hi_part, lo_part = split_parts("bf16", "pf_v[pf_l]", "pf_hi[pf_l]")
        em.line(f"pf_hi[pf_l] = {hi_part};")
        em.line(f"pf_lo[pf_l] = {lo_part};")
        em.close()
        for part, values in ((hi, "pf_hi"), (lo, "pf_lo")):
            em.line(f"reinterpret_cast<uint2*>({part.name})[pf_g] = *reinterpret_cast<const uint2*>({values});")
        em.close()
        em.depth -= 1
        em.line("}")
        em.line("")
        blocks = max(1, min(-(-total // threads), 1 << 20))
        launches.append(Launch(kernel, Const(blocks, dt.i64), threads, 0))
    return tuple(launches)


def _variables(load: TileLoad) -> set[str]:
    """The loop variables the position of ``load``'s tile depends on."""
    exprs = [i.start if isinstance(i, Slice) else i for i in load.index]
    return {n.name for e in exprs for n in walk_tile_expr(e) if isinstance(n, Var)}
