"""GPU benchmark of the operator catalog: polyfuse's CUDA kernels against PyTorch, in one process.

For each operator and mode at its benchmark sizes (``Operator.presets``; ``--sizes test`` takes
the small test sizes, ``--sizes sweep`` the prefill preset at each of ``SWEEP_S`` queries = keys), on
the same inputs (``Operator.inputs``, magnitude 1):

- polyfuse: the operator's default GPU schedule for the device (``default_schedule(..., target="cuda",
  device=loader("cuda").device_spec())``), built
  with ``polyfuse.pipeline.build(sch, "cuda", fp_contract=True)`` (FMA contraction asked for, as
  ``polyfuse check --backend cuda`` asks); schedule and build times are recorded apart (compile time);
- PyTorch eager (``torch_ops.py``), ``torch.compile`` of it (compile time excluded), and the other
  PyTorch ways of ``torch_ops.alternatives``: SDPA under each backend and FlexAttention for
  attention, a built-in for some of the others;
- correctness: every result against the operator's float64 NumPy reference with its tolerance
  (``Operator.tolerance``; attention on a subset of rows, heads or batch where the full reference
  would be too large: the table marks it ``ref*`` and the notes say which), and polyfuse against
  eager with the tolerance widened by eager's own error against the reference;
- timing: the median GPU time of each, side by side, with ``triton.testing.do_bench`` (CUDA events
  where Triton is missing).

Results go to ``--out`` (default ``benchmarks/results/DATE_GPU``) as ``gpu_bench.md`` and
``gpu_bench.json`` (rewritten after every case, so an interrupted run keeps what it measured)::

    python benchmarks/gpu_bench.py                                  # the whole catalog
    python benchmarks/gpu_bench.py --ops attn_causal,softmax --sizes test
    python benchmarks/gpu_bench.py --ops attn_gqa --modes decode --no-compile
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import re
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda"
WARM_UP_S = 2.0
"""Seconds of matrix products before the first case (GPU clocks ramp up from idle)."""
REF_ELEMENTS = 1 << 24
"""Largest float64 array (elements) the NumPy attention reference may build before it runs on a subset."""
TORCH_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i32": "int32",
                "i64": "int64", "bool": "bool", "fp8e4m3": "float8_e4m3fn"}
NUMPY_VIEWS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn")}
"""ml_dtypes arrays PyTorch cannot take directly: (NumPy view dtype, torch dtype)."""
SWEEP_S = (1024, 2048, 4096, 8192, 16384)
"""Sequence lengths of ``--sizes sweep`` (queries = keys): a rule of the code generator is judged on more than
one shape."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--ops", default="", help="comma-separated operator names (default: the whole catalog)")
    parser.add_argument("--modes", default="", help="comma-separated modes or preset keys, e.g. prefill,decode_b32")
    parser.add_argument("--sizes", choices=("bench", "test", "sweep"), default="bench",
                        help="bench: Operator.presets (model shapes); test: the small test sizes; sweep: the "
                             "prefill preset at sequence lengths " + ", ".join(map(str, SWEEP_S)))
    parser.add_argument("--out", default=None, help="output folder (default benchmarks/results/DATE_GPU)")
    parser.add_argument("--loader", choices=("cuda-python", "pycuda"), default=None,
                        help="polyfuse's CUDA driver binding (default: pycuda if installed, else cuda-python)")
    parser.add_argument("--commit", default=None, help="polyfuse commit to record (default: git rev-parse HEAD)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench measuring time, ms")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (and FlexAttention)")
    parser.add_argument("--no-reference", action="store_true", help="skip the NumPy reference")
    return parser.parse_args(argv)


# ------------------------------------------------------------------ arrays

def to_torch(a: Any, device: str) -> Any:
    import numpy as np
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype.name in NUMPY_VIEWS:
        view, dtype = NUMPY_VIEWS[a.dtype.name]
        return torch.from_numpy(a.view(view)).view(getattr(torch, dtype)).to(device)
    return torch.from_numpy(a).to(device)


