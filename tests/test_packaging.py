"""What the package declares (issue 25): every runtime dependency is used, either CUDA loader installs alone, the
headers and py.typed ship as package data, the version is written once. The wheel itself is built, installed
and run from outside the checkout by .ci/run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import polyfuse

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IMPORT_NAMES = {"ml_dtypes": "ml_dtypes", "islpy": "islpy", "numpy": "numpy", "sympy": "sympy",
                "platformdirs": "platformdirs", "filelock": "filelock"}


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("-", "_")


def test_every_runtime_dependency_is_imported_by_the_package():
    sources = "\n".join(p.read_text() for p in (ROOT / "polyfuse").rglob("*.py"))
    for requirement in PROJECT["project"]["dependencies"]:
        module = IMPORT_NAMES[_name(requirement)]
        assert re.search(rf"^\s*(import|from) {module}\b", sources, flags=re.M), f"{requirement} is never imported"


def test_the_cuda_extra_installs_from_wheels_and_pycuda_is_its_own():
    extras = {name: [_name(r) for r in reqs] for name, reqs in PROJECT["project"]["optional-dependencies"].items()}
    assert extras["cuda"] == ["cuda_python"] and extras["pycuda"] == ["pycuda"]
    assert {"test", "hip", "bench", "dev"} <= set(extras)


def test_headers_and_py_typed_are_package_data_and_the_version_is_written_once():
    data = PROJECT["tool"]["setuptools"]["package-data"]
    assert "include/*.h" in data["polyfuse.runtime"] and "py.typed" in data["polyfuse"]
    assert (ROOT / "polyfuse" / "py.typed").is_file() and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "version" not in PROJECT["project"] and PROJECT["project"]["dynamic"] == ["version"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "polyfuse.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", polyfuse.__version__)
