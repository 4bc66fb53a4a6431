"""Two GPU kernels of one operator that must agree: the same bits on every input variant and magnitude, and the
NumPy reference within the operator's tolerance (a code generation option on against off, bulk copies against
cp.async)."""

from __future__ import annotations

import numpy as np

from polyfuse import ops
from polyfuse.ops.variants import VARIANTS


def assert_same_bits_and_numpy(op: ops.Operator, mode: str, sizes: dict, first, second, seed: int) -> None:
    """``first`` and ``second`` (built kernels of ``op`` at ``sizes``) on ``op``'s inputs of ``seed`` for every
    magnitude and input variant: bit for bit equal (NaN where NaN), and ``first`` within the tolerance of NumPy."""
    tolerance = op.tolerance(mode, sizes)
    for magnitude in op.magnitudes:
        for variant in VARIANTS:
            inputs = op.inputs(seed, mode, sizes, magnitude, variant)
            a, b = first.run(inputs), second.run(inputs)
            for out in a:
                assert np.array_equal(np.asarray(a[out]), np.asarray(b[out]), equal_nan=True), (variant, magnitude)
            result = ops.compare(a, op.reference(inputs, mode, sizes), tolerance)
            assert result.ok, f"{variant} at {magnitude:g}: {result.line()} worst {result.worst}"
