"""Compile generated CUDA (nvcc) and HIP (hipcc) sources into device code, cached on disk.

CUDA sources become cubins for one architecture (``sm_90a`` on the H200; the runtime asks the
device for its own), HIP sources code objects for one ``--offload-arch``.  The cache is the host
backend's (:mod:`polyfuse.runtime.cache`: verified on load, one compiler per entry under a
file lock), keyed by the source, the runtime headers, the compiler's version and the flags.
``compile_only`` writes nothing to the cache and only checks that the source compiles, the path
CI takes on machines with a compiler and no GPU.

As on the host (:mod:`polyfuse.runtime.compiler`), no flag may change a result unless
:class:`~polyfuse.runtime.compiler.CompileOptions` asks: nvcc contracts multiply-adds into FMAs
by default (``-fmad=true``) and clang does for HIP (``-ffp-contract=fast``), so without
``fp_contract`` they get ``-fmad=false`` and ``-ffp-contract=off``.  nvcc's other defaults are
IEEE already (``-ftz=false -prec-div=true -prec-sqrt=true``; no ``-use_fast_math``).  The
approximate exp (``pf::exp_fast``) of 16-bit-output programs is a choice of the CUDA emitter, written in the
source (the ``fast_exp`` option of :class:`polyfuse.emit_cpp.options.CodegenOptions`), not a flag.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from polyfuse.errors import BackendUnavailable
from polyfuse.runtime.cache import build_cached, cache_dir
from polyfuse.runtime.compiler import HEADERS_DIR, CompileOptions, headers_digest

SPILLS = "-Xptxas=-warn-spills"
NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", SPILLS)
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


def command(backend: str, arch: str, source: Path, output: Path, options: CompileOptions | None = None) -> list[str]:
    """The compiler command line for ``backend`` (``cuda`` or ``hip``) with ``options`` (default: none asked)."""
    options = options or CompileOptions()
    include = f"-I{HEADERS_DIR}"
    if backend == "cuda":
        # With werror every warning of the front end, the host compiler and ptxas is an error, except the
        # register spills of -warn-spills: they are a performance report, not a fault of the source.
        strict = (*(f for f in NVCC_FLAGS if f != SPILLS), "-Werror", "all-warnings")
        flags = (*(strict if options.werror else NVCC_FLAGS), f"-fmad={'true' if options.fp_contract else 'false'}")
        return [nvcc(), *flags, f"-arch={arch}", include, str(source), "-o", str(output)]
    if backend == "hip":
        flags = (*HIPCC_FLAGS, f"-ffp-contract={'fast' if options.fp_contract else 'off'}",
                 *(("-Werror",) if options.werror else ()))
        return [hipcc(), *flags, f"--offload-arch={arch}", include, str(source), "-o", str(output)]
    raise BackendUnavailable(f"no GPU compiler for backend {backend!r}")


def compile_gpu(text: str, name: str, backend: str, arch: str, *, options: CompileOptions | None = None,
                compile_only: bool = False) -> Path | None:
    """Path of the device code built from ``text`` with ``options`` (built now unless cached); None with
    ``compile_only``."""
    probe = command(backend, arch, Path("in"), Path("out"), options)
    suffixes = (".cu", ".cubin") if backend == "cuda" else (".hip", ".hsaco")
    key = [text, headers_digest("polyfuse_gpu.h"), _version(probe[0]), " ".join(probe[1:]), arch]
    # Debian's hipcc picks the NVIDIA platform when nvcc is installed too; HIP sources target AMD.
    env = {**os.environ, "HIP_PLATFORM": "amd"} if backend == "hip" else None
    directory = Path(tempfile.mkdtemp(prefix="polyfuse-")) if compile_only else cache_dir()
    try:
        return build_cached(text, name, key, suffixes, directory,
                            lambda src, out: command(backend, arch, src, out, options), env=env, keep=not compile_only)
    finally:
        if compile_only:
            shutil.rmtree(directory, ignore_errors=True)

