"""GPU benchmark of several catalog operators in one run: the front end of :mod:`polyfuse.bench` for whole-catalog
runs (``polyfuse bench OP`` runs one operator).

For each operator and mode at its benchmark sizes (``Operator.presets``; ``--sizes test`` takes the small test
sizes, ``--sizes sweep`` each preset at 1/4 to 4 times its sweep axis, ``polyfuse.bench.cases``), polyfuse's CUDA
kernel against PyTorch eager, ``torch.compile``, SDPA and FlexAttention (``polyfuse.bench.measure`` says how).
Results go to ``--out`` (default ``benchmarks/results/DATE_GPU``) as ``gpu_bench.md``, ``gpu_bench.json``
(rewritten after every case) and one PNG per operator and preset; ``--plot JSON`` redraws the PNGs of a recorded
run::

    python benchmarks/gpu_bench.py                                  # the whole catalog
    python benchmarks/gpu_bench.py --ops attn_causal,softmax --sizes test
    python benchmarks/gpu_bench.py --ops attn_gqa --modes decode --no-compile
    python benchmarks/gpu_bench.py --plot benchmarks/results/DATE_GPU/gpu_bench.json
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from polyfuse import ops  # noqa: E402 - after the checkout is on the path
from polyfuse.bench import baselines  # noqa: E402
from polyfuse.bench.cases import cases  # noqa: E402
from polyfuse.bench.measure import BenchOptions  # noqa: E402
from polyfuse.bench.plot import plot_file  # noqa: E402
from polyfuse.bench.report import markdown  # noqa: E402
from polyfuse.bench.runner import run  # noqa: E402
from polyfuse.errors import BackendUnavailable, PolyfuseError  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--ops", default="", help="comma-separated operator names (default: the whole catalog)")
    parser.add_argument("--modes", default="", help="comma-separated modes or preset keys, e.g. prefill,decode_b32")
    parser.add_argument("--sizes", choices=("bench", "test", "sweep"), default="bench",
                        help="bench: Operator.presets (model shapes); test: the small test sizes; sweep: each preset "
                             "at 1/4 to 4 times its sweep axis")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default benchmarks/results/DATE_GPU)")
    parser.add_argument("--loader", choices=("cuda-python", "pycuda"), default=None,
                        help="polyfuse's CUDA driver binding (default: pycuda if installed, else cuda-python)")
    parser.add_argument("--commit", default=None, help="polyfuse commit to record (default: git rev-parse HEAD)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench measuring time, ms")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timing rounds alternating over the candidates, the least median kept (default 3)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (and FlexAttention)")
    parser.add_argument("--no-reference", action="store_true", help="skip the NumPy reference")
    parser.add_argument("--plot", type=Path, metavar="JSON", help="only redraw the PNGs of a recorded gpu_bench.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.plot:
            for path in plot_file(args.plot, args.out):
                print(path)
            return 0
        names = [n for n in args.ops.split(",") if n] or baselines.names()
        wanted = {m for m in args.modes.split(",") if m}
        chosen = []
        for name in names:
            op = ops.get(name)
            keep = wanted & (set(op.modes) | set(op.presets))
            if keep or not wanted:
                chosen += cases(op, args.sizes, keep)
        options = BenchOptions(seed=args.seed, loader=args.loader, warmup_ms=args.warmup, rep_ms=args.rep,
                               rounds=args.rounds, compile=not args.no_compile, reference=not args.no_reference)
        command = shlex.join(["python", *sys.argv])
        done = run(chosen, options, command=command, sizes=args.sizes, out=args.out,
                   results=REPO / "benchmarks" / "results", commit=args.commit)
    except BackendUnavailable as err:
        print(f"gpu_bench: {err}", file=sys.stderr)
        return 4
    except PolyfuseError as err:
        print(f"gpu_bench: {err}", file=sys.stderr)
        return 2
    print("\n" + markdown(done.records, done.meta), flush=True)
    return 1 if any(rec.get("fatal") for rec in done.records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
