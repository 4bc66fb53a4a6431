"""The GPU stages of a tile program: what the CUDA and HIP emitters lower, as named, dumpable passes.

Between the target-independent tile program (:func:`~polyfuse.tiling.to_tiles`) and the GPU code generator
run five ``TileProgram → TileProgram`` passes, in this order (:data:`GPU_STAGES`):

``pad``
    the ragged last tile of a parallel axis is computed whole where its extra rows provably reach no memory
    and no real row, so that its statements need no row guard (:mod:`~polyfuse.tiling.pad`);
``simplify``
    masks and selects that hold on a whole tile axis are decided once (:mod:`~polyfuse.tiling.simplify`);
``skip``
    rolling loops stop before the tiles a mask hides entirely (:mod:`~polyfuse.tiling.skip`);
``inline``
    a product consumed by one statement of the same loop is computed in that statement, so that the
    emitter can keep it in the product's registers (:mod:`~polyfuse.tiling.inline`);
``grid``
    the program is cut into kernels: parallel outer loops become the grid, split-k chains are distributed
    into partial and combine kernels with their shared temporaries promoted (:mod:`~polyfuse.tiling.grid`).

:func:`lower_for_gpu` runs them and returns a :class:`GpuProgram` (the program and its kernels);
:func:`gpu_stages` returns every intermediate program by name, for ``polyfuse show --stage tile``.  The
emitters start from a ``GpuProgram`` and transform nothing themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.tiling.grid import GridNest, partition
from polyfuse.tiling.htile import TileProgram, print_tile_program, tile_stmt_str
from polyfuse.tiling.inline import inline_products
from polyfuse.tiling.pad import pad_rows
from polyfuse.tiling.simplify import simplify_tiles
from polyfuse.tiling.skip import skip_masked_tiles

GPU_STAGES = ("pad", "simplify", "skip", "inline", "grid")


@dataclass(frozen=True)
class GpuProgram:
    """A tile program cut into GPU kernels: ``program`` (promoted temporaries declared) and its ``nests``,
    one kernel each, launched in order."""

    program: TileProgram
    nests: tuple[GridNest, ...]

    def __str__(self) -> str:
        head = print_tile_program(self.program).splitlines()
        parts = [line for line in head if line.startswith("# ")]
        parts.append(f"# {len(self.nests)} kernel(s), launched in order")
        for k, nest in enumerate(self.nests):
            grid = ", ".join(f"{lp.var.name} < {lp.extent}" for lp in nest.chain) or "one block"
            shared = f"; in shared memory: {', '.join(nest.shared)}" if nest.shared else ""
            warps = f"; {nest.warps} warps" if nest.warps is not None else ""
            parts.append(f"# kernel k{k} ({nest.kind}): grid {grid}{shared}{warps}")
            parts.append(tile_stmt_str(nest.body))
        return "\n".join(parts)


def gpu_stages(program: TileProgram) -> tuple[tuple[str, TileProgram | GpuProgram], ...]:
    """``(stage, result)`` for every GPU stage in order; the last is the :class:`GpuProgram`."""
    padded = pad_rows(program)
    simplified = simplify_tiles(padded)
    skipped = skip_masked_tiles(simplified)
    inlined = inline_products(skipped)
    partitioned, nests = partition(inlined)
    return (("pad", padded), ("simplify", simplified), ("skip", skipped), ("inline", inlined),
            ("grid", GpuProgram(partitioned, nests)))


def lower_for_gpu(program: TileProgram) -> GpuProgram:
    """The program the GPU emitters lower: every stage of :data:`GPU_STAGES` applied."""
    result = gpu_stages(program)[-1][1]
    assert isinstance(result, GpuProgram)
    return result
