"""Host attention kernel against the operator's NumPy reference (issue 7).

Builds the catalog operator's default fused prefill schedule (FlashAttention: one nest per
query tile, rolling over key tiles) with the host C++ backend and times it against the
operator's own NumPy reference on the same inputs, after checking that the kernel's result is
within the operator's tolerance.  Both are timed in this process, interleaved run by run so
that a change in machine load hits both alike; each is reported as the median and the spread
(min..max) of ``--runs`` timed calls after ``--warmup`` untimed ones.

The catalog's attention inputs are f16 (OPERATORS.md: f16 in, f32 math, f16 out); the kernel
converts them to f32 on load and computes in f32.  The reference is NumPy in float64, as the
catalog defines it (``Operator.reference``)::

    python benchmarks/host_attention.py                 # attn_causal, S=1024, d=64, one head
    python benchmarks/host_attention.py --op attn_global --runs 21
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from polyfuse import ops
from polyfuse.pipeline import build
from polyfuse.ops.schedules import default_schedule


def _sizes(seq: int, dim: int) -> dict[str, int]:
    return {"B": 1, "Hq": 1, "Hkv": 1, "Sq": seq, "Skv": seq, "D": dim, "Dv": dim}


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1e3 for s in seconds)
    return f"{label:<16} median {statistics.median(ms):8.2f} ms   spread {ms[0]:.2f}..{ms[-1]:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="attn_causal", help="catalog attention operator (prefill mode)")
    parser.add_argument("--seq", type=int, default=1024, help="S = Sq = Skv")
    parser.add_argument("--dim", type=int, default=64, help="d = D = Dv")
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs of each first")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    op = ops.get(args.op)
    sizes = op.sizes("prefill", _sizes(args.seq, args.dim))
    # Contracted multiply-adds (FMA), as the GPU benchmarks run; the tolerance covers them (polyfuse.ops.softmax).
    kernel = build(default_schedule(args.op, "prefill", op.program("prefill", **sizes)), "cpp", sizes=sizes,
                   fp_contract=True)
    inputs = op.inputs(args.seed, "prefill", sizes)
    results = kernel.run(inputs)
    comparison = ops.compare(results, op.reference(inputs, "prefill", sizes), op.tolerance("prefill", sizes))
    print(f"{args.op} prefill {' '.join(f'{k}={v}' for k, v in sizes.items())}, inputs "
          f"{', '.join(f'{n} {a.dtype}' for n, a in inputs.items())}")
    print(f"check against the reference: {comparison.line()}")
    if not comparison.ok:
        print(f"worst: {comparison.worst}")
        return 1

    arrays = [inputs[a.name] for a in kernel.inputs] + [results[a.name] for a in kernel.outputs]

    def run_kernel() -> None:
        kernel(*arrays)

    def run_reference() -> None:
        op.reference(inputs, "prefill", sizes)

    for _ in range(args.warmup):
        run_kernel()
        run_reference()
    host, numpy = [], []
    for _ in range(args.runs):
        host.append(_timed(run_kernel))
        numpy.append(_timed(run_reference))

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    threads = os.environ.get("OMP_NUM_THREADS", f"default ({os.cpu_count()} cpus)")
    print(f"{args.runs} runs after {args.warmup} warm-up; OpenMP threads {threads}; load average {load}")
    print(_summary("host kernel", host))
    print(_summary("NumPy reference", numpy))
    print(f"speed-up (median reference / median kernel): {statistics.median(numpy) / statistics.median(host):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
