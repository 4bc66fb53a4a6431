"""The HIP backend: the CUDA emitter with HIP's differences.

AMD GPUs run wavefronts of 64 lanes, so reductions shuffle across up to 64 lanes and a block of
four wavefronts has 256 threads; ``__shfl_xor`` takes no mask (see ``polyfuse_gpu.h``); dots
use the portable shared-memory FMA path instead of NVIDIA's ``mma.sync`` (MFMA is not
generated yet); and ``exp`` stays the accurate one (``FAST_EXP``'s error bound is CUDA's).
Everything else — the grid, shared memory, barriers — is the same source.
"""

from __future__ import annotations

from polyfuse.emit_cpp.cuda import CudaEmitter
from polyfuse.emit_cpp.target import KernelSource, Target, entry_name
from polyfuse.tiling.htile import TileProgram


class HipEmitter(CudaEmitter):
    """HIP C++ for hipcc (ROCm's clang)."""

    tensor_cores = False
    fast_exp_function = None


def emit_hip(program: TileProgram, target: Target) -> KernelSource:
    return HipEmitter(program, target).kernel(entry_name(program.name))
