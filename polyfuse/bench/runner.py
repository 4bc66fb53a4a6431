"""A benchmark run: the cases one after the other with a progress bar, the results rewritten after every case
(an interrupted run keeps what it measured), then the plots.

Results go to ``out`` (default ``benchmarks/results/DATE_GPU`` under the current directory):
``gpu_bench.json``, ``gpu_bench.md`` and the PNGs of :mod:`polyfuse.bench.plot`.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polyfuse.bench.cases import Case
from polyfuse.bench.measure import BenchOptions, context_broken, make_timer, one_line, run_case, warm_up_gpu
from polyfuse.bench.plot import plot_results
from polyfuse.bench.report import environment, polyfuse_ok, summary, write
from polyfuse.errors import BackendUnavailable

WARM_UP_S = 2.0
"""Seconds of matrix products before the first case (GPU clocks ramp up from idle)."""
REQUIRED = ("torch", "tqdm", "matplotlib")
"""The packages of the ``bench`` extra."""


@dataclass(frozen=True)
class BenchRun:
    """What a run measured (``records``, as in ``gpu_bench.json``), its header, where it wrote and its plots."""

    records: list[dict[str, Any]]
    meta: dict[str, Any]
    out: Path
    plots: list[Path]

    @property
    def ok(self) -> bool:
        """polyfuse ran every case and passed every check it was given."""
        return all(polyfuse_ok(rec) for rec in self.records)


def require_available() -> None:
    """BackendUnavailable unless the ``bench`` extra is installed and PyTorch sees a CUDA GPU."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise BackendUnavailable(f"bench needs {', '.join(missing)}, not installed here "
                                 f"(pip install 'polyfuse[bench]')")
    import torch

    if not torch.cuda.is_available():
        raise BackendUnavailable("bench needs a CUDA GPU visible to PyTorch; torch.cuda.is_available() is False")


def _case_line(rec: dict[str, Any]) -> str:
    s = summary(rec)
    times = ", ".join(f"{label} {e['ms']:.4f} ms" for label, e in rec["candidates"].items() if e.get("ms"))
    ratio = f"; eager/pf {s['eager_ratio']:.2f}" if s.get("eager_ratio") else ""
    state = "" if polyfuse_ok(rec) else " [polyfuse FAILED or did not run: see the notes]"
    return f"{rec['operator']} {rec['mode']}: {times or 'nothing measured'}{ratio}{state}"


def run(cases: Sequence[Case], options: BenchOptions, *, command: str, sizes: str, out: Path | None = None,
        results: Path = Path("benchmarks") / "results", commit: str | None = None) -> BenchRun:
    """Measure ``cases`` on CUDA device 0 (``sizes`` names how they were chosen, for the header) into ``out``,
    by default ``results/DATE_GPU``."""
    require_available()
    import torch
    from tqdm import tqdm

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.cuda.init()
    timer, timer_name = make_timer(options.warmup_ms, options.rep_ms)
    warm_up_gpu(WARM_UP_S)
    meta = environment(command=command, sizes=sizes, seed=options.seed, loader=options.loader, timer=timer_name,
                       warmup_ms=options.warmup_ms, rep_ms=options.rep_ms, rounds=options.rounds, commit=commit)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", meta["gpu"]).strip("-")
    out = out or results / f"{meta['date'][:10]}_{slug}"
    print(f"bench: {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}; "
          f"results in {out}", file=sys.stderr, flush=True)
    records: list[dict[str, Any]] = []
    with tqdm(cases, unit="case", file=sys.stderr, dynamic_ncols=True) as bar:
        for case in bar:
            bar.set_description(f"{case.operator} {case.key}")
            torch._dynamo.reset()
            try:
                rec = run_case(case, options, timer, bar.set_postfix_str)
            except Exception as err:
                rec = {"operator": case.operator, "mode": case.key, "group": case.group, "axis": list(case.axis),
                       "sizes": dict(case.sizes), "sizes_text": str(dict(case.sizes)), "candidates": {},
                       "notes": [f"case failed: {one_line(err)}"], "traceback": traceback.format_exc(limit=8),
                       "fatal": context_broken(err)}
            records.append(rec)
            bar.write(_case_line(rec), file=sys.stderr)
            gc.collect()
            if not rec.get("fatal"):
                torch.cuda.empty_cache()
            write(out, meta, records)
            if rec.get("fatal"):
                bar.write(f"bench: {rec['fatal']}", file=sys.stderr)
                break
    plots = plot_results({**meta, "cases": records}, out)
    return BenchRun(records, meta, out, plots)
