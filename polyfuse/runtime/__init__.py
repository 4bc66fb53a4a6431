"""Compile, cache, load and launch generated kernels (host C++ for now).

* :mod:`polyfuse.runtime.compiler`: g++ with an on-disk cache keyed by source, compiler
  version and flags (:class:`CompileOptions`: FP contraction, warnings as errors); concurrent
  builds of one kernel are safe (temp file + atomic rename).
* :mod:`polyfuse.runtime.kernel`: the :class:`Kernel` object; arguments are checked before any
  launch and the kernel is called through ctypes with the C ABI documented in
  :mod:`polyfuse.emit_cpp.host` (no Python headers needed, compiles fast).

The helper headers the generated code includes live in ``runtime/`` at the repository root.
"""

from polyfuse.runtime.compiler import RUNTIME_DIR, CompileOptions, cache_dir, compile_host
from polyfuse.runtime.kernel import Kernel

__all__ = ["RUNTIME_DIR", "CompileOptions", "Kernel", "cache_dir", "compile_host"]
