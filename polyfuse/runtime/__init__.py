"""Compile, cache, load and launch generated kernels (host C++ for now).

* :mod:`polyfuse.runtime.compiler`: g++, keyed by source, headers, compiler version, flags
  (:class:`CompileOptions`: FP contraction, warnings as errors) and the CPU ``-march=native`` targets.
* :mod:`polyfuse.runtime.cache`: the on-disk cache (``$POLYFUSE_CACHE_DIR``): atomic writes,
  entries verified by their hash on load and rebuilt once, a file lock per entry.
* :mod:`polyfuse.runtime.kernel`: the :class:`Kernel` object; arguments are checked before any
  launch and the kernel is called through ctypes with the C ABI documented in
  :mod:`polyfuse.emit_cpp.host` (no Python headers needed, compiles fast).

The helper headers the generated code includes are package data, in ``polyfuse/runtime/include/``.
"""

from polyfuse.runtime.cache import cache_dir
from polyfuse.runtime.compiler import HEADERS_DIR, CompileOptions, compile_host
from polyfuse.runtime.kernel import Kernel

__all__ = ["HEADERS_DIR", "CompileOptions", "Kernel", "cache_dir", "compile_host"]
