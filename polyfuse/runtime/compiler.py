"""Compile host C++ with g++ into a shared library, cached on disk.

The cache lives in ``$XDG_CACHE_HOME/polyfuse`` (``~/.cache/polyfuse`` by default); a library's
name is a hash of the source, the runtime headers, the compiler's version and the flags (so the
:class:`CompileOptions` too), so a change to any of them builds anew.  Several processes may build
one kernel at once: each compiles into its own temporary file in the cache directory and renames it
into place with ``os.replace`` (atomic), so a reader sees either no library or a complete one.

A kernel computes what the interpreters compute, operation by operation, so no flag may change a
result.  Each flag of ``FLAGS`` and why it cannot:

* ``-O3 -march=native``: without ``-ffast-math`` GCC keeps IEEE semantics (no reassociation, no
  flush to zero, NaN and inf kept, vector ``sqrt`` and ``/`` correctly rounded); the only
  value-changing freedom it takes by default is contraction of ``a*b + c`` into an FMA (one
  rounding fewer), which ``-ffp-contract=off`` removes unless :attr:`CompileOptions.fp_contract`
  asks for it.
* ``-fno-math-errno``: math functions need not set ``errno``, which nothing reads; their values are
  unchanged (``sqrt`` becomes the correctly rounded instruction instead of a call that also sets it).
* ``-fno-trapping-math``: floating-point operations are assumed not to trap, so both values of a
  select may be computed and blended (vectorized).  IEEE results are the same; only the exception
  flags, which nothing reads, may differ.  (clang's default already.)
* ``-fopenmp``: parallel loops run iterations that touch disjoint memory, each in program order.
* ``-Wall -Wextra``: generated code must be warning-free; a warning is surfaced as a
  :class:`~polyfuse.errors.CompilerWarning` when the library is built (a cached one is not built
  again), or is an error with :attr:`CompileOptions.werror`.
* ``-Wno-array-bounds``: every access is proven in bounds with ISL before a kernel is emitted
  (:mod:`polyfuse.deps.bounds`); g++'s own check runs after unrolling and cannot follow a guard
  held in a temporary, so all it adds is false alarms.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from polyfuse.errors import BackendUnavailable, CompilerWarning, InternalError

RUNTIME_DIR = Path(__file__).resolve().parent.parent.parent / "runtime"
"""The helper headers (``polyfuse_host.h``), found relative to the package (editable install)."""

FLAGS = ("-std=c++17", "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
         "-shared", "-fPIC", "-Wall", "-Wextra", "-Wno-array-bounds")
"""The flags of every host build (see the module docstring for why none changes a result)."""


@dataclass(frozen=True)
class CompileOptions:
    """How generated source is compiled, on every backend; part of each kernel's cache key.

    ``fp_contract``: the compiler may contract a multiply and an add into one fused multiply-add,
    which rounds once instead of twice.  Off by default: then a kernel rounds where the interpreters
    round, and ``a*b - c*d`` with ``a*b == c*d`` is exactly 0 as in NumPy (contracted, it is the
    rounding error of ``c*d``).  The catalog's GPU checks and benchmarks ask for it; their tolerances
    cover it (the error model in :mod:`polyfuse.ops.softmax`).
    ``werror``: compiler warnings are errors (the tests build so); without it they are surfaced as a
    :class:`~polyfuse.errors.CompilerWarning`.
    """

    fp_contract: bool = False
    werror: bool = False


def host_flags(options: CompileOptions) -> tuple[str, ...]:
    """``FLAGS`` with the contraction and warning flags ``options`` ask for."""
    contract = "-ffp-contract=fast" if options.fp_contract else "-ffp-contract=off"
    return (*FLAGS, contract, *(("-Werror",) if options.werror else ()))


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/polyfuse``, or ``~/.cache/polyfuse``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "polyfuse"


def compiler() -> str:
    """The C++ compiler: ``$CXX`` when set, else ``g++`` (BackendUnavailable if missing)."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise BackendUnavailable(f"the host C++ backend needs a C++ compiler; {name!r} is not on PATH")
    return path


@functools.lru_cache(maxsize=4)
def _version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else path


def _headers_digest() -> str:
    if not (RUNTIME_DIR / "polyfuse_host.h").is_file():
        raise BackendUnavailable(f"runtime headers not found in {RUNTIME_DIR} (polyfuse_host.h)")
    h = hashlib.sha256()
    for p in sorted(RUNTIME_DIR.glob("*.h")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def compile_host(source: str, name: str = "kernel", *, options: CompileOptions | None = None) -> Path:
    """Path of the shared library built from ``source`` with ``options`` (default: none asked; built now
    unless cached)."""
    cxx = compiler()
    flags = host_flags(options or CompileOptions())
    key = [source, _headers_digest(), _version(cxx), " ".join(flags), platform.machine()]
    built = build_cached(source, name, key, (".cpp", ".so"), cache_dir(),
                         lambda src, out: [cxx, *flags, f"-I{RUNTIME_DIR}", str(src), "-o", str(out)])
    assert built is not None
    return built


def build_cached(source: str, name: str, key: list[str], suffixes: tuple[str, str], directory: Path,
                 command: Callable[[Path, Path], list[str]], *, env: Mapping[str, str] | None = None,
                 keep: bool = True) -> Path | None:
    """Compile ``source`` with ``command(source_path, output_path)`` into ``directory``, once per ``key``.

    The output is named after a hash of ``key`` and written to a temporary file first, then
    renamed into place (atomic), so concurrent builds of one kernel are safe.  With ``keep``
    false the output is deleted (a compile-only check) and None is returned.
    """
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}-{digest}{suffixes[1]}"
    if keep and out.exists():
        return out
    fd, tmp_src = tempfile.mkstemp(suffix=suffixes[0], prefix=f".{name}-", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_out = tmp_src[: -len(suffixes[0])] + suffixes[1]
    try:
        cmd = command(Path(tmp_src), Path(tmp_out))
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            raise InternalError(f"{Path(cmd[0]).name} failed on the generated kernel {name!r} (a polyfuse bug):\n"
                                f"{done.stderr[-4000:]}")
        if done.stderr.strip():
            warnings.warn(CompilerWarning(f"{Path(cmd[0]).name} warned on the generated kernel {name!r} (it was "
                                          f"built):\n{done.stderr[-4000:]}"), stacklevel=3)
        if not keep:
            return None
        os.replace(tmp_out, out)
    finally:
        for p in (tmp_src, tmp_out):
            if os.path.exists(p):
                os.unlink(p)
    return out
