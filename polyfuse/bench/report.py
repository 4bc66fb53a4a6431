"""A benchmark run's records as a table, a Markdown report and a JSON file.

Times in ms; a ratio is another candidate's time over polyfuse's (above 1: polyfuse is faster); throughput is
TFLOP/s of the products where the operator has any (attention: visible pairs only) and GB/s of inputs + outputs.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The checkout polyfuse runs from, where it is one (its commit is recorded)."""


def _ms(entry: Mapping[str, Any] | None) -> float | None:
    return None if entry is None else entry.get("ms")


def throughput(rec: Mapping[str, Any], ms: float | None) -> tuple[float, str] | None:
    """The work of ``rec`` done in ``ms``: (TFLOP/s, "TFLOP/s") where it counts flops, else (GB/s, "GB/s")."""
    if not ms:
        return None
    if rec.get("flops"):
        return rec["flops"] / (ms * 1e9), "TFLOP/s"
    if rec.get("bytes"):
        return rec["bytes"] / (ms * 1e6), "GB/s"
    return None


def summary(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The table row's numbers: times, best SDPA, best other, ratios, throughput, correctness."""
    cands = rec["candidates"]
    pf = _ms(cands.get("polyfuse"))
    sdpa = [(e["ms"], label.removeprefix("sdpa:")) for label, e in cands.items()
            if label.startswith("sdpa:") and e.get("ms") is not None]
    others = [(e["ms"], label) for label, e in cands.items() if label != "polyfuse" and e.get("ms") is not None]
    best_sdpa, best_other = min(sdpa, default=None), min(others, default=None)

    def ratio(ms: float | None) -> float | None:
        return ms / pf if ms is not None and pf else None

    row = {"polyfuse_ms": pf, "eager_ms": _ms(cands.get("eager")), "compile_ms": _ms(cands.get("torch.compile")),
           "best_sdpa": best_sdpa, "flex_ms": _ms(cands.get("flex")), "best_other": best_other}
    row["eager_ratio"], row["compile_ratio"] = ratio(row["eager_ms"]), ratio(row["compile_ms"])
    row["best_other_ratio"] = ratio(best_other[0]) if best_other else None
    if pf:
        row["tflops"] = rec["flops"] / (pf * 1e9) if rec.get("flops") else None
        row["gbps"] = rec["bytes"] / (pf * 1e6)
        if rec.get("copy_ms"):
            row["of_copy"] = rec["copy_ms"] / pf  # (the same bytes: the ratio of the bandwidths)
    return row


def polyfuse_ok(rec: Mapping[str, Any]) -> bool:
    """Whether polyfuse ran and passed every check it was given (a case without checks passes)."""
    pf = rec["candidates"].get("polyfuse", {})
    if rec.get("fatal") or "ms" not in pf:
        return False
    reports = [pf.get("check") or {}, rec.get("polyfuse_vs_eager") or {}]
    return all(c["ok"] for report in reports for c in report.values())


def correctness(rec: Mapping[str, Any]) -> str:
    pf = rec["candidates"].get("polyfuse", {})
    if "error" in pf:
        return "polyfuse: error"
    parts = []
    star = "*" if rec.get("reference_subset") else ""
    for what, report in ((f"ref{star}", pf.get("check")), ("eager", rec.get("polyfuse_vs_eager"))):
        if report:
            bad = [n for n, c in report.items() if not c["ok"]]
            worst = max((c["max_abs_err"] or 0.0) for c in report.values())
            parts.append(f"{what} {'FAIL ' + ','.join(bad) if bad else 'OK'} ({worst:.1e})")
    return "; ".join(parts) or "unchecked"


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "–" if x is None else format(x, fmt)


def table(records: list[Mapping[str, Any]]) -> list[str]:
    """The Markdown table of the results, one row per case."""
    lines = ["| operator | mode | sizes | polyfuse | eager | compile | best SDPA (backend) | flex | eager/pf | "
             "compile/pf | best other/pf | polyfuse throughput | correctness |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|"]
    for rec in records:
        s = summary(rec)
        sdpa = f"{s['best_sdpa'][0]:.3f} ({s['best_sdpa'][1]})" if s["best_sdpa"] else "–"
        other = f"{_f(s['best_other_ratio'], '.2f')} ({s['best_other'][1]})" if s["best_other"] else "–"
        through = f"{s['gbps']:.0f} GB/s" if s.get("gbps") else "–"
        if s.get("of_copy"):
            through += f" ({s['of_copy']:.0%} of copy)"
        if s.get("tflops"):
            through = f"{s['tflops']:.1f} TFLOP/s, {through}"
        cells = [rec["operator"], rec["mode"], rec["sizes_text"], _f(s["polyfuse_ms"], ".4f"), _f(s["eager_ms"], ".4f"),
                 _f(s["compile_ms"], ".4f"), sdpa, _f(s["flex_ms"], ".4f"), _f(s["eager_ratio"], ".2f"),
                 _f(s["compile_ratio"], ".2f"), other, through, correctness(rec)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _notes(rec: Mapping[str, Any]) -> str:
    notes = list(rec["notes"])
    errors, failed = [], {}
    for label, entry in rec["candidates"].items():
        if "error" in entry:
            why = entry["error"] + (f" [{' | '.join(entry['warnings'][:4])}]" if entry.get("warnings") else "")
            failed.setdefault(why, []).append(label)
        for n, c in (entry.get("check") or {}).items():
            name = f"{label}({n})" if len(entry["check"]) > 1 else label
            errors.append(f"{name} {_f(c['max_abs_err'], '.1e')} {'OK' if c['ok'] else 'FAIL'}")
    notes += [f"{', '.join(labels)}: {why}" for why, labels in failed.items()]
    if errors:
        notes.append("max abs error against the reference, in tolerance or not: " + ", ".join(errors))
    for key in ("schedule_s", "build_s", "reference_s"):
        if key in rec:
            notes.append(f"{key.removesuffix('_s')} {rec[key]:.2f} s")
    compile_s = rec["candidates"].get("torch.compile", {}).get("first_call_s")
    if compile_s is not None:
        notes.append(f"torch.compile first call {compile_s:.1f} s")
    return f"- **{rec['operator']} {rec['mode']}**: " + "; ".join(notes)


def markdown(records: list[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    lines = [f"# polyfuse GPU benchmark — {meta['gpu']}", "",
             f"{meta['date']}; polyfuse {meta['commit'] or 'commit unknown'} (sources "
             f"{meta.get('sources', 'not recorded')}); torch {meta['torch']}, "
             f"triton {meta['triton']}, CUDA {meta['cuda']}; timing {meta['timer']} (median, "
             f"warm-up {meta['warmup_ms']:g} ms, {meta['rep_ms']:g} ms measured{_rounds(meta)}); "
             f"sizes {meta['sizes']}; "
             f"`{meta['command']}`", "",
             "Times in ms; a ratio is the other's time over polyfuse's (above 1: polyfuse is faster). "
             "Throughput is polyfuse's: TFLOP/s of the products (attention: visible pairs only) and GB/s of "
             "inputs + outputs; for a case without products, also as a fraction of a device-to-device copy of as "
             "many bytes (half read, half written) timed in the same run. "
             "Correctness: polyfuse against the NumPy reference (`ref*`: on a subset, see the notes) and against "
             "eager (tolerance widened by eager's own error); the largest absolute error in parentheses.", "",
             *table(records), "", "## Notes", ""]
    lines += [_notes(rec) for rec in records]
    return "\n".join(lines) + "\n"


def git_commit() -> str | None:
    """The commit of the checkout polyfuse is imported from, with ``+ changes`` where its ``polyfuse/`` differs
    from that commit (a copy of a working tree measures what is in it, not its HEAD); None for an installed
    package."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=PACKAGE_ROOT, capture_output=True, text=True, check=False,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if not head:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "polyfuse")
    return head + (" + changes" if changed else "")


def source_digest() -> str:
    """The first 12 hex digits of a SHA-256 of polyfuse's own sources (every ``.py`` and ``.h`` file of the
    package, by relative path): names the code measured whatever git says about the copy it ran from."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".h") and p.is_file()):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _rounds(meta: Mapping[str, Any]) -> str:
    rounds = meta.get("rounds", 1)
    return f"; the least of {rounds} rounds alternating over the candidates" if rounds > 1 else ""


def environment(*, command: str, sizes: str, seed: int, loader: str | None, timer: str, warmup_ms: float,
                rep_ms: float, rounds: int = 1, commit: str | None = None) -> dict[str, Any]:
    """The run's header: GPU, library versions, date, commit, command and timing settings."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": commit or git_commit(), "sources": source_digest(), "command": command, "sizes": sizes,
            "seed": seed, "loader": loader,
            "timer": timer, "warmup_ms": warmup_ms, "rep_ms": rep_ms, "rounds": rounds, "tf32": False,
            "magnitude": 1.0}


def write(out: Path, meta: Mapping[str, Any], records: list[Mapping[str, Any]]) -> None:
    """``gpu_bench.json`` (the header and every case) and ``gpu_bench.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps({**meta, "cases": records}, indent=1, default=str) + "\n")
    (out / "gpu_bench.md").write_text(markdown(records, meta))
