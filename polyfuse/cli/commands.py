"""The subcommands of ``polyfuse`` (except ``demo`` and ``dump``): each takes the parsed arguments and
returns the exit status.  The contract is docs/cli.md."""

from __future__ import annotations

import argparse

from polyfuse import ops
from polyfuse.cli.stages import Subject, check_backend, gpu_stage, require_backend, require_stage
from polyfuse.errors import PolyfuseError

EXIT_OK, EXIT_FAIL, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_BUG = 0, 1, 3, 4, 5
"""The exit statuses of the contract (docs/cli.md): success, a check failed, a usage error, a
:class:`PolyfuseError` (one line on stderr), a stage or backend not available here."""


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
    """An operator at a stage; ``tile`` and ``plan`` for ``--target`` (tile: the host's tile program by default,
    the program the GPU emitter lowers for cuda or hip; plan: cuda by default, none for the host)."""
    target = getattr(args, "target", None)
    if target is not None and args.stage not in ("tile", "plan"):
        raise PolyfuseError(f"--target applies to --stage tile and plan, not {args.stage} (the cuda, hip and cpp "
                            f"stages are their backend's source)")
    if args.stage == "plan" and target == "cpp":
        raise PolyfuseError("the cpp backend has no kernel plan; plans are made for GPU targets (cuda, hip)")
    if target in ("cuda", "hip"):
        print(gpu_stage(subject_of(args), args.stage, target), end="")
        return EXIT_OK
    render = require_stage(args.stage)
    print(render(subject_of(args)), end="")
    return EXIT_OK


def explain_text(subject: Subject) -> str:
    """The plain program's blocks and dependences, then the default schedule and each fusion.

    A fusion that is refused raises (NoRepairFound / IllegalTransform): the command exits 3
    with the failing condition, after printing what the analysis found.
    """
    from polyfuse import deps

    return deps.describe(subject.program())


def fusion_text(subject: Subject) -> str:
    """The schedule steps applied, and for each reduction fusion: producers, consumer, f, g, h and the
    dependences the naive fusion broke, each with the repair that covers it."""
    sch = subject.schedule()
    lines = ["", "schedule:"] + [f"  {line}" for line in sch.trace.python().splitlines()]
    for f in sch.fusions:
        lines += ["", f"{f.kind} of {f.consumer!r} over loop {f.loop!r}:",
                  f"  producers: {', '.join(f.producers) or '(none: placed under the loop, nothing to repair)'}"]
        if f.inlined:
            lines.append(f"  inlined into it (copies): {', '.join(f.inlined)}")
        if f.repair is not None:
            d = f.repair.describe()
            lines += [f"  f = {d['f']}", f"  g = {d['g']}    ({d['producers']}; c: {d['c']})", f"  h = {d['h']}",
                      f"  proof: {d['cases']}"]
            if f.repair.auxiliaries:
                lines.append("  no single repair h(t, r, r') exists; g is a polynomial in the producers, so the "
                             "state (X, " + ", ".join(map(str, f.repair.state)) + ") is repaired as a whole "
                             "with these auxiliary reductions:")
                lines += [f"    {s} ~ {aux.describe()}" for s, aux in zip(f.repair.state, f.repair.auxiliaries,
                                                                            strict=True)]
        lines += [f"  {note}" for note in f.notes]
        for dep in f.broken:
            head = str(dep).splitlines()[0]
            lines.append(f"  broken by naive fusion: {head}")
            lines.append(f"    repaired by h = {f.repair.describe()['h'] if f.repair else '(none)'} applied to "
                         f"{f.consumer!r}")
        if f.created:
            lines.append(f"  new blocks: {', '.join(f.created)}")
    return "\n".join(lines)


def explain(args: argparse.Namespace) -> int:
    subject = subject_of(args)
    print(explain_text(subject))
    print(fusion_text(subject))
    return EXIT_OK


def check(args: argparse.Namespace) -> int:
    require_backend(args.backend)
    subject = subject_of(args)
    subject.op.require_magnitude(args.magnitude, subject.mode, subject.sizes)
    print(f"{subject} backend={args.backend} seed={args.seed} magnitude={args.magnitude:g} inputs={args.inputs}")
    print(f"tolerance: {subject.op.tolerance_note}")
    result = check_backend(subject, args.backend, seed=args.seed, magnitude=args.magnitude,
                           variant=args.inputs).comparison
    if not result.ok:
        print(f"worst: {result.worst}")
    print(result.line())
    return EXIT_OK if result.ok else EXIT_FAIL


def cache(args: argparse.Namespace) -> int:
    """``info``: the cache directory (``$POLYFUSE_CACHE_DIR`` or the platform's), its kernels and size; ``clear``:
    remove them (only files the cache wrote)."""
    from polyfuse.runtime.cache import cache_info, clear_cache

    if args.action == "clear":
        info = cache_info()
        print(f"removed {clear_cache(info.directory)} kernel(s) from {info.directory}")
    else:
        print(cache_info())
    return EXIT_OK
