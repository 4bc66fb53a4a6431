"""``polyfuse demo``: plain attention, through every stage this version has, checked against NumPy.

The demo walks two lists in order: the texts it prints (``_shown``: the plain program, the
explanation of the fusion, each later stage) and the backends it runs and checks
(``_checked``).  Steps whose stage or backend is not available are listed as such and the demo
exits 4: it is the quick start's proof that an installation compiles and runs a kernel, so a
backend it should run (host C++ always, the GPU where one is visible) that could not run is a
failure, not a footnote.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from polyfuse import ops
from polyfuse.cli.commands import EXIT_FAIL, EXIT_OK, EXIT_UNAVAILABLE, fusion_text
from polyfuse.cli.devices import cuda_gpu_count
from polyfuse.cli.stages import NotAvailable, Subject, check_backend, require_stage
from polyfuse.errors import BackendUnavailable, PolyfuseError

DEMO_OPERATORS = ("attn_global", "softmax")


def _native_target() -> str:
    """Where the generated kernel runs: the GPU when one is visible, otherwise host C++."""
    return "cuda" if cuda_gpu_count() > 0 else "cpp"


def _stage(name: str) -> Callable[[Subject], str]:
    """The stage's printer, looked up when the step runs (so a missing stage is reported there)."""
    return lambda subject: require_stage(name)(subject)


def _shown(target: str) -> tuple[tuple[str, str, Callable[[Subject], str]], ...]:
    """(step, heading, text) in order: the user's program, the fusion's explanation, each stage."""
    return (
        ("plain", "plain program", _stage("plain")),
        ("explain", "fusion: schedule steps, derived repair terms, broken dependences", fusion_text),
        ("fused", "fused program", _stage("fused")),
        ("tile", "tile program", _stage("tile")),
        (target, f"{target} kernel source", _stage(target)),
    )


def _checked(target: str) -> tuple[str, ...]:
    """The host C++ kernel always runs; the GPU kernel too where there is a GPU."""
    return ("interp", "fused", "tile", "cpp") + ((target,) if target != "cpp" else ())


def _subject(args: argparse.Namespace) -> Subject:
    name = args.op
    if name is None:
        known = ops.names()
        name = next((n for n in DEMO_OPERATORS if n in known), None)
        if name is None:
            raise PolyfuseError(f"the demo needs {' or '.join(DEMO_OPERATORS)} in the catalog; "
                                f"it has: {', '.join(known) or 'nothing'}")
    return Subject.of(name, args.mode, dict(args.set))


def _heading(text: str) -> None:
    print(f"\n== {text}")


def demo(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    target = _native_target()
    subject = _subject(args)
    subject.op.require_magnitude(args.magnitude, subject.mode, subject.sizes)
    print(f"polyfuse demo: {subject}  ({subject.op.description})")
    missing: list[str] = []
    for step, heading, text in _shown(target):
        _heading(heading)
        try:
            print(text(subject).rstrip("\n"))
        except NotAvailable as err:
            print(f"({err})")
            missing.append(f"{step} stage" if step != "explain" else step)

    _heading(f"checks against the float64 NumPy reference (seed {args.seed}, magnitude {args.magnitude:g})")
    outcomes: list[bool] = []
    for backend in _checked(target):
        try:
            result = check_backend(subject, backend, seed=args.seed, magnitude=args.magnitude)
        except (NotAvailable, BackendUnavailable) as err:
            print(f"{backend:<7} ({err})")
            missing.append(f"{backend} backend")
            continue
        outcomes.append(result.comparison.ok)
        print(f"{backend:<7} {result.comparison.line()}  wall {result.seconds:.3f} s")
        if not result.comparison.ok:
            print(f"{'':<7} worst: {result.comparison.worst}")

    _heading("summary")
    if missing:
        print(f"not available: {', '.join(missing)}")
    planned = len(_checked(target))
    print(f"{sum(outcomes)}/{planned} checks OK, total wall {time.perf_counter() - start:.2f} s")
    if missing:
        # A step the demo should run could not: the installation (or machine) cannot do the main job.
        return EXIT_UNAVAILABLE
    return EXIT_OK if all(outcomes) else EXIT_FAIL
