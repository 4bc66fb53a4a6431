"""``polyfuse dump`` on a user's own file, and the inputs ``check`` refuses (issue 25): every user error exits 3
with one line naming the problem, usage errors exit 2."""

from __future__ import annotations

import re

import pytest

from polyfuse import ops
from polyfuse.cli import main
from polyfuse.ir.printer import program_from_source

SCHEDULE = """from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
{extra}

def main():
    program = ops.get('softmax').program('default', N=4, M=64)
    return default_schedule('softmax', 'default', program)


def plain():
    return ops.get('softmax').program('default', N=4, M=64)
"""


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(SCHEDULE.format(extra=""))
    return path


def test_plain_is_the_program_as_written_and_fused_the_scheduled_one(capsys, mine):
    code, plain, err = cli(capsys, "dump", str(mine), "--stage", "plain")
    assert code == 0, err
    assert program_from_source(plain) == ops.get("softmax").program("default", N=4, M=64)
    code, fused, err = cli(capsys, "dump", str(mine), "--stage", "fused")
    assert code == 0, err
    assert fused != plain and fused.startswith("# the plain program after its schedule\n#   sch.")
    code, _, err = cli(capsys, "dump", f"{mine}:plain", "--stage", "fused")
    assert code == 3 and err.count("\n") == 1 and "returned a Program, not a Schedule, so it has no fused stage" in err


@pytest.mark.parametrize(("stage", "first"), [("cpp", '#include "polyfuse_host.h"'),
                                              ("cuda", '#include "polyfuse_gpu.h"'),
                                              ("hip", '#include "polyfuse_gpu.h"')])
def test_a_source_stage_is_its_own_target(capsys, mine, stage, first):
    code, out, err = cli(capsys, "dump", str(mine), "--stage", stage)
    assert code == 0, err
    assert out.startswith(first) and (stage != "cpp" or "__global__" not in out)


def test_a_target_that_contradicts_the_stage_exits_3(capsys, mine):
    code, out, err = cli(capsys, "dump", str(mine), "--target", "cuda", "--stage", "cpp")
    assert (code, out) == (3, "")
    assert err == ("polyfuse: error: --stage cpp is the cpp source, --target cuda another backend's; leave --target "
                   "out or ask for --stage cuda\n")
    code, _, err = cli(capsys, "dump", str(mine), "--target", "cpp", "--stage", "plain")
    assert code == 3 and "a loop program has no target" in err


def test_the_default_target_is_cuda(capsys, mine):
    code, out, err = cli(capsys, "dump", str(mine))
    assert code == 0, err
    assert out.index("# program") < out.index("# tile program") < out.index("# kernel plan") < out.index("__global__")


@pytest.mark.parametrize("option", [("--set", "N=8"), ("--mode", "prefill"), ("--seed", "3")])
def test_options_dump_would_ignore_are_usage_errors(capsys, mine, option):
    code, _, err = cli(capsys, "dump", str(mine), *option)
    assert code == 3 and f"unrecognized arguments: {' '.join(option)}" in err


def test_the_files_folder_is_on_sys_path(capsys, tmp_path):
    (tmp_path / "helpers_i25.py").write_text("SIZES = dict(N=4, M=64)\n")
    path = tmp_path / "uses_helpers.py"
    path.write_text(SCHEDULE.format(extra="from helpers_i25 import SIZES").replace("N=4, M=64", "**SIZES"))
    code, out, err = cli(capsys, "dump", str(path), "--stage", "plain")
    assert code == 0, err
    assert program_from_source(out) == ops.get("softmax").program("default", N=4, M=64)


@pytest.mark.parametrize(("body", "message"), [
    ("def main():\n    return 1 / 0\n", r"dump: {path}:2: ZeroDivisionError: division by zero"),
    ("import no_such_module_i25\n", r"dump: {path}:1: ModuleNotFoundError: No module named 'no_such_module_i25'"),
    ("def main(:\n", r"dump: {path}:1: SyntaxError: "),
    ("def main():\n    return 42\n", r"dump: main\(\) in {path} returned a int; it must return a Program or a "
                                     r"Schedule"),
])
def test_an_error_in_the_users_file_is_one_line_and_exit_3(capsys, tmp_path, body, message):
    path = tmp_path / "broken.py"
    path.write_text(body)
    code, out, err = cli(capsys, "dump", str(path))
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and err.startswith("polyfuse: error: ")
    assert re.search(message.format(path=re.escape(str(path))), err), err


def test_debug_shows_the_users_traceback(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def main():\n    return 1 / 0\n")
    code, _, err = cli(capsys, "dump", str(path), "--debug")
    assert code == 3 and "Traceback" in err and "return 1 / 0" in err


@pytest.mark.parametrize(("magnitude", "message"), [
    ("nan", "magnitude nan is not finite: every input would be inf or NaN and the check would compare NaN with NaN"),
    ("inf", "magnitude inf is not finite: every input would be inf or NaN and the check would compare NaN with NaN"),
    ("1e39", "magnitude 1e+39 overflows input 'inp' of softmax (f32, largest finite 3.4028e+38): every nonzero "
             "entry would be inf; give at most 3.4028e+38"),
])
def test_check_refuses_a_magnitude_that_would_compare_nan_with_nan(capsys, magnitude, message):
    code, out, err = cli(capsys, "check", "softmax", "--magnitude", magnitude)
    assert (code, out) == (3, "")
    assert err.count("\n") == 1 and err.startswith(f"polyfuse: error: {message}")


def test_check_refuses_a_magnitude_beyond_a_16_bit_input(capsys):
    code, _, err = cli(capsys, "check", "attn_global", "--magnitude", "1e5")
    assert code == 3 and "overflows input 'q' of attn_global (f16, largest finite 65504)" in err


def test_a_huge_finite_magnitude_is_still_checked(capsys):
    code, out, err = cli(capsys, "check", "softmax", "--magnitude", "1e30")
    assert code in (0, 1), err
    assert out.splitlines()[-1].endswith(("OK", "FAIL"))


def test_demo_refuses_a_bad_magnitude_before_running(capsys):
    code, out, err = cli(capsys, "demo", "--magnitude", "nan")
    assert (code, out) == (3, "") and "magnitude nan is not finite" in err
