"""The kernel cache (issue 25): where it lives, entries verified and rebuilt, one compiler per entry, the CPU in
the key, ``polyfuse cache``, and :func:`polyfuse.build` returning the kernel it built before."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from polyfuse.cli import main
from polyfuse.cli.stages import Subject
from polyfuse.errors import BackendUnavailable, CacheCorrupt
from polyfuse.pipeline import build
from polyfuse.ops.schedules import default_schedule
from polyfuse.runtime import compiler
from polyfuse.runtime.cache import CACHE_ENV, cache_dir, cache_info, verified

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ on PATH")


def _schedule(name: str = "softmax"):
    subject = Subject.of(name, None, {})
    return subject.schedule(), subject.sizes


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_cache_dir_is_the_environment_variable_else_the_platform_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert cache_dir() == tmp_path / "polyfuse"


def test_the_session_builds_into_a_temporary_cache(kernel_cache):
    assert cache_dir() == kernel_cache and os.environ[CACHE_ENV] == str(kernel_cache)


_BUILD = """
import numpy as np
from polyfuse.pipeline import build
from polyfuse.cli.stages import Subject
subject = Subject.of("logsumexp", None, {})
kernel = build(subject.schedule(), sizes=subject.sizes)
inputs = subject.op.inputs(0, subject.mode, subject.sizes)
ref = subject.op.reference(inputs, subject.mode, subject.sizes)["out"]
assert np.allclose(kernel.run(inputs)["out"], ref, rtol=1e-5)
print(kernel.library)
"""


def _build_in_a_process(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _BUILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finished(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out.strip()


@needs_gxx
def test_a_truncated_or_garbage_library_is_rebuilt_by_the_next_process(tmp_path):
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    library = Path(_finished(_build_in_a_process(env)))
    good = library.read_bytes()
    assert verified(library)
    for damaged in (good[: len(good) // 2], b"", b"garbage " * 100):
        library.write_bytes(damaged)  # what a full disk, a crash or another tool can leave
        assert not verified(library)
        assert Path(_finished(_build_in_a_process(env))) == library  # no SIGBUS, no OSError: built again
        assert verified(library)


_GARBAGE_CXX = """case "$*" in
  *--version*) echo "garbage-c++ 1.0" ;;
  *--help=target*) exit 1 ;;
  *) while [ "$#" -gt 0 ]; do
       if [ "$1" = "-o" ]; then echo "not an ELF file" > "$2"; echo compiled >> "{log}"; fi
       shift
     done ;;
esac
"""


def test_a_library_that_never_loads_raises_naming_the_file_after_one_rebuild(monkeypatch, tmp_path):
    log = tmp_path / "compiles.log"
    cxx = _script(tmp_path / "garbage-c++", _GARBAGE_CXX.format(log=log))
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    sch, sizes = _schedule()
    with pytest.raises(CacheCorrupt, match=r"cached kernel .*/polyfuse_softmax-[0-9a-f]{24}\.so cannot be loaded "
                                           r"even after it was rebuilt"):
        build(sch, sizes=sizes)
    assert log.read_text().splitlines() == ["compiled", "compiled"]
    assert cache_info().entries == 0  # the broken entry is not left for the next process


_SLOW_CXX = """case "$*" in
  *" -o "*) echo "$$" >> "{log}"; sleep 3 ;;
