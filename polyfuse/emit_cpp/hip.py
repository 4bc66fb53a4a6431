"""The HIP backend: the CUDA emitter with HIP's differences.

AMD GPUs run wavefronts of 64 lanes, so reductions shuffle across up to 64 lanes and a block of
four wavefronts has 256 threads (the gfx presets' ``default_warps``, :mod:`polyfuse.device`);
``__shfl_xor`` takes no mask (see ``polyfuse_gpu.h``); dots use the portable shared-memory FMA path
instead of NVIDIA's ``mma.sync`` (the device has no ``mma_sync``; MFMA is not generated yet); and
``exp`` stays the accurate one (the ``fast_exp`` bound is CUDA's ``ex2.approx``'s).  Everything else —
the grid, shared memory, barriers — is the same source, planned for the device's shared memory.
"""

from __future__ import annotations

from polyfuse.emit_cpp.cuda import CudaEmitter


class HipEmitter(CudaEmitter):
    """HIP C++ for hipcc (ROCm's clang)."""

    fast_exp_function = None
