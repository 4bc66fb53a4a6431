"""The on-disk cache of compiled kernels: one artifact per key, written once, verified on every load.

The directory is ``$POLYFUSE_CACHE_DIR``, else the platform's user cache directory
(``platformdirs``: ``$XDG_CACHE_HOME/polyfuse`` or ``~/.cache/polyfuse`` on Linux).  An entry is
``NAME-DIGEST.SUFFIX`` (a shared library, cubin or code object; ``DIGEST`` hashes the key: source,
headers, compiler, flags, CPU) with ``NAME-DIGEST.SUFFIX.sha256`` beside it, the hash of its bytes.

Why each part:

* **Written atomically.**  The compiler writes a temporary file in the same directory, which is
  hashed, then the hash and the artifact are renamed into place (``os.replace``); a reader sees no
  entry or a complete one, never a half-written file.
* **Verified on load.**  A file cut short or overwritten (a full disk, a crash of another tool, a
  hand edit) would otherwise be mapped by ``dlopen`` and kill the process with SIGBUS, or raise a
  bare ``OSError``.  An entry whose bytes do not match its hash is removed and built again.
* **One compiler per entry.**  A file lock (``NAME-DIGEST.SUFFIX.lock``, ``filelock``) serialises
  the processes that miss the same entry: the first compiles, the others wait and load its result.
* **Rebuilt once.**  :func:`load_rebuilding` removes an entry that verifies but still fails to
  load and builds it again; a second failure is a :class:`~polyfuse.errors.CacheCorrupt` naming
  the file, because building again would only repeat it.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import platformdirs
from filelock import FileLock

from polyfuse.errors import CacheCorrupt, CompilerWarning, InternalError

CACHE_ENV = "POLYFUSE_CACHE_DIR"
"""The environment variable that moves the cache (the tests point it at a temporary directory)."""

ENTRY = re.compile(r"^[A-Za-z0-9_]+-[0-9a-f]{24}\.(so|cubin|hsaco)(\.sha256|\.lock)?$")
"""What the cache writes (entries, their hashes, their locks); ``clear`` removes these names and no others, so a
cache directory pointed at a folder holding other files loses nothing else."""

T = TypeVar("T")


def cache_dir() -> Path:
    """``$POLYFUSE_CACHE_DIR``, else the platform's user cache directory for polyfuse."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path(platformdirs.user_cache_dir("polyfuse", appauthor=False))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hash_file(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + ".sha256")


def verified(artifact: Path) -> bool:
    """Whether ``artifact`` exists and its bytes are those its hash file records."""
    try:
        return _hash_file(artifact).read_text().strip() == _digest(artifact)
    except OSError:
        return False


def remove_entry(artifact: Path) -> None:
    """Remove ``artifact`` and its hash (not its lock, which another process may hold)."""
    for path in (artifact, _hash_file(artifact)):
        path.unlink(missing_ok=True)


def build_cached(source: str, name: str, key: list[str], suffixes: tuple[str, str], directory: Path,
                 command: Callable[[Path, Path], list[str]], *, env: Mapping[str, str] | None = None,
                 keep: bool = True) -> Path | None:
    """Compile ``source`` with ``command(source_path, output_path)`` into ``directory``, once per ``key``.

    The entry is named after a hash of ``key``; a verified entry is returned as it is, anything else
    (absent, cut short, overwritten) is built under the entry's lock.  With ``keep`` false the output is
    deleted (a compile-only check) and None is returned.
    """
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name}-{digest}{suffixes[1]}"
    if not keep:
        _compile(source, name, suffixes, directory, command, env).unlink()
        return None
    if verified(out):
        return out
    with FileLock(out.with_name(out.name + ".lock")):
        if verified(out):  # built by another process while this one waited for the lock
            return out
        remove_entry(out)
        built = _compile(source, name, suffixes, directory, command, env)
        hash_tmp = built.with_name(built.name + ".sha256")
        hash_tmp.write_text(_digest(built) + "\n")
        os.replace(hash_tmp, _hash_file(out))
        os.replace(built, out)
    return out


def _compile(source: str, name: str, suffixes: tuple[str, str], directory: Path,
             command: Callable[[Path, Path], list[str]], env: Mapping[str, str] | None) -> Path:
    """The temporary output of compiling ``source`` in ``directory`` (removed again if compiling fails)."""
    fd, tmp_src = tempfile.mkstemp(suffix=suffixes[0], prefix=f".{name}-", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_out = Path(tmp_src[: -len(suffixes[0])] + suffixes[1])
    try:
        cmd = command(Path(tmp_src), tmp_out)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            raise InternalError(f"{Path(cmd[0]).name} failed on the generated kernel {name!r} (a polyfuse bug):\n"
                                f"{done.stderr[-4000:]}")
        if done.stderr.strip():
            warnings.warn(CompilerWarning(f"{Path(cmd[0]).name} warned on the generated kernel {name!r} (it was "
                                          f"built):\n{done.stderr[-4000:]}"), stacklevel=4)
        return tmp_out
    except BaseException:
        tmp_out.unlink(missing_ok=True)
        raise
    finally:
        os.unlink(tmp_src)


def load_rebuilding(build: Callable[[], Path], load: Callable[[Path], T]) -> T:
    """``load(build())``; if loading fails with ``OSError``, the entry is removed and built and loaded once
    more, and a second failure raises :class:`~polyfuse.errors.CacheCorrupt` naming the file."""
    artifact = build()
    try:
        return load(artifact)
    except OSError:
        remove_entry(artifact)
    artifact = build()
    try:
        return load(artifact)
    except OSError as err:
        remove_entry(artifact)
        raise CacheCorrupt(f"cached kernel {artifact} cannot be loaded even after it was rebuilt ({err}); "
                           f"check the compiler ($CXX) and the disk, or clear the cache (polyfuse cache clear)"
                           ) from None


@dataclass(frozen=True)
class CacheInfo:
    """What the cache holds: its directory, the number of compiled kernels and the bytes of every file."""

    directory: Path
    entries: int
    size: int

    def __str__(self) -> str:
        return f"directory: {self.directory}\nkernels: {self.entries}\nsize: {self.size / 1024:.0f} KiB"


def _files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if p.is_file() and ENTRY.match(p.name)]


def cache_info(directory: Path | None = None) -> CacheInfo:
    """The cache at ``directory`` (default :func:`cache_dir`)."""
    directory = directory or cache_dir()
    files = _files(directory)
    entries = sum(1 for p in files if not p.name.endswith((".sha256", ".lock")))
    return CacheInfo(directory, entries, sum(p.stat().st_size for p in files))


def clear_cache(directory: Path | None = None) -> int:
    """Remove every cache file in ``directory`` (default :func:`cache_dir`); the number of kernels removed."""
    directory = directory or cache_dir()
    removed = cache_info(directory).entries
    for path in _files(directory):
        path.unlink(missing_ok=True)
    return removed
