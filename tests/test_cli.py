"""The ``polyfuse`` command against its contract (CLI.md).

Most tests call ``polyfuse.cli.main(argv)`` in-process; a few run the installed console
script and ``python -m polyfuse``.  Tests over operators are parametrized by the catalog,
so they grow with it (and are skipped while it is empty).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import polyfuse.cli.demo
import polyfuse.cli.stages
import polyfuse.deps
import polyfuse.pipeline
from polyfuse import ops
from polyfuse.cli import main
from polyfuse.cli.demo import DEMO_OPERATORS
from polyfuse.cli.stages import BACKEND_NAMES, BACKENDS, STAGE_NAMES, STAGES
from polyfuse.errors import BackendUnavailable, InternalError
from polyfuse.ir.printer import program_from_source
from polyfuse.runtime.cache import CACHE_ENV, cache_info

ROOT = Path(__file__).resolve().parents[1]
RESULT_LINE = re.compile(r"^max_abs_err=\S+ max_rel_err=\S+ tol=\S+ (OK|FAIL)$")
OPERATORS = ops.names()
EMPTY_CATALOG = pytest.param(None, None, marks=pytest.mark.skip(reason="the operator catalog is empty"))


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``polyfuse ARGV``."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def operator_modes() -> list:
    cases = [pytest.param(n, m, id=f"{n}-{m}") for n in OPERATORS for m in ops.get(n).modes]
    return cases or [EMPTY_CATALOG]


def operator_magnitudes() -> list:
    cases = [pytest.param(n, x, id=f"{n}-{x:g}") for n in OPERATORS for x in ops.get(n).magnitudes]
    return cases or [EMPTY_CATALOG]


def first_operator() -> str:
    if not OPERATORS:
        pytest.skip("the operator catalog is empty")
    return OPERATORS[0]


# ------------------------------------------------------------------ catalog and show
def test_catalog_lists_every_operator_once_with_a_description(capsys):
    code, out, _ = cli(capsys, "catalog")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == OPERATORS
    for name, line in zip(OPERATORS, lines, strict=True):
        assert line[len(name):].strip() == ops.get(name).description


@pytest.mark.parametrize(("name", "mode"), operator_modes())
def test_show_plain_prints_python_that_rebuilds_the_program(capsys, name, mode):
    code, out, err = cli(capsys, "show", name, "--stage", "plain", "--mode", mode)
    assert code == 0, err
    assert program_from_source(out) == ops.get(name).program(mode)


def test_show_defaults_to_the_plain_stage(capsys):
    name = first_operator()
    assert cli(capsys, "show", name) == cli(capsys, "show", name, "--stage", "plain")


def test_show_plan_prints_the_gpu_kernel_plan(capsys):
    code, out, err = cli(capsys, "show", "attn_causal", "--stage", "plan")
    assert code == 0, err
    assert "the kernel plan (cuda, sm_90a)" in out and "kernel polyfuse_attn_causal_k0 (block)" in out
    assert "mma.sync.m16n8k16" in out and "shared memory:" in out
    code, out, err = cli(capsys, "show", "attn_causal", "--stage", "plan", "--target", "hip")
    assert code == 0, err
    assert "(hip, gfx90a)" in out and "256 threads (4 warps of 64)" in out


def test_show_tile_for_a_gpu_target_is_what_its_emitter_lowers(capsys):
    code, host, _ = cli(capsys, "show", "attn_causal", "--stage", "tile")
    assert code == 0 and "# kernel k0" not in host
    code, gpu, err = cli(capsys, "show", "attn_causal", "--stage", "tile", "--target", "cuda")
    assert code == 0, err
    assert "the program the GPU emitter lowers (cuda, sm_90a)" in gpu and "# kernel k0 (cta)" in gpu


@pytest.mark.parametrize(("stage", "target", "message"), [
    ("plan", "cpp", "the cpp backend has no kernel plan"), ("plain", "cuda", "--target applies to --stage tile")])
def test_show_refuses_a_target_that_does_not_apply(capsys, stage, target, message):
    code, _, err = cli(capsys, "show", "attn_causal", "--stage", stage, "--target", target)
    assert code == 3 and message in err


# ------------------------------------------------------------------ check
@pytest.mark.parametrize(("name", "mode"), operator_modes())
def test_check_interp_ends_with_the_comparison_line(capsys, name, mode):
    code, out, err = cli(capsys, "check", name, "--backend", "interp", "--mode", mode)
    last = out.splitlines()[-1]
    assert RESULT_LINE.match(last), out
    assert code == 0 and last.endswith(" OK"), out + err


@pytest.mark.parametrize(("name", "magnitude"), operator_magnitudes())
def test_check_interp_at_each_declared_magnitude(capsys, name, magnitude):
    code, out, err = cli(capsys, "check", name, "--magnitude", str(magnitude))
    assert f"seed=0 magnitude={magnitude:g}" in out.splitlines()[0]
    assert code == 0 and out.splitlines()[-1].endswith(" OK"), out + err


def test_check_applies_seed_and_set_overrides(capsys):
    name = first_operator()
    size, default = next(iter(ops.get(name).sizes().items()))
    code, out, err = cli(capsys, "check", name, "--set", f"{size}={default + 1}", "--seed", "1")
    header = out.splitlines()[0]
    assert f" {size}={default + 1} " in header and " seed=1 " in header
    assert code == 0, out + err


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("argv", [["check", "no_such_op"], ["show", "no_such_op"], ["demo", "--op", "no_such_op"]])
def test_unknown_operator_exits_3_naming_it(capsys, argv):
    code, _, err = cli(capsys, *argv)
    assert code == 3
    assert "no_such_op" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["--debug", "check", "no_such_op"], ["check", "no_such_op", "--debug"]])
def test_debug_shows_the_traceback(capsys, argv):
    code, _, err = cli(capsys, *argv)
    assert code == 3 and "Traceback" in err and "no_such_op" in err


@pytest.mark.parametrize("bad", ["N", "=4", "N=x", "N=1.5", "2N=4"])
def test_malformed_set_is_a_usage_error(capsys, bad):
    code, _, err = cli(capsys, "check", "softmax", "--set", bad)
    assert code == 3 and "argument --set" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("value", ["0", "-3"])
def test_non_positive_size_exits_3(capsys, value):
    name = first_operator()
    size = next(iter(ops.get(name).sizes()))
    code, _, err = cli(capsys, "show", name, "--set", f"{size}={value}")
    assert code == 3 and size in err and name in err


def test_unknown_size_exits_3_naming_it(capsys):
    name = first_operator()
    code, _, err = cli(capsys, "show", name, "--set", "NOT_A_SIZE=4")
    assert code == 3 and "NOT_A_SIZE" in err


def test_unknown_mode_exits_3_naming_the_modes(capsys):
    name = first_operator()
    code, _, err = cli(capsys, "show", name, "--mode", "sideways")
    assert code == 3 and "sideways" in err and ops.get(name).modes[0] in err


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["show", "x", "--stage", "bogus"],
                                  ["check", "x", "--backend", "bogus"]])
def test_usage_errors_exit_3_with_one_line(capsys, argv):
    code, out, err = cli(capsys, *argv)
    assert code == 3 and not out and len(err.strip().splitlines()) == 1, err
    assert err.startswith("polyfuse") and ": error: " in err and "--help`)" in err


def test_help_exits_0(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0 and "catalog" in out and "demo" in out


# ------------------------------------------------------------------ not available yet
def test_stage_and_backend_tables_are_within_the_contract():
    assert set(STAGES) <= set(STAGE_NAMES) and "plain" in STAGES
    assert set(BACKENDS) <= set(BACKEND_NAMES) and "interp" in BACKENDS


@pytest.mark.parametrize("stage", [s for s in STAGE_NAMES if s not in STAGES])
def test_unavailable_stage_exits_4(capsys, stage):
    code, out, err = cli(capsys, "show", "softmax", "--stage", stage)
    assert code == 4 and out == ""
    assert err.strip() == f"polyfuse: stage {stage} is not available yet in this version"


@pytest.mark.parametrize("backend", [b for b in BACKEND_NAMES if b not in BACKENDS])
def test_unavailable_backend_exits_4(capsys, backend):
    code, _, err = cli(capsys, "check", "softmax", "--backend", backend)
    assert code == 4 and f"backend {backend} is not available" in err


def test_dump_prints_the_stages_of_a_users_schedule(capsys, tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("from polyfuse import ops\nfrom polyfuse.ops.schedules import default_schedule\n\n"
                    "def fused():\n    op = ops.get('softmax')\n"
                    "    program = op.program('default', N=4, M=64)\n"
                    "    return default_schedule('softmax', 'default', program, target='cuda')\n")
    code, out, err = cli(capsys, "dump", f"{mine}:fused", "--target", "cuda")
    assert code == 0, err
    assert out.index("# program") < out.index("# tile program") < out.index('extern "C" __global__')
    code, out, _ = cli(capsys, "dump", f"{mine}:fused", "--target", "hip", "--stage", "hip")
    assert code == 0 and out.startswith('#include "polyfuse_gpu.h"') and "for hip (gfx90a)" in out


def test_dump_names_a_missing_file_or_function(capsys, tmp_path):
    code, _, err = cli(capsys, "dump", str(tmp_path / "none.py"), "--target", "cpp")
    assert code == 3 and "no file" in err
    (tmp_path / "empty.py").write_text("x = 1\n")
    code, _, err = cli(capsys, "dump", str(tmp_path / "empty.py"), "--target", "cpp")
    assert code == 3 and "defines no function 'main'" in err


def test_explain_shows_dependences_then_the_fusion(capsys):
    code, out, err = cli(capsys, "explain", "softmax_sum")
    assert code == 0, err
    assert out.startswith(polyfuse.deps.describe(ops.get("softmax_sum").program()).strip())
    assert "rolling_update of 's_sum' over loop 'j'" in out
    assert "h = t*exp(xmax - xmax')" in out
    assert "broken by naive fusion: flow s_max -> s_sum on xmax (temporal)" in out


def test_explain_exits_3_naming_the_failed_repair_condition(capsys):
    code, out, err = cli(capsys, "explain", "quant_gemm_fp8")
    assert code == 3 and "rounding is not invertible" in err


# ------------------------------------------------------------------ demo
def test_demo_runs_the_plain_program_and_checks_it(capsys):
    if not set(DEMO_OPERATORS) & set(OPERATORS):
        pytest.skip(f"none of {DEMO_OPERATORS} is in the catalog yet")
    code, out, err = cli(capsys, "demo")
    assert code == 0, out + err
    assert out.startswith(f"polyfuse demo: {next(n for n in DEMO_OPERATORS if n in OPERATORS)} ")
    assert "== plain program" in out and "from polyfuse.ir import *" in out
    interp = [line for line in out.splitlines() if line.startswith("interp ")]
    assert len(interp) == 1 and " OK " in interp[0] and "wall " in interp[0]
    assert "checks OK" in out.splitlines()[-1]


def test_demo_exits_4_when_a_backend_it_should_run_cannot(capsys, monkeypatch):
    def no_compiler(subject, inputs):
        raise BackendUnavailable("the host C++ backend needs a C++ compiler; 'g++' is not on PATH")

    monkeypatch.setitem(polyfuse.cli.stages.BACKENDS, "cpp", no_compiler)
    code, out, err = cli(capsys, "demo", "--op", "softmax")
    assert code == 4, out + err
    lines = out.splitlines()
    assert "cpp     (the host C++ backend needs a C++ compiler; 'g++' is not on PATH)" in lines
    assert lines[-2] == "not available: cpp backend" and lines[-1].startswith("3/4 checks OK")


def test_a_bug_exits_5_with_its_traceback_and_the_command_line(capsys, monkeypatch):
    def broken(subject, inputs):
        raise InternalError("an invariant did not hold")

    monkeypatch.setitem(polyfuse.cli.stages.BACKENDS, "interp", broken)
    code, out, err = cli(capsys, "check", "softmax")
    assert code == 5, out + err
    assert "Traceback" in err and "InternalError: an invariant did not hold" in err
    assert err.splitlines()[-1].startswith("polyfuse: internal error: a bug in polyfuse")
    assert err.splitlines()[-1].endswith("polyfuse check softmax")


def test_demo_falls_back_to_the_next_operator(capsys, monkeypatch):
    fallback = OPERATORS[-1] if OPERATORS else pytest.skip("the operator catalog is empty")
    monkeypatch.setattr(polyfuse.cli.demo, "DEMO_OPERATORS", ("no_such_op", fallback))
    code, out, err = cli(capsys, "demo")
    assert code == 0, out + err
    assert out.startswith(f"polyfuse demo: {fallback} ")


def test_demo_without_its_operators_says_which_it_needs(capsys, monkeypatch):
    monkeypatch.setattr(polyfuse.cli.demo, "DEMO_OPERATORS", ("no_such_op", "nor_this_one"))
    code, _, err = cli(capsys, "demo")
    assert code == 3 and "no_such_op or nor_this_one" in err


# ------------------------------------------------------------------ as installed
def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_python_dash_m_catalog_matches_in_process(capsys):
    expected = cli(capsys, "catalog")[1]
    proc = run(sys.executable, "-m", "polyfuse", "catalog")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected


def test_console_script_reports_errors_in_one_line():
    script = shutil.which("polyfuse", path=str(Path(sys.executable).parent)) or shutil.which("polyfuse")
    if script is None:
        pytest.skip("the polyfuse console script is not installed (pip install -e .)")
    proc = run(script, "check", "no_such_op")
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "no_such_op" in proc.stderr


def test_console_script_catalog():
    script = shutil.which("polyfuse", path=str(Path(sys.executable).parent)) or shutil.which("polyfuse")
    if script is None:
        pytest.skip("the polyfuse console script is not installed (pip install -e .)")
    proc = run(script, "catalog")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == OPERATORS


@pytest.mark.parametrize(("name", "size", "kernels"), [("softmax", "M", 1), ("rmsnorm_amax", "N", 1),
                                                       ("rmsnorm_amax", "M", 3)])
def test_check_compiles_one_host_kernel_for_every_symbolic_size(capsys, monkeypatch, tmp_path, name, size, kernels):
    """``check --backend cpp`` at three values of a symbolic size compiles one kernel; a static size one each."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(polyfuse.pipeline, "_KERNELS", type(polyfuse.pipeline._KERNELS)())
    for value in (40, 41, 42):
        code, out, _ = cli(capsys, "check", name, "--backend", "cpp", "--set", f"{size}={value}")
        assert code == 0 and out.rstrip().endswith(" OK")
    assert cache_info(tmp_path).entries == kernels