esac
exec g++ "$@"
"""


@needs_gxx
def test_two_processes_missing_the_same_kernel_compile_it_once(tmp_path):
    log = tmp_path / "compiles.log"
    # A compiler slow enough that the second process asks for the kernel while the first still builds it.
    cxx = _script(tmp_path / "slow-c++", _SLOW_CXX.format(log=log))
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "CXX": str(cxx)}
    procs = [_build_in_a_process(env) for _ in range(2)]
    libraries = {_finished(p) for p in procs}
    assert len(libraries) == 1 and Path(libraries.pop()).parent == tmp_path / "cache"
    assert len(log.read_text().splitlines()) == 1
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == []


@needs_gxx
def test_the_host_key_holds_what_march_native_means_here(monkeypatch):
    target = compiler.native_target(compiler.compiler())
    assert "-march=" in target and "[enabled]" in target
    first = compiler.compile_host(_SOURCE, "probe")
    monkeypatch.setattr(compiler, "native_target", lambda path: "another CPU")
    assert compiler.compile_host(_SOURCE, "probe") != first


_SOURCE = '#include <cstdint>\nextern "C" int polyfuse_probe(void* const*, const int64_t*) { return 0; }\n'


def test_missing_headers_are_reported_with_their_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(compiler, "HEADERS_DIR", tmp_path)
    with pytest.raises(BackendUnavailable, match=rf"runtime header polyfuse_host.h not found in {tmp_path}: this "
                                                 r"polyfuse installation is incomplete"):
        compiler.compile_host(_SOURCE, "probe")


def test_the_headers_are_package_data():
    import polyfuse

    assert compiler.HEADERS_DIR.parent.parent == Path(polyfuse.__file__).parent
    assert {"polyfuse_host.h", "polyfuse_gpu.h", "polyfuse_numpy.h", "polyfuse_round.h"} <= {p.name for p in
                                                                       compiler.HEADERS_DIR.glob("*.h")}


@needs_gxx
def test_cache_info_and_clear(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    compiler.compile_host(_SOURCE, "probe")
    (tmp_path / "notes.txt").write_text("not the cache's")
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [f"directory: {tmp_path}", "kernels: 1"]
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out == f"removed 1 kernel(s) from {tmp_path}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert main(["cache", "info"]) == 0 and "kernels: 0" in capsys.readouterr().out


@needs_gxx
def test_build_returns_the_kernel_it_built_for_an_equal_program():
    sch, sizes = _schedule()
    kernel = build(sch, sizes=sizes)
    assert build(sch, sizes=sizes) is kernel
    subject = Subject.of("softmax", None, {})
    fresh = default_schedule("softmax", subject.mode, subject.op.program(subject.mode, **sizes))
    assert fresh is not sch and build(fresh, sizes=sizes) is kernel  # another, equal, schedule
    assert build(sch, sizes=sizes, fp_contract=True) is not kernel
    assert build(sch.program, sizes=sizes) is kernel


def test_build_for_cuda_without_a_driver_is_backend_unavailable(monkeypatch):
    from polyfuse.runtime import loaders

    class DynamicLibNotFoundError(RuntimeError):
        """What cuda.pathfinder raises where libcuda.so cannot be found."""

    def cu_init(flags):
        raise DynamicLibNotFoundError("Failure finding libcuda.so")

    driver = types.SimpleNamespace(cuInit=cu_init)
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", types.SimpleNamespace(driver=driver))
    loaders._loader.cache_clear()
    try:
        sch, sizes = _schedule()
        with pytest.raises(BackendUnavailable, match=r"cuda-python cannot load the CUDA driver "
                                                     r"\(DynamicLibNotFoundError: Failure finding libcuda.so\)"):
            build(sch, "cuda", sizes=sizes, loader="cuda-python")
    finally:
        loaders._loader.cache_clear()


def test_an_entry_is_written_with_its_hash_and_a_compile_only_build_leaves_nothing(tmp_path):
    from polyfuse.runtime.cache import build_cached

    def copy(src: Path, out: Path) -> list[str]:
        return ["cp", str(src), str(out)]

    entry = build_cached("text", "copy", ["key"], (".txt", ".so"), tmp_path, copy)
    assert entry is not None and entry.read_text() == "text" and verified(entry)
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.name, entry.name + ".lock", entry.name + ".sha256"]
    scratch = tmp_path / "scratch"
    assert build_cached("text", "copy", ["key"], (".txt", ".so"), scratch, copy, keep=False) is None
    assert list(scratch.iterdir()) == []
