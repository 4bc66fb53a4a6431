"""Plots of a benchmark run: time and throughput against size, polyfuse and each baseline, from the JSON record.

One PNG per operator and preset (``gpu_bench_OP_PRESET.png``): for a sweep two line charts against the swept
size (time on log-log axes, throughput on a log size axis); for a single size two bar charts, one bar per
candidate. A candidate that failed or was skipped has no point. matplotlib is imported here only, through its
object API (no pyplot: no global figure state, no display needed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polyfuse.bench.report import throughput

POLYFUSE_COLOUR = "#d62728"
OTHER_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _group(rec: Mapping[str, Any]) -> str:
    """The preset a case belongs to; records written before cases named it are grouped by their key without a
    sweep suffix (``prefill_s1024`` -> ``prefill``)."""
    return rec.get("group") or re.sub(r"_s\d+$", "", rec["mode"])


def _axis(records: list[Mapping[str, Any]]) -> tuple[str, ...]:
    """The sizes that vary across ``records`` (those the records name first), empty when one size."""
    named = records[0].get("axis")
    if named:
        return tuple(named)
    names = list(records[0]["sizes"])
    return tuple(n for n in names if len({r["sizes"].get(n) for r in records}) > 1)


def groups(data: Mapping[str, Any]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The measured cases by (operator, preset), in run order."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for rec in data["cases"]:
        if rec.get("candidates"):
            found.setdefault((rec["operator"], _group(rec)), []).append(rec)
    return found


def _labels(records: list[Mapping[str, Any]]) -> list[str]:
    """Candidates with at least one time, polyfuse first."""
    labels = dict.fromkeys(label for rec in records for label, e in rec["candidates"].items() if e.get("ms"))
    return sorted(labels, key=lambda label: label != "polyfuse")


def _colour(label: str, labels: list[str]) -> str:
    others = [x for x in labels if x != "polyfuse"]
    return POLYFUSE_COLOUR if label == "polyfuse" else OTHER_COLOURS[others.index(label) % len(OTHER_COLOURS)]


def _unit(rec: Mapping[str, Any]) -> str:
    """TFLOP/s or GB/s: the operator's unit of work (the same for every case of an operator)."""
    found = throughput(rec, 1.0)
    return found[1] if found else "throughput"


def _rate(rec: Mapping[str, Any], ms: float | None) -> float | None:
    found = throughput(rec, ms)
    return found[0] if found else None


def _sweep_figure(fig: Any, records: list[Mapping[str, Any]], axis: tuple[str, ...], labels: list[str]) -> None:
    time_ax, rate_ax = fig.subplots(1, 2)
    unit = _unit(records[0])
    records = sorted(records, key=lambda r: r["sizes"][axis[0]])
    for label in labels:
        points = [(r["sizes"][axis[0]], r["candidates"].get(label, {}).get("ms"), r) for r in records]
        points = [(x, ms, r) for x, ms, r in points if ms]
        if not points:
            continue
        xs = [x for x, _, _ in points]
        style = {"color": _colour(label, labels), "marker": "o", "label": label,
                 "linewidth": 2.5 if label == "polyfuse" else 1.2}
        time_ax.plot(xs, [ms for _, ms, _ in points], **style)
        rate_ax.plot(xs, [_rate(r, ms) for _, ms, r in points], **style)
    sizes = sorted({r["sizes"][axis[0]] for r in records})
    for ax, ylabel in ((time_ax, "time (ms)"), (rate_ax, unit)):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel(" = ".join(axis))
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    time_ax.set_yscale("log")
    rate_ax.legend(fontsize="small")


def _bar_figure(fig: Any, rec: Mapping[str, Any], labels: list[str]) -> None:
    time_ax, rate_ax = fig.subplots(1, 2)
    unit = _unit(rec)
    ms = [rec["candidates"][label]["ms"] for label in labels]
    colours = [_colour(label, labels) for label in labels]
    positions = range(len(labels))
    time_ax.barh(positions, ms, color=colours)
    rate_ax.barh(positions, [_rate(rec, m) for m in ms], color=colours)
    for ax, xlabel in ((time_ax, "time (ms)"), (rate_ax, unit)):
        ax.set_yticks(list(positions), labels, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", alpha=0.3)


def plot_results(data: Mapping[str, Any], out: Path) -> list[Path]:
    """Write the PNGs of a run (``data``: the contents of ``gpu_bench.json``) into ``out``; their paths."""
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (operator, group), records in groups(data).items():
        labels = _labels(records)
        if not labels:
            continue
        fig = Figure(figsize=(11, 4.2), layout="constrained")
        axis = _axis(records)
        if len(records) > 1 and axis:
            _sweep_figure(fig, records, axis, labels)
            what = f"{operator} {group}, " + " ".join(f"{k}={v}" for k, v in records[0]["sizes"].items()
                                                     if k not in axis)
        else:
            _bar_figure(fig, records[-1], labels)
            what = f"{operator} {records[-1]['mode']}, {records[-1]['sizes_text']}"
        fig.suptitle(f"{what} — {data.get('gpu', '?')}, polyfuse {str(data.get('commit') or '?')[:7]}")
        path = out / f"gpu_bench_{operator}_{group}.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def plot_file(json_path: Path, out: Path | None = None) -> list[Path]:
    """The plots of a recorded ``gpu_bench.json`` (into its folder unless ``out`` says)."""
    return plot_results(json.loads(json_path.read_text()), out or json_path.parent)
