"""What accelerators this machine has, asked without initialising anything heavy."""

from __future__ import annotations

import functools
import shutil
import subprocess


@functools.cache
def cuda_gpu_count() -> int:
    """Number of CUDA GPUs visible: ``nvidia-smi -L`` if present, else cuda-python, else 0."""
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            listing = None
        if listing is not None and listing.returncode == 0:
            return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError:
            return 0
    try:
        err, count = cudart.cudaGetDeviceCount()
    except (RuntimeError, OSError):
        return 0
    return int(count) if int(err) == 0 else 0


@functools.cache
def hip_gpu_count() -> int:
    """Number of HIP GPUs visible through hip-python (0 without it)."""
    try:
        from hip import hip
    except ImportError:
        return 0
    err, count = hip.hipGetDeviceCount()
    return int(count) if int(err) == 0 else 0


def require_gpu(backend: str) -> None:
    """BackendUnavailable (exit 4) unless a GPU of ``backend`` (``cuda`` or ``hip``) is present."""
    from polyfuse.errors import BackendUnavailable

    count = cuda_gpu_count() if backend == "cuda" else hip_gpu_count()
    if count == 0:
        kind = "NVIDIA (CUDA)" if backend == "cuda" else "AMD (HIP)"
        raise BackendUnavailable(f"backend {backend} needs an {kind} GPU; none is visible on this machine")


def nvcc_path() -> str | None:
    """Where ``nvcc`` is on PATH, if anywhere."""
    return shutil.which("nvcc")
