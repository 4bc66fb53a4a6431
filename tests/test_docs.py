"""The documentation against the code (issue 25): the Python blocks of docs/writing-programs.md and of the README
run, the operator catalog page lists the catalog, the CLI page lists every command and exit status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polyfuse import ops
from polyfuse.cli import build_parser
from polyfuse.cli import commands as commands_module

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("page", [DOCS / "writing-programs.md", ROOT / "README.md"], ids=lambda p: p.name)
def test_the_python_blocks_of_a_page_run_in_order(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python blocks"
    monkeypatch.chdir(tmp_path)  # the page writes its example file here
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{page.name}, block {number}", "exec"), namespace)


def test_the_operator_page_lists_the_catalog():
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", (DOCS / "operators.md").read_text(), flags=re.M)
    assert sorted(listed) == sorted(ops.names())


def test_the_cli_page_documents_every_command_and_exit_status():
    text = (DOCS / "cli.md").read_text()
    commands = build_parser()._subparsers._group_actions[0].choices
    assert sorted(re.findall(r"^\| `polyfuse ([a-z]+)", text, flags=re.M)) == sorted(commands)
    statuses = sorted({value for name, value in vars(commands_module).items() if name.startswith("EXIT_")})
    assert re.findall(r"^\| ([0-9]) \|", text, flags=re.M) == [str(s) for s in statuses]


def test_the_readme_points_at_the_docs():
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/cli.md", "docs/operators.md", "docs/api.md", "docs/writing-programs.md"):
        assert page in readme and (ROOT / page).is_file()
    assert not re.search(r"(?<!docs/)\b(CLI|OPERATORS)\.md", readme)
