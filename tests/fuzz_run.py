"""Run the differential fuzzer: ``python tests/fuzz_run.py -n 1000 [--seed S] [--cpp-every K] [--save DIR]``,
or re-check corpus entries: ``python tests/fuzz_run.py --replay tests/fuzz_corpus/*.json [--verbose]``.

Case ``k`` is drawn from ``RandomDraw(seed + k)``, so ``--seed S+k -n 1`` replays it.  Prints a summary
(programs, fused, refused by reason, wrong, crashed, the fusion fraction) and, with ``--save``, writes
each failing case as a corpus entry (``fuzz_corpus``) to DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fuzz_cascades import Cascade, Draw, RandomDraw, cascade, inputs
from fuzz_schedules import Scheduled, replay, schedule
from polyfuse.differential import CRASH, REFUSED, WRONG, Finding, Report, Tally, check_schedule
from polyfuse.ir import Program

INPUT_SETS = 2


@dataclass
class Case:
    """One fuzzed program, its schedule, inputs and the check's report (None where nothing was applied)."""

    seed: int
    cascade: Cascade
    scheduled: Scheduled
    inputs: list[dict[str, np.ndarray]]
    sizes: list[dict[str, int] | None]
    report: Report | None

    @property
    def findings(self) -> list[Finding]:
        return self.scheduled.findings + (self.report.findings if self.report else [])

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in (WRONG, CRASH)]


class CaseTimeout(Exception):
    """A case ran past its time limit (raised inside whatever step was running: that step is the finding)."""


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the main thread after ``seconds`` (0: no limit)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout(f"the case ran past its limit of {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # repeating: one raised inside a finalizer is lost
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fuzz_case(draw: Draw, seed: int, backends: tuple[str, ...]) -> Case:
    c = cascade(draw)
    s = schedule(draw, c)
    sets = [inputs(draw, c, seed * 7 + k) for k in range(INPUT_SETS)]
    data, sizes = [d for d, _ in sets], [z for _, z in sets]
    report = None
    if len(s.sch.trace) and not s.crashed:
        report = check_schedule(c.program, s.sch.program, data, sizes=sizes, backends=backends)
    return Case(seed, c, s, data, sizes, report)


def run(seeds: Iterable[int], tally: Tally, *, cpp_every: int = 0, timeout: int = 120) -> Iterator[Case]:
    """Fuzz a case per seed (with C++ every ``cpp_every``-th, within ``timeout`` seconds each), count it in
    ``tally`` and yield it; a case that runs out of time outside a checked stage counts as crashed."""
    for k, seed in enumerate(seeds):
        backends = ("fused", "tile", "cpp") if cpp_every and k % cpp_every == 0 else ("fused", "tile")
        try:
            with time_limit(timeout):
                case = fuzz_case(RandomDraw(seed), seed, backends)
        except CaseTimeout as err:
            tally.add(fusion_steps=(0, 0), applied=False, findings=[Finding(CRASH, "generate", "timeout", str(err))],
                      report=None)
            continue
        tally.add(fusion_steps=(case.scheduled.fusion_steps[0], case.scheduled.fusion_steps[1]),
                  applied=bool(len(case.scheduled.sch.trace)), findings=case.findings, report=case.report)
        yield case


def record(case: Case, finding: Finding) -> dict:
    """A corpus entry replaying ``case`` (see ``test_fuzz.py``), expected to fail (``xfail``) until fixed."""
    return {
        "class": f"{finding.kind} at {finding.stage}: {finding.reason}",
        "detail": finding.detail.splitlines()[:6],
        "program": str(case.cascade.program),
        "steps": case.scheduled.steps,
        "inputs": [{k: v.tolist() for k, v in d.items()} for d in case.inputs],
        "dtype": case.cascade.dtype,
        "sizes": case.sizes,
        "backends": ["fused", "tile"] + (["cpp"] if finding.stage == "cpp" else []),
        "xfail": f"{finding.kind} at {finding.stage}: {finding.reason}",
    }


def load_program(text: str) -> Program:
    """The program a printed program (builder Python defining ``program()``) builds."""
    namespace: dict = {}
    exec(compile(text, "<corpus program>", "exec"), namespace)
    return namespace["program"]()


def check_entry(entry: dict) -> list[Finding]:
    """Replay a corpus entry: its steps on its program, then the check on its inputs; the failures found."""
    program = load_program(entry["program"])
    scheduled = replay(program, entry["steps"])
    failures = [f for f in scheduled.findings if f.kind != REFUSED]
    if failures or not len(scheduled.sch.trace):
        return failures
    np_dtype = np.float64 if entry["dtype"] == "f64" else np.float32
    input_sets = [{k: np.asarray(v, dtype=np_dtype) for k, v in d.items()} for d in entry["inputs"]]
    return check_schedule(program, scheduled.sch.program, input_sets, sizes=entry["sizes"],
                          backends=entry.get("backends", ("fused", "tile"))).wrong


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpp-every", type=int, default=0, help="build and run the C++ kernel of every K-th case")
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per case (a case past it is a crash)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--replay", type=Path, nargs="+", help="re-check corpus entries (JSON) and print their findings")
    args = ap.parse_args(argv)
    if args.replay:
        for path in args.replay:
            entry = json.loads(path.read_text())
            found = check_entry(entry)
            print(f"=== {path.name}: {'FAILS' if found else 'passes'} ({entry['class']})")
            if args.verbose:
                print(entry["program"] + "\n".join(entry["steps"]))
            for f in found:
                print(f.line())
        return 0
    tally = Tally()
    start = time.time()
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
    for k, case in enumerate(run(range(args.seed, args.seed + args.n), tally, cpp_every=args.cpp_every,
                                 timeout=args.timeout)):
        for f in case.failures:
            if args.verbose:
                print(f"--- seed {case.seed}: {f.kind} at {f.stage}: {f.reason}\n{f.detail}", flush=True)
            if args.save:
                path = args.save / f"seed{case.seed}_{f.stage}.json"
                path.write_text(json.dumps(record(case, f), indent=1))
        if (k + 1) % 100 == 0:
            print(f"[{k + 1} cases, {time.time() - start:.0f} s: {tally.wrong} wrong, {tally.crashed} crashed]",
                  file=sys.stderr, flush=True)
    print(tally.summary())
    print(f"{args.n} cases in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
