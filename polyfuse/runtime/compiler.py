"""Compile host C++ with g++ into a shared library, cached on disk.

The cache (:mod:`polyfuse.runtime.cache`: where it lives, verification, locking) names a library
after a hash of the source, the runtime headers, the compiler's version, the flags (so the
:class:`CompileOptions` too) and the CPU the flags target: ``-march=native`` means this CPU, so the
key holds what it expands to (:func:`native_target`), and a cache directory shared by machines with
different CPUs (a network home directory) never hands one a library with instructions it lacks.

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
from dataclasses import dataclass
from pathlib import Path

from polyfuse.errors import BackendUnavailable
from polyfuse.runtime.cache import build_cached, cache_dir

HEADERS_DIR = Path(__file__).resolve().parent / "include"
"""The helper headers generated kernels include (``polyfuse_host.h``, ``polyfuse_gpu.h``): package data of
``polyfuse.runtime``, so an installed wheel finds them next to this module as an editable install does."""

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


@functools.lru_cache(maxsize=4)
def native_target(path: str) -> str:
    """What ``-march=native`` means to the compiler at ``path`` on this machine: the target options it enables
    (``-march=native -Q --help=target``: the CPU name and every instruction set), else the CPU's flags from
    ``/proc/cpuinfo`` (a compiler without ``-Q``), else the machine name.  Asked once per process."""
    probe = subprocess.run([path, "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                           check=False)
    if probe.returncode == 0 and "-march=" in probe.stdout:
        return probe.stdout
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    flags = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    return f"{platform.machine()} {flags}"


def headers_digest(required: str) -> str:
    """A hash of every helper header, part of each kernel's cache key; BackendUnavailable (naming the folder
    and how to repair the installation) if the header ``required`` by a backend is missing."""
    if not (HEADERS_DIR / required).is_file():
        raise BackendUnavailable(f"runtime header {required} not found in {HEADERS_DIR}: this polyfuse installation "
                                 f"is incomplete; reinstall it (pip install --force-reinstall polyfuse)")
    h = hashlib.sha256()
    for p in sorted(HEADERS_DIR.glob("*.h")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def compile_host(source: str, name: str = "kernel", *, options: CompileOptions | None = None) -> Path:
    """Path of the shared library built from ``source`` with ``options`` (default: none asked; built now
    unless cached)."""
    cxx = compiler()
    flags = host_flags(options or CompileOptions())
    key = [source, headers_digest("polyfuse_host.h"), _version(cxx), " ".join(flags), native_target(cxx)]
    built = build_cached(source, name, key, (".cpp", ".so"), cache_dir(),
                         lambda src, out: [cxx, *flags, f"-I{HEADERS_DIR}", str(src), "-o", str(out)])
    assert built is not None
    return built

