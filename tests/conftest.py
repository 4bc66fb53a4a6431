"""Test set-up shared by every test module.

Markers (registered in pyproject.toml): ``gpu`` tests are skipped when no CUDA GPU is
visible, ``nvcc`` tests when ``nvcc`` is not on PATH; ``slow`` only labels.

Every kernel the tests build goes to a temporary cache (``POLYFUSE_CACHE_DIR``, inherited by the
processes tests start), never the user's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polyfuse.runtime.cache import CACHE_ENV

from polyfuse.cli.devices import cuda_gpu_count, nvcc_path

# marker -> (is the machine able to run it?, why it is skipped otherwise)
REQUIREMENTS = {
    "gpu": (lambda: cuda_gpu_count() > 0, "needs a CUDA GPU; none is visible (nvidia-smi -L, cuda-python)"),
    "nvcc": (lambda: nvcc_path() is not None, "needs nvcc on PATH"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, (available, reason) in REQUIREMENTS.items():
        marked = [item for item in items if item.get_closest_marker(marker)]
        if marked and not available():
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's kernel cache directory."""
    directory = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(directory))
        yield directory