def to_numpy(t: Any) -> Any:
    """A host copy for comparisons: low-precision floats widened to f32 (exactly)."""
    t = t.detach()
    if t.is_floating_point() and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def make_timer(warmup: float, rep: float) -> tuple[Callable[[Callable[[], Any]], float], str]:
    """``time(fn)`` -> median milliseconds, and the method's name."""
    try:
        from triton.testing import do_bench

        return (lambda fn: float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))), "triton.do_bench"
    except ImportError:
        return (lambda fn: _events_median(fn, warmup, rep)), "cuda-events"


def warm_up_gpu(seconds: float) -> None:
    """Run bf16 matrix products for ``seconds``, so that the first case is not timed at idle clocks."""
    import torch

    a = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _events_median(fn: Callable[[], Any], warmup: float, rep: float) -> float:
    import statistics

    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    pairs = []
    for _ in range(max(1, int(rep / estimate))):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


# ------------------------------------------------------------------ cases and reference

def cases(op: Any, which: str, wanted: set[str]) -> list[tuple[str, str, dict[str, int]]]:
    """(preset key, mode, sizes) of ``op``; a preset key is a mode, optionally with a suffix."""
    if which == "test":
        found = [(m, m, op.sizes(m)) for m in op.modes]
    elif which == "sweep":
        preset = op.presets.get("prefill") if "prefill" in op.modes else None
        found = [] if preset is None else [
            (f"prefill_s{n}", "prefill", op.sizes("prefill", {**preset, "Sq": n, "Skv": n})) for n in SWEEP_S]
    else:
        found = []
        for key, preset in op.presets.items():
            mode = key if key in op.modes else key.split("_")[0]
            found.append((key, mode, op.sizes(mode, preset)))
    return [c for c in found if not wanted or c[0] in wanted or c[1] in wanted]


def reference_subset(name: str, mode: str, sizes: dict[str, int], inputs: dict[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, int], Callable[[Any], Any], str]:
    """Inputs and sizes on which the NumPy reference stays below REF_ELEMENTS per array, a function
    slicing a full output to that subset, and a note ('' when nothing was left out).

    Exact subsets only: the batch, the last query rows (queries are the last Sq of Skv positions,
    so the rows keep their masks and ALiBi offsets) and the first query heads with their kv heads
    (not for ALiBi, whose slopes depend on the head count)."""
    import torch_ops

    if not torch_ops.is_attention(name):
        return inputs, sizes, (lambda a: a), ""
    variant, d = torch_ops.attention_dims(name, mode, sizes)

    def elements(b: int, h: int, sq: int) -> int:
        return b * h * d.Skv * max(sq, d.D, d.Dv)

    b, h, sq = d.B, d.Hq, d.Sq
    if elements(b, h, sq) > REF_ELEMENTS:
        b = 1
    while elements(b, h, sq) > REF_ELEMENTS and sq > max(d.D, d.Dv):
        sq //= 2
    while elements(b, h, sq) > REF_ELEMENTS and not variant.alibi and h > 1:
        h //= 2
        while h >= d.group and h % d.group:
            h -= 1
    while elements(b, h, sq) > REF_ELEMENTS and sq > 1:
        sq //= 2
    hkv = h // d.group if h >= d.group else 1
    if (b, h, sq) == (d.B, d.Hq, d.Sq):
        return inputs, sizes, (lambda a: a), ""
    sub = {"q": inputs["q"][:b, :h, d.Sq - sq:]}
    if variant.latent_kv:
        sub["kv"] = inputs["kv"][:b]
        sub_sizes = dict(sizes, B=b, H=h)
    else:
        sub["k"], sub["v"] = inputs["k"][:b, :hkv], inputs["v"][:b, :hkv]
        sub_sizes = dict(sizes, B=b, Hq=h, Hkv=hkv, Sq=sq)
    kept = [f"batch {b}/{d.B}" if b < d.B else "", f"query heads {h}/{d.Hq}" if h < d.Hq else "",
            f"the last {sq}/{d.Sq} query rows" if sq < d.Sq else ""]
    note = "reference on " + ", ".join(k for k in kept if k)
    return sub, sub_sizes, (lambda a: a[:b, :h, d.Sq - sq:]), note


