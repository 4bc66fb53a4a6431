"""Loop nests -> tile programs (HTile IR), with dimension-order reconciliation.

``to_tiles(program)`` translates a loop program (Neptune Algorithm 3);
``interpret(tile_program, inputs)`` runs the result with NumPy.
"""

from polyfuse.tiling.htile import (
    Broadcast, Dot, Iota, Permute, Reduce, Slice, Squeeze, TileLoad, TileProgram, TileStore, axes_of,
)
from polyfuse.tiling.interpreter import interpret
from polyfuse.tiling.reconcile import reconcile_dim_order
from polyfuse.tiling.translate import to_tiles

__all__ = [
    "Broadcast", "Dot", "Iota", "Permute", "Reduce", "Slice", "Squeeze", "TileLoad", "TileProgram", "TileStore",
    "axes_of", "interpret", "reconcile_dim_order", "to_tiles",
]
