"""``polyfuse dump FILE.py[:FUNC]``: the stages of a user's own program.

``FUNC`` (default ``main``) returns a Program or a Schedule.  The file runs as a script would: its own
folder is first on ``sys.path`` while it runs, so it can import the modules beside it.  Whatever it
raises is the user's error, not polyfuse's: :class:`UserCodeError` (exit 3) with the file, the line
and the exception in one line, the traceback only with ``--debug``.

Which target a stage is printed for is decided once, by :func:`dump_target`: the source stages
(``cpp``, ``cuda``, ``hip``) are their own target, ``tile`` and ``plan`` take ``--target`` (default
:data:`DEFAULT_TARGET`), and ``plain`` and ``fused`` have none.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import traceback
from pathlib import Path

from polyfuse.cli.commands import EXIT_OK
from polyfuse.errors import PolyfuseError
from polyfuse.ir.stmt import Program
from polyfuse.transforms.schedule import Schedule

DEFAULT_TARGET = "cuda"
"""The target of ``tile``, ``plan`` and a whole dump without ``--target``: the GPU the compiler is for (printing
its source needs no GPU)."""
SOURCE_STAGES = ("cpp", "cuda", "hip")
LOOP_STAGES = ("plain", "fused")


class UserCodeError(PolyfuseError):
    """The user's file raised while it was loaded or while its function ran."""


def dump_target(stage: str | None, target: str | None) -> str | None:
    """The target ``stage`` is printed for (None for the loop programs); PolyfuseError if ``--target``
    contradicts the stage."""
    if stage in SOURCE_STAGES:
        if target not in (None, stage):
            raise PolyfuseError(f"--stage {stage} is the {stage} source, --target {target} another backend's; "
                                f"leave --target out or ask for --stage {target}")
        return stage
    if stage in LOOP_STAGES:
        if target is not None:
            raise PolyfuseError(f"--target applies to --stage tile, plan and the source stages, not {stage} "
                                f"(a loop program has no target)")
        return None
    return target or DEFAULT_TARGET


def _where(err: BaseException, file: Path) -> str:
    """``FILE:LINE`` of the innermost frame of ``file`` that ``err`` passed through (or its syntax error)."""
    if isinstance(err, SyntaxError) and err.lineno is not None:
        return f"{file}:{err.lineno}"
    lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__)
             if Path(frame.filename).resolve() == file.resolve()]
    return f"{file}:{lines[-1]}" if lines else str(file)


def load(source: str) -> Program | Schedule:
    """What ``FILE.py[:FUNC]`` returns, run with the file's folder first on ``sys.path``."""
    path, _, func = source.partition(":")
    file, name = Path(path), func or "main"
    if not file.is_file():
        raise PolyfuseError(f"dump: no file {path!r}")
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        maker = getattr(module, name, None)
        if not callable(maker):
            raise PolyfuseError(f"dump: {path} defines no function {name!r}")
        made = maker()
    except PolyfuseError:
        raise
    except Exception as err:  # noqa: BLE001 - anything the user's code raises is reported as theirs
        raise UserCodeError(f"dump: {_where(err, file)}: {type(err).__name__}: {err}") from err
    finally:
        sys.path.remove(folder)
    if not isinstance(made, Program | Schedule):
        raise PolyfuseError(f"dump: {name}() in {path} returned a {type(made).__name__}; it must return a Program "
                            f"or a Schedule")
    return made


def _loop_stage(made: Program | Schedule, stage: str, source: str) -> str:
    if isinstance(made, Program):
        if stage == "fused":
            raise PolyfuseError(f"dump: {source} returned a Program, not a Schedule, so it has no fused stage; "
                                f"ask for --stage plain, or return a Schedule")
        return str(made)
    if stage == "plain":
        return str(made.original)
    steps = "\n".join(f"#   {line}" for line in made.trace.python().splitlines())
    return f"# the plain program after its schedule\n{steps}\n{made.program}"


def dump(args: argparse.Namespace) -> int:
    """Print ``args.stage`` (or every stage) of the user's program for its target."""
    from polyfuse.pipeline import stages

    target = dump_target(args.stage, args.target)
    made = load(args.source)
    if args.stage in LOOP_STAGES:
        print(_loop_stage(made, args.stage, args.source))
        return EXIT_OK
    built = stages(made, target)
    if args.stage is None:
        print(f"# program\n{built.dump('program')}")
    if args.stage in (None, "tile"):
        print(f"# tile program\n{built.dump('tile')}")
    if args.stage == "plan" or (args.stage is None and built.plan is not None):
        print(f"# kernel plan\n{built.dump('plan')}")
    if args.stage in (None, *SOURCE_STAGES):
        print(built.dump("source"), end="")
    return EXIT_OK