def check(results: dict[str, Any], reference: dict[str, Any], tolerance: dict[str, tuple[float, float]],
          view: Callable[[Any], Any] = lambda a: a) -> dict[str, dict[str, Any]]:
    """Per output: ok, max_abs_err, max_rel_err, tol, worst (polyfuse.ops.compare on ``view`` of it)."""
    from polyfuse.ops import compare

    report = {}
    for name, ref in reference.items():
        try:
            c = compare({name: view(results[name])}, {name: ref}, {name: tolerance[name]})
            report[name] = {"ok": c.ok, "max_abs_err": c.max_abs_err, "max_rel_err": c.max_rel_err, "tol": c.tol,
                            "worst": c.worst}
        except Exception as err:  # a missing output or a wrong shape
            report[name] = {"ok": False, "max_abs_err": None, "max_rel_err": None, "tol": "", "worst": _line(err)}
    return report


def _line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:400]


# ------------------------------------------------------------------ one case

def first_call(fn: Callable[[], Any], caught: list[str]) -> tuple[Any, float]:
    """Run ``fn`` once (compiling whatever it compiles) and wait: its result and seconds; the
    warnings it raised (SDPA says there why a backend refuses) are added to ``caught``."""
    import torch

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        try:
            start = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            return out, time.perf_counter() - start
        finally:
            texts = (" ".join(re.sub(r"\(Triggered internally at [^)]*\)", "", str(w.message)).split())
                     for w in recorded)
            # SDPA warns once per backend it rules out; the headers and "runtime disabled" say nothing.
            caught.extend(dict.fromkeys(t[:300] for t in texts
                                        if t and not t.endswith("because:") and "runtime disabled" not in t))


