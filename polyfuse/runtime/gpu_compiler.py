"""Compile generated CUDA (nvcc) and HIP (hipcc) sources into device code, cached on disk.

CUDA sources become cubins for one architecture (``sm_90a`` on the H200; the runtime asks the
device for its own), HIP sources code objects for one ``--offload-arch``.  The cache is the host
backend's (:func:`polyfuse.runtime.compiler.cache_dir`), keyed by the source, the runtime
headers, the compiler's version and the flags; concurrent builds are safe (temp file, then an
atomic rename).  ``compile_only`` writes nothing to the cache and only checks that the source
compiles, the path CI takes on machines with a compiler and no GPU.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from polyfuse.errors import BackendUnavailable
from polyfuse.runtime.compiler import RUNTIME_DIR, build_cached, cache_dir

NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", "-Xptxas=-warn-spills")
HIPCC_FLAGS = ("-std=c++17", "-O3", "--genco")


def nvcc() -> str:
    """``$NVCC``, else ``nvcc`` on PATH, else CUDA's default location (BackendUnavailable if none)."""
    for name in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if name and (path := shutil.which(name)):
            return path
    raise BackendUnavailable("the CUDA backend needs nvcc (CUDA toolkit); it is not on PATH")


def hipcc() -> str:
    """``$HIPCC``, else ``hipcc`` on PATH, else ROCm's default location (BackendUnavailable if none)."""
    for name in (os.environ.get("HIPCC"), "hipcc", "/opt/rocm/bin/hipcc"):
        if name and (path := shutil.which(name)):
            return path
    raise BackendUnavailable("the HIP backend needs hipcc (ROCm, or Debian's hipcc package); it is not on PATH")


@functools.lru_cache(maxsize=4)
def _version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or path


def command(backend: str, arch: str, source: Path, output: Path) -> list[str]:
    """The compiler command line for ``backend`` (``cuda`` or ``hip``)."""
    include = f"-I{RUNTIME_DIR}"
    if backend == "cuda":
        return [nvcc(), *NVCC_FLAGS, f"-arch={arch}", include, str(source), "-o", str(output)]
    if backend == "hip":
        return [hipcc(), *HIPCC_FLAGS, f"--offload-arch={arch}", include, str(source), "-o", str(output)]
    raise BackendUnavailable(f"no GPU compiler for backend {backend!r}")


def compile_gpu(text: str, name: str, backend: str, arch: str, *, compile_only: bool = False) -> Path | None:
    """Path of the device code built from ``text`` (built now unless cached); None with ``compile_only``."""
    probe = command(backend, arch, Path("in"), Path("out"))
    suffixes = (".cu", ".cubin") if backend == "cuda" else (".hip", ".hsaco")
    key = [text, _headers_digest(), _version(probe[0]), " ".join(probe[1:]), arch]
    # Debian's hipcc picks the NVIDIA platform when nvcc is installed too; HIP sources target AMD.
    env = {**os.environ, "HIP_PLATFORM": "amd"} if backend == "hip" else None
    directory = Path(tempfile.mkdtemp(prefix="polyfuse-")) if compile_only else cache_dir()
    try:
        return build_cached(text, name, key, suffixes, directory, lambda src, out: command(backend, arch, src, out),
                            env=env, keep=not compile_only)
    finally:
        if compile_only:
            shutil.rmtree(directory, ignore_errors=True)


def _headers_digest() -> str:
    if not (RUNTIME_DIR / "polyfuse_gpu.h").is_file():
        raise BackendUnavailable(f"runtime headers not found in {RUNTIME_DIR} (polyfuse_gpu.h)")
    h = hashlib.sha256()
    for p in sorted(RUNTIME_DIR.glob("*.h")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()
