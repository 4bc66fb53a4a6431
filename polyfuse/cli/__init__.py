"""The ``polyfuse`` command (contract: docs/cli.md).

Exit status: 0 success, 1 a check failed, 2 usage error, 3 a :class:`PolyfuseError` (the
message on stderr, the traceback only with ``--debug``), 4 a stage or backend that is not
available in this version or on this machine.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from polyfuse import __version__
from polyfuse.cli import bench, commands, demo, dump
from polyfuse.cli.commands import EXIT_BUG, EXIT_REFUSED, EXIT_UNAVAILABLE
from polyfuse.cli.stages import BACKEND_NAMES, STAGE_NAMES, NotAvailable
from polyfuse.errors import BackendUnavailable, InternalError, PolyfuseError
from polyfuse.ops.variants import VARIANTS


def size_assignment(text: str) -> tuple[str, int]:
    """``--set NAME=VALUE`` with an integer VALUE."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with an integer VALUE (e.g. S=2048), got {text!r}")
    try:
        return name, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {name} must be an integer, got {value.strip()!r}") from None


def _debug_option() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print tracebacks of errors")
    return parent


def _operator_options(debug: argparse.ArgumentParser,
                      mode_help: str = "prefill or decode for attention operators (default: the operator's first "
                                       "mode)") -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False, parents=[debug])
    parent.add_argument("--set", action="append", type=size_assignment, default=[], metavar="NAME=VALUE",
                        help="override one of the operator's sizes (repeatable), e.g. --set S=2048")
    parent.add_argument("--mode", metavar="MODE", help=mode_help)
    return parent


def _inputs_options(parser: argparse.ArgumentParser) -> None:
    """The random inputs of the commands that run an operator (check, demo)."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--magnitude", type=float, default=1.0,
                        help="scale of the random inputs, e.g. 1e4 where an unstable formula overflows "
                             "(an operator's `magnitudes` lists the interesting ones; default 1); it must be finite "
                             "and within the inputs' dtype")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are user errors like the others: one line naming the problem and
    where the usage is, exit status 3 (argparse's own prints the whole usage and exits 2)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_REFUSED)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="polyfuse", description="A polyhedral compiler for fused GPU kernels.")
    parser.add_argument("--version", action="version", version=f"polyfuse {__version__}")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    debug = _debug_option()
    common = _operator_options(debug)

    p = sub.add_parser("catalog", help="list the operators", parents=[debug])
    p.set_defaults(run=commands.catalog)

    p = sub.add_parser("show", help="print an operator at a stage", parents=[common])
    p.add_argument("op", help="operator name (see `polyfuse catalog`)")
    p.add_argument("--stage", choices=STAGE_NAMES, default="plain", help="default: plain")
    p.add_argument("--target", choices=("cpp", "cuda", "hip"),
                   help="for --stage tile (default cpp: the tile program; cuda/hip: as the GPU emitter lowers it) "
                        "and --stage plan (default cuda)")
    p.set_defaults(run=commands.show)

    p = sub.add_parser("explain", help="schedule steps, repairs and broken dependences", parents=[common])
    p.add_argument("op", help="operator name")
    p.set_defaults(run=commands.explain)

    p = sub.add_parser("check", help="run an operator on a backend and compare with NumPy", parents=[common])
    p.add_argument("op", help="operator name")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="interp", help="default: interp")
    _inputs_options(p)
    p.add_argument("--inputs", choices=tuple(VARIANTS), default="random", metavar="VARIANT",
                   help="rewrite the random inputs: " + "; ".join(f"{v.name}: {v.description}"
                                                                 for v in VARIANTS.values())
                        + " (default random)")
    p.set_defaults(run=commands.check)

    p = sub.add_parser("dump", help="print the stages of your own program", parents=[debug])
    p.add_argument("source", metavar="FILE.py[:FUNC]", help="FUNC (default main) returns a program or a schedule; "
                                                            "the file's folder is on sys.path while it runs")
    p.add_argument("--target", choices=dump.SOURCE_STAGES,
                   help=f"the target of --stage tile and plan and of a whole dump (default {dump.DEFAULT_TARGET}); "
                        f"--stage cpp, cuda and hip are their own target")
    p.add_argument("--stage", choices=STAGE_NAMES,
                   help="plain (the program as written: a schedule's original), fused (after the schedule), tile, "
                        "plan, cpp, cuda or hip (default: every stage for the target)")
    p.set_defaults(run=dump.dump)

    p = sub.add_parser("demo", help="plain attention to a checked fused kernel", parents=[common])
    p.add_argument("--op", help="operator to demonstrate (default attn_global, else softmax)")
    _inputs_options(p)
    p.set_defaults(run=demo.demo)

    p = sub.add_parser("cache", help="where compiled kernels are cached (info) or remove them (clear)",
                       parents=[debug])
    p.add_argument("action", nargs="?", choices=("info", "clear"), default="info", help="default: info")
    p.set_defaults(run=commands.cache)

    bench_options = _operator_options(debug, "one mode or preset key, e.g. decode_b32 (default: every preset)")
    p = sub.add_parser("bench", help="GPU benchmark against PyTorch baselines", parents=[bench_options])
    bench.add_arguments(p)
    p.set_defaults(run=bench.bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version (0), or a usage error (3)
        return stop.code if isinstance(stop.code, int) else EXIT_REFUSED
    args.command_line = ["polyfuse", *(sys.argv[1:] if argv is None else argv)]
    try:
        return args.run(args)
    except PolyfuseError as err:
        if args.debug:
            traceback.print_exc()
        if isinstance(err, (NotAvailable, BackendUnavailable)):
            print(f"polyfuse: {err}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        print(f"polyfuse: error: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except InternalError:
        # a bug, not a user error: its own exit status (not "check failed"), with the traceback a report needs
        traceback.print_exc()
        print("polyfuse: internal error: a bug in polyfuse (the traceback above); please report it with the command "
              f"line: {' '.join(args.command_line)}", file=sys.stderr)
        return EXIT_BUG


__all__ = ["build_parser", "main"]