def run_case(name: str, key: str, mode: str, sizes: dict[str, int], args: argparse.Namespace,
             timer: Callable[[Callable[[], Any]], float]) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch_ops

    from polyfuse import ops
    from polyfuse.pipeline import build
    from polyfuse.ops.schedules import default_schedule
    from polyfuse.runtime.loaders import loader

    op = ops.get(name)
    rec: dict[str, Any] = {"operator": name, "mode": key, "sizes": sizes,
                           "sizes_text": torch_ops.describe_sizes(name, mode, sizes), "candidates": {}, "notes": []}
    start = time.perf_counter()
    inputs_np = op.inputs(args.seed, mode, sizes, magnitude=1.0)
    inputs = {n: to_torch(a, DEVICE) for n, a in inputs_np.items()}
    program = op.program(mode, **sizes)
    out_bytes = sum(int(np.prod([int(getattr(s, "value", s)) for s in t.shape])) * t.dtype.numpy.itemsize
                    for t in program.outputs)
    rec["bytes"] = sum(a.nbytes for a in inputs_np.values()) + out_bytes
    rec["flops"] = torch_ops.flops(name, mode, sizes)
    rec["inputs_s"] = time.perf_counter() - start
    tol = op.tolerance(mode, sizes)

    reference, view = None, (lambda a: a)
    if not args.no_reference:
        try:
            start = time.perf_counter()
            sub_inputs, sub_sizes, view, note = reference_subset(name, mode, sizes, inputs_np)
            reference = op.reference(sub_inputs, mode, sub_sizes)
            rec["reference_s"] = time.perf_counter() - start
            rec["reference_subset"] = note
            if note:
                rec["notes"].append(note)
        except Exception as err:
            rec["notes"].append(f"NumPy reference failed: {_line(err)}")
    del inputs_np

    candidates: dict[str, Callable[[], Any] | str] = {}
    # polyfuse
    try:
        device = loader("cuda", args.loader).device_spec()  # the device build() compiles for
        rec["device"] = device.describe()
        start = time.perf_counter()
        sch = default_schedule(name, mode, program, target="cuda", device=device)
        rec["schedule_s"] = time.perf_counter() - start
        start = time.perf_counter()
        kernel = build(sch, "cuda", loader=args.loader, fp_contract=True)  # as `polyfuse check --backend cuda`
        rec["build_s"] = time.perf_counter() - start
        ins = [inputs[a.name] for a in kernel.inputs]
        outs = []
        for a in kernel.outputs:
            shape = tuple(s if isinstance(s, int) else sizes[s] for s in a.shape)
            dtype = getattr(torch, TORCH_DTYPES[a.dtype.name])
            fill = float("nan") if dtype.is_floating_point else -1
            outs.append(torch.full(shape, fill, dtype=dtype, device=DEVICE))
        named_outs = {a.name: t for a, t in zip(kernel.outputs, outs, strict=True)}

        def run_polyfuse() -> dict[str, Any]:
            kernel(*ins, *outs)
            return named_outs
        candidates["polyfuse"] = run_polyfuse
    except Exception as err:
        candidates["polyfuse"] = f"schedule/build failed: {_line(err)}"
        rec["polyfuse_traceback"] = traceback.format_exc(limit=6)

    prepared = torch_ops.prepare(name, mode, sizes)
    candidates["eager"] = lambda: prepared(inputs)
    if args.no_compile:
        candidates["torch.compile"] = "skipped (--no-compile)"
    else:
        names = list(inputs)
        compiled = torch.compile(lambda *ts: prepared(dict(zip(names, ts, strict=True))))
        tensors = [inputs[n] for n in names]
        candidates["torch.compile"] = lambda: compiled(*tensors)
    try:
        for label, alt in torch_ops.alternatives(name, inputs, mode, sizes).items():
            skip_flex = label == "flex" and args.no_compile
            candidates[label] = "skipped (--no-compile)" if skip_flex else alt
    except Exception as err:
        rec["notes"].append(f"alternatives failed: {_line(err)}")

    results = {}
    for label, fn in candidates.items():
        entry: dict[str, Any] = {}
        rec["candidates"][label] = entry
        if isinstance(fn, str):
            entry["error"] = fn
            continue
        print(f"    {label} ...", end="", flush=True)
        caught: list[str] = []
        try:
            out, entry["first_call_s"] = first_call(fn, caught)
            results[label] = {n: to_numpy(t) for n, t in out.items()}
            del out
            if reference is not None:
                entry["check"] = check(results[label], reference, tol, view)
            entry["ms"] = timer(fn)
            print(f" {entry['ms']:.4f} ms", flush=True)
        except Exception as err:
            entry["error"] = _line(err)
            if caught:
                entry["warnings"] = caught
            print(f" {entry['error']}", flush=True)
            broken = context_broken(err)
            if broken:
                rec["fatal"] = broken
                rec["notes"].append(broken)
                break
    if "polyfuse" in results and "eager" in results:
        widened = dict(tol)
        eager_check = rec["candidates"]["eager"].get("check", {})
        for n, (atol, rtol) in tol.items():
            if eager_check.get(n, {}).get("max_abs_err") is not None:
                widened[n] = (atol + eager_check[n]["max_abs_err"], rtol)
        rec["polyfuse_vs_eager"] = check(results["polyfuse"], results["eager"], widened)
    return rec


