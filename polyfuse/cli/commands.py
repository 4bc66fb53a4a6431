"""The subcommands of ``polyfuse`` (except ``demo``): each takes the parsed arguments and
returns the exit status.  The contract is /work/shared/CLI.md."""

from __future__ import annotations

import argparse

from polyfuse import ops
from polyfuse.cli.stages import NotAvailable, Subject, check_backend, require_backend, require_stage

EXIT_OK, EXIT_FAIL = 0, 1


def subject_of(args: argparse.Namespace) -> Subject:
    """The operator named on the command line, at ``--mode`` with the ``--set`` sizes applied."""
    return Subject.of(args.op, args.mode, dict(args.set))


def catalog(args: argparse.Namespace) -> int:
    names = ops.names()
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {ops.get(name).description}")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    render = require_stage(args.stage)
    print(render(subject_of(args)), end="")
    return EXIT_OK


def explain_text(subject: Subject) -> str:
    """What the dependence analysis says about the operator's program."""
    from polyfuse import deps

    describe = getattr(deps, "describe", None)
    if describe is None:
        raise NotAvailable("explain is not available yet in this version")
    return describe(subject.program())


def explain(args: argparse.Namespace) -> int:
    print(explain_text(subject_of(args)))
    return EXIT_OK


def check(args: argparse.Namespace) -> int:
    require_backend(args.backend)
    subject = subject_of(args)
    print(f"{subject} backend={args.backend} seed={args.seed} magnitude={args.magnitude:g}")
    print(f"tolerance: {subject.op.tolerance_note}")
    result = check_backend(subject, args.backend, seed=args.seed, magnitude=args.magnitude).comparison
    if not result.ok:
        print(f"worst: {result.worst}")
    print(result.line())
    return EXIT_OK if result.ok else EXIT_FAIL


def dump(args: argparse.Namespace) -> int:
    raise NotAvailable("dump is not available yet in this version")


def bench(args: argparse.Namespace) -> int:
    raise NotAvailable("bench is not available yet in this version")
