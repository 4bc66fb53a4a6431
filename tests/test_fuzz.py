"""The differential fuzzer of issue 20: fuzzed cascades are fused equal to the plain program, or refused.

``test_fuzzed_cascades`` (fast profile, every CI run): hypothesis draws ``FAST_EXAMPLES`` cascades and
schedules (derandomized, so every run checks the same ones; no shrinking, which would cost minutes: a failure
prints its program and steps, and ``fuzz_run.py`` replays it) and checks each with
:func:`polyfuse.differential.check_schedule` through the scheduled program's interpreter and its tile
program, and a C++ kernel for about one in ``CPP_EVERY``.  ``test_fuzzed_cascades_long`` (long profile) runs
``POLYFUSE_FUZZ_EXAMPLES`` seeded cases with every backend and prints the summary (``tests/fuzz_run.py``
does the same from the command line).

``test_corpus`` replays every failure the fuzzer found (``fuzz_corpus/*.json``: the program as builder
Python, the schedule steps, the inputs, the backends to check, the class of issue 20 they showed; ``fuzz_run.py
--save`` writes them).  An entry the code gets wrong when it is recorded may carry that class under ``xfail``
too: a strict xfail, so that the fix shows as XPASS and the key is dropped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz_cascades import HypothesisDraw
from fuzz_run import check_entry, fuzz_case, run, time_limit
from polyfuse.differential import Tally

FAST_EXAMPLES = 100
CPP_EVERY = 10
CASE_SECONDS = 30
"""A case normally takes well under a second; one past this limit is a finding (the repair solver stops itself
after ``repair.SOLVER_SECONDS``)."""
CORPUS = Path(__file__).parent / "fuzz_corpus"
HAVE_GXX = shutil.which("g++") is not None


def _backends(cpp: bool) -> tuple[str, ...]:
    return ("fused", "tile", "cpp") if cpp and HAVE_GXX else ("fused", "tile")


def _failures(case) -> str:
    return "\n\n".join(f"{f.line()}" for f in case.failures) + "\n\nprogram:\n" + str(case.cascade.program) + (
        "\nsteps:\n" + "\n".join(case.scheduled.steps))


@settings(max_examples=FAST_EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
@given(data=st.data(), seed=st.integers(0, 2**16), cpp=st.integers(0, CPP_EVERY - 1))
def test_fuzzed_cascades(data, seed, cpp):
    with time_limit(CASE_SECONDS):
        case = fuzz_case(HypothesisDraw(data), seed, _backends(cpp == CPP_EVERY - 1))
    assert not case.failures, _failures(case)


@pytest.mark.slow
@pytest.mark.skipif("POLYFUSE_FUZZ_EXAMPLES" not in os.environ, reason="set POLYFUSE_FUZZ_EXAMPLES=N to run N cases")
def test_fuzzed_cascades_long():
    tally = Tally()
    failed = [(case.seed, f.line()) for case in run(range(int(os.environ["POLYFUSE_FUZZ_EXAMPLES"])), tally,
                                                     cpp_every=1 if HAVE_GXX else 0) for f in case.failures]
    print(tally.summary())
    assert not failed, "\n".join(f"seed {s}: {line}" for s, line in failed[:20])


# ------------------------------------------------------------------ the regression corpus

def _entries() -> list:
    params = []
    for path in sorted(CORPUS.glob("*.json")):
        entry = json.loads(path.read_text())
        marks = [pytest.mark.xfail(strict=True, reason=entry["xfail"])] if entry.get("xfail") else []
        params.append(pytest.param(entry, id=path.stem, marks=marks))
    return params


@pytest.mark.parametrize("entry", _entries())
def test_corpus(entry):
    with time_limit(CASE_SECONDS):
        failures = check_entry(entry)
    assert not failures, "\n".join(f.line() for f in failures)
