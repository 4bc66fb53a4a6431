"""The analysis caches: ISL objects built from immutable IR, kept per structural key.

Programs, blocks and expressions are immutable and compare structurally (names
included), so a result cached for one key is right for every equal key: a cache
never hands one program's domains, accesses or dependences to a different one.
Every cache that builds ISL objects from IR goes through :func:`memoized`, so
:func:`clear_caches` empties them all, e.g. to time a cold run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_CACHES: list[Any] = []


def memoized(maxsize: int) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize)``, registered with :func:`clear_caches`."""
    def wrap(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _CACHES.append(cached)
        return cached  # type: ignore[return-value]
    return wrap


def clear_caches() -> None:
    """Forget every cached domain, access relation, schedule and analysis."""
    for cache in _CACHES:
        cache.cache_clear()


__all__ = ["clear_caches", "memoized"]
