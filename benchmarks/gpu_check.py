"""Check every fused catalog operator on a GPU backend against the float64 NumPy reference.

    python benchmarks/gpu_check.py [--backend cuda] [--sizes test,bench] [--ops a,b] [--inputs all] [--out DIR]

Runs what ``polyfuse check OP --backend cuda --inputs VARIANT`` runs (kernels built with
``fp_contract=True``: FMA contraction, which the tolerances cover), for every operator and mode,
at every magnitude of the operator (for the ``random`` inputs; the other input variants at magnitude
1), at the test sizes and at one benchmark size per operator: the
preset model shape, with attention cut to one key/value head (and its query group) so that the
float64 reference stays affordable while the sequence lengths stay those of the benchmark
(prefill S=4096, decode Skv=32768).  Prints one line per check and writes ``gpu_check.log`` and
``gpu_check.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import traceback
from pathlib import Path

from polyfuse import ops
from polyfuse.cli.stages import Subject, check_backend
from polyfuse.errors import NoRepairFound
from polyfuse.ops.schedules import has_default_schedule
from polyfuse.ops.variants import VARIANTS


def bench_sizes(op: ops.Operator, mode: str) -> dict[str, int]:
    """The benchmark preset of ``mode``, attention cut to one kv head and its query group."""
    sizes = dict(op.presets.get(mode) or op.presets.get("prefill") or op.sizes(mode))
    if "Hkv" in sizes:
        group = sizes["Hq"] // sizes["Hkv"]
        sizes.update(Hq=group, Hkv=1, B=1)
    return {k: v for k, v in sizes.items() if k in op.sizes(mode)}


def run_one(job: tuple[str, str, str, float, str, int, str]) -> dict:
    """One check (runs in a worker process): schedule, compile, run on the GPU, compare."""
    name, mode, kind, magnitude, backend, seed, variant = job
    op = ops.get(name)
    overrides = op.sizes(mode) if kind == "test" else bench_sizes(op, mode)
    subject = Subject.of(name, mode, overrides)
    start = time.perf_counter()
    extra = ""
    try:
        result = check_backend(subject, backend, seed=seed, magnitude=magnitude, variant=variant)
        line, ok = result.comparison.line(), result.comparison.ok
        status = "OK" if ok else "FAIL"
        if not ok:
            extra = f" worst: {result.comparison.worst}"
    except NoRepairFound as err:
        status, line = "REFUSED", str(err).splitlines()[0][:160]
    except Exception as err:  # noqa: BLE001 - one failure must not stop the sweep
        status, line = "ERROR", f"{type(err).__name__}: {str(err)[:300]}"
        extra = "\n" + traceback.format_exc(limit=4)
    seconds = time.perf_counter() - start
    return {"op": name, "mode": mode, "sizes": subject.sizes, "kind": kind, "magnitude": magnitude,
            "inputs": variant, "status": status, "line": line, "seconds": seconds,
            "text": f"{status:<7} {subject} magnitude={magnitude:g} inputs={variant} [{kind}] {line} "
                    f"({seconds:.1f} s){extra}"}


def input_variants(text: str) -> list[str]:
    """``--inputs``: comma-separated variant names of :data:`VARIANTS`, or ``all``."""
    names = list(VARIANTS) if text == "all" else [v for v in text.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown input variant(s) {', '.join(unknown) or '(none)'}; "
                                         f"known: {', '.join(VARIANTS)} or all")
    return names


def jobs_of(names: list[str], sizes: list[str], variants: list[str], backend: str,
            seed: int) -> list[tuple[str, str, str, float, str, int, str]]:
    """Every (operator, mode, size kind, magnitude, variant) to check: the random inputs at each of the
    operator's magnitudes, the other variants at magnitude 1."""
    return [(name, mode, kind, magnitude, backend, seed, variant)
            for name in names for mode in ops.get(name).modes if has_default_schedule(name, mode)
            for kind in sizes for variant in variants
            for magnitude in (ops.get(name).magnitudes if variant == "random" else (1.0,))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--sizes", default="test,bench")
    parser.add_argument("--ops", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inputs", type=input_variants, default=["random"],
                        help="input variants, comma-separated, or all (default random): "
                             + ", ".join(VARIANTS))
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (each opens the GPU)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    names = [n for n in args.ops.split(",") if n] or ops.names()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_of(names, args.sizes.split(","), args.inputs, args.backend, args.seed)
    records = []
    with (out / "gpu_check.log").open("w") as log:
        if args.jobs > 1:
            pool = multiprocessing.get_context("spawn").Pool(args.jobs)
            results = pool.imap_unordered(run_one, jobs)
        else:
            pool, results = None, map(run_one, jobs)
        for record in results:
            print(record["text"], flush=True)
            log.write(record["text"] + "\n")
            log.flush()
            records.append({k: v for k, v in record.items() if k != "text"})
        if pool is not None:
            pool.close()
        counts = {s: sum(r["status"] == s for r in records) for s in ("OK", "FAIL", "ERROR", "REFUSED")}
        print(f"summary: {counts}", flush=True)
        log.write(f"summary: {counts}\n")
    (out / "gpu_check.json").write_text(json.dumps(records, indent=1))
    return 0 if counts["FAIL"] == 0 and counts["ERROR"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
