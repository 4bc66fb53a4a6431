"""``polyfuse bench OP``: the GPU benchmark of one operator against PyTorch (:mod:`polyfuse.bench`).

The cases are checked before anything heavy is imported (an unknown operator, mode or size exits 3); a machine
without the ``bench`` extra or a CUDA GPU exits 4 in one line.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from polyfuse import ops
from polyfuse.bench.cases import cases
from polyfuse.bench.measure import BenchOptions
from polyfuse.bench.report import table
from polyfuse.bench.runner import run
from polyfuse.cli.commands import EXIT_FAIL, EXIT_OK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="operator name (see `polyfuse catalog`)")
    p.add_argument("--sweep", action="store_true",
                   help="each preset at 1/4, 1/2, 1, 2 and 4 times its sweep axis (attention prefill: Sq = Skv; "
                        "decode: Skv; the others: their reduced length or rows)")
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results/DATE_GPU here)")
    p.add_argument("--loader", choices=("cuda-python", "pycuda"),
                   help="polyfuse's CUDA binding (default: pycuda if installed, else cuda-python)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up, ms (default 25)")
    p.add_argument("--rep", type=float, default=100.0, help="do_bench measuring time, ms (default 100)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timing rounds alternating over the candidates, the least median kept (default 3)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (and FlexAttention)")
    p.add_argument("--no-reference", action="store_true", help="skip the float64 NumPy reference")
    p.add_argument("--static-sizes", action="store_true",
                   help="build polyfuse's kernel for each case's sizes, every one fixed (default: the generic "
                        "kernel, one for every value of the operator's gpu_symbolic sizes)")


def bench(args: argparse.Namespace) -> int:
    """Benchmark the operator's presets (``--mode``: those of one mode or preset key; ``--set``: sizes changed in
    each) or sweeps of them; the table on stdout, the results in ``--out``. Exit 1 if polyfuse failed a check or
    did not run."""
    which = "sweep" if args.sweep else "bench"
    chosen = cases(ops.get(args.op), which, {args.mode} if args.mode else set(), dict(args.set))
    options = BenchOptions(seed=args.seed, loader=args.loader, warmup_ms=args.warmup, rep_ms=args.rep,
                           rounds=args.rounds, compile=not args.no_compile, reference=not args.no_reference,
                           static_sizes=args.static_sizes)
    done = run(chosen, options, command=shlex.join(args.command_line), sizes=which, out=args.out)
    print("\n".join(table(done.records)))
    print(f"\nresults: {done.out / 'gpu_bench.md'}, {done.out / 'gpu_bench.json'}"
          + "".join(f", {p}" for p in done.plots))
    return EXIT_OK if done.ok else EXIT_FAIL