def context_broken(err: BaseException) -> str | None:
    """After a failure: why the CUDA context is unusable (every later case would fail), or None."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as sync_err:
        return (f"the CUDA context is broken after {_line(err)} ({_line(sync_err)}): the run stops here; "
                f"rerun with --ops leaving this operator out")
    return None


# ------------------------------------------------------------------ report

def _ms(entry: dict[str, Any] | None) -> float | None:
    return None if entry is None else entry.get("ms")


def summary(rec: dict[str, Any]) -> dict[str, Any]:
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
    return row


def correctness(rec: dict[str, Any]) -> str:
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


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# polyfuse GPU benchmark — {meta['gpu']}", "",
             f"{meta['date']}; polyfuse {meta['commit'] or 'commit unknown'}; torch {meta['torch']}, "
             f"triton {meta['triton']}, CUDA {meta['cuda']}; timing {meta['timer']} (median, "
             f"warm-up {meta['warmup_ms']:g} ms, {meta['rep_ms']:g} ms measured); sizes {meta['sizes']}; "
             f"`{meta['command']}`", "",
             "Times in ms; a ratio is the other's time over polyfuse's (above 1: polyfuse is faster). "
             "Throughput is polyfuse's: TFLOP/s of the products (attention: visible pairs only) and GB/s of "
             "inputs + outputs. "
             "Correctness: polyfuse against the NumPy reference (`ref*`: on a subset, see the notes) and against "
             "eager (tolerance widened by eager's own error); the largest absolute error in parentheses.", "",
             "| operator | mode | sizes | polyfuse | eager | compile | best SDPA (backend) | flex | eager/pf | "
             "compile/pf | best other/pf | polyfuse throughput | correctness |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|---|"]
    for rec in records:
        s = summary(rec)
        sdpa = f"{s['best_sdpa'][0]:.3f} ({s['best_sdpa'][1]})" if s["best_sdpa"] else "–"
        other = f"{_f(s['best_other_ratio'], '.2f')} ({s['best_other'][1]})" if s["best_other"] else "–"
        through = f"{s['gbps']:.0f} GB/s" if s.get("gbps") else "–"
        if s.get("tflops"):
            through = f"{s['tflops']:.1f} TFLOP/s, {through}"
        cells = [rec["operator"], rec["mode"], rec["sizes_text"], _f(s["polyfuse_ms"], ".4f"), _f(s["eager_ms"], ".4f"),
                 _f(s["compile_ms"], ".4f"), sdpa, _f(s["flex_ms"], ".4f"), _f(s["eager_ratio"], ".2f"),
                 _f(s["compile_ratio"], ".2f"), other, through, correctness(rec)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Notes", ""]
    for rec in records:
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
        lines.append(f"- **{rec['operator']} {rec['mode']}**: " + "; ".join(notes))
    return "\n".join(lines) + "\n"


def environment(args: argparse.Namespace, timer_name: str) -> dict[str, Any]:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                    check=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": commit,
            "command": " ".join(["python", *sys.argv]), "sizes": args.sizes, "seed": args.seed,
            "loader": args.loader, "timer": timer_name, "warmup_ms": args.warmup, "rep_ms": args.rep,
            "tf32": False, "magnitude": 1.0}


def write(out: Path, meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_bench.json").write_text(json.dumps({**meta, "cases": records}, indent=1, default=str) + "\n")
    (out / "gpu_bench.md").write_text(markdown(records, meta))


# ------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (str(REPO), str(REPO / "benchmarks")):
        if path not in sys.path:
            sys.path.insert(0, path)
    import torch
    import torch_ops

    from polyfuse import ops

    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device visible to PyTorch", file=sys.stderr)
        return 4
    names = [n for n in args.ops.split(",") if n] or torch_ops.names()
    unknown = [n for n in names if n not in ops.names()]
    if unknown:
        print(f"gpu_bench: unknown operator(s) {', '.join(unknown)}; known: {', '.join(ops.names())}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.cuda.init()
    timer, timer_name = make_timer(args.warmup, args.rep)
    warm_up_gpu(WARM_UP_S)
    meta = environment(args, timer_name)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", meta["gpu"]).strip("-")
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"{meta['date'][:10]}_{slug}"
    print(f"gpu_bench: {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}; "
          f"results in {out}", flush=True)

    wanted = {m for m in args.modes.split(",") if m}
    records: list[dict[str, Any]] = []
    for name in names:
        for key, mode, sizes in cases(ops.get(name), args.sizes, wanted):
            print(f"{name} {key} {' '.join(f'{k}={v}' for k, v in sizes.items())}", flush=True)
            torch._dynamo.reset()
            try:
                records.append(run_case(name, key, mode, sizes, args, timer))
            except Exception as err:
                print(f"  failed: {_line(err)}", flush=True)
                records.append({"operator": name, "mode": key, "sizes": sizes, "sizes_text": str(sizes),
                                "candidates": {}, "notes": [f"case failed: {_line(err)}"],
                                "traceback": traceback.format_exc(limit=8), "fatal": context_broken(err)})
            gc.collect()
            if not records[-1].get("fatal"):
                torch.cuda.empty_cache()
            write(out, meta, records)
            if records[-1].get("fatal"):
                print(f"gpu_bench: {records[-1]['fatal']}", file=sys.stderr, flush=True)
                print("\n" + markdown(records, meta), flush=True)
                return 1
    print("\n" + markdown(records, meta), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
