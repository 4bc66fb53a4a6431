"""One benchmark case, measured: polyfuse's CUDA kernel and the PyTorch baselines on the same inputs.

- polyfuse: the operator's default GPU schedule for the device (``default_schedule(..., target="cuda",
  device=loader("cuda").device_spec())``) of its generic program for the GPU (``Operator.generic_program(mode,
  "cuda")``, the kernel ``polyfuse check --backend cuda`` runs: the sizes of ``gpu_symbolic`` are parameters; every
  size fixed with ``BenchOptions.static_sizes``), built with ``polyfuse.pipeline.build(sch, "cuda", fp_contract=True)``
  (FMA contraction asked for, as ``polyfuse check --backend cuda`` asks); schedule and build times are recorded
  apart (compile time);
- PyTorch eager (:mod:`polyfuse.bench.baselines`), ``torch.compile`` of it (compile time excluded), and the other
  PyTorch ways of ``baselines.alternatives``: SDPA under each backend and FlexAttention for attention, a built-in
  for some of the others;
- correctness: every result against the operator's float64 NumPy reference with its tolerance (attention on a
  subset of rows, heads or batch where the full reference would be too large, :func:`reference_subset`), and
  polyfuse against eager with the tolerance widened by eager's own error against the reference;
- timing: the median GPU time of each, with ``triton.testing.do_bench`` (CUDA events where Triton is missing), in
  ``rounds`` rounds that alternate over the candidates (and the copy), the least of each candidate's medians
  kept: a candidate timed once, right after another, inherits the state that one left (clocks, the L2 its writes
  dirtied), which moved ratios of nearly equal kernels by a few percent from run to run.

PyTorch is imported where it is used, so that the module imports without it.
"""

from __future__ import annotations

import re
import statistics
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from polyfuse import ops
from polyfuse.bench import baselines
from polyfuse.bench.cases import Case
from polyfuse.errors import PolyfuseError
from polyfuse.runtime.gpu import TORCH_DTYPES

DEVICE = "cuda"
REF_ELEMENTS = 1 << 24
"""Largest float64 array (elements) the NumPy attention reference may build before it runs on a subset."""
NUMPY_VIEWS = {"bfloat16": ("int16", "bfloat16"), "float8_e4m3fn": ("uint8", "float8_e4m3fn")}
"""ml_dtypes arrays PyTorch cannot take directly: (NumPy view dtype, torch dtype)."""

Timer = Callable[[Callable[[], Any]], float]
"""``time(fn)`` -> median milliseconds."""
Progress = Callable[[str], None]
"""Told the label of each candidate as it starts, then its time or error."""


@dataclass(frozen=True)
class BenchOptions:
    """How a run measures: the inputs' seed, polyfuse's CUDA loader (None: pycuda if installed, else cuda-python),
    do_bench's warm-up and measuring time (ms), the rounds of timings alternating over the candidates, whether
    torch.compile (and FlexAttention) and the NumPy reference run."""

    seed: int = 0
    loader: str | None = None
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    rounds: int = 3
    compile: bool = True
    reference: bool = True
    static_sizes: bool = False
    """Build polyfuse's kernel for the case's sizes, every one fixed, instead of the generic kernel (whose
    ``gpu_symbolic`` sizes are parameters, one kernel for all their values)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise PolyfuseError(f"BenchOptions.rounds is {self.rounds!r}: the timings need at least one round")


# ------------------------------------------------------------------ arrays and timing

def to_torch(a: Any, device: str) -> Any:
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


def make_timer(warmup: float, rep: float) -> tuple[Timer, str]:
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


# ------------------------------------------------------------------ reference

def reference_subset(name: str, mode: str, sizes: dict[str, int], inputs: dict[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, int], Callable[[Any], Any], str]:
    """Inputs and sizes on which the NumPy reference stays below REF_ELEMENTS per array, a function
    slicing a full output to that subset, and a note ('' when nothing was left out).

    Exact subsets only: the batch, the last query rows (queries are the last Sq of Skv positions,
    so the rows keep their masks and ALiBi offsets) and the first query heads with their kv heads
    (not for ALiBi, whose slopes depend on the head count)."""
    if not baselines.is_attention(name):
        return inputs, sizes, (lambda a: a), ""
    variant, d = baselines.attention_dims(name, mode, sizes)

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
    report = {}
    for name, ref in reference.items():
        try:
            c = ops.compare({name: view(results[name])}, {name: ref}, {name: tolerance[name]})
            report[name] = {"ok": c.ok, "max_abs_err": c.max_abs_err, "max_rel_err": c.max_rel_err, "tol": c.tol,
                            "worst": c.worst}
        except Exception as err:  # a missing output or a wrong shape
            report[name] = {"ok": False, "max_abs_err": None, "max_rel_err": None, "tol": "", "worst": one_line(err)}
    return report


def one_line(err: BaseException) -> str:
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


def _polyfuse_candidate(case: Case, inputs: dict[str, Any], options: BenchOptions,
                        rec: dict[str, Any]) -> Callable[[], Any] | str:
    """polyfuse's kernel as a candidate (schedule and build times into ``rec``), or why it could not be built."""
    import torch

    from polyfuse.ops.schedules import default_schedule
    from polyfuse.pipeline import build
    from polyfuse.runtime.loaders import loader

    try:
        device = loader("cuda", options.loader).device_spec()  # the device build() compiles for
        rec["device"] = device.describe()
        start = time.perf_counter()
        op, sizes = ops.get(case.operator), dict(case.sizes)
        program = (op.program(case.mode, **sizes) if options.static_sizes
                   else op.generic_program(case.mode, "cuda", **sizes))
        sch = default_schedule(case.operator, case.mode, program, target="cuda", device=device)
        rec["schedule_s"] = time.perf_counter() - start
        start = time.perf_counter()
        kernel = build(sch, "cuda", loader=options.loader, fp_contract=True)  # as `polyfuse check --backend cuda`
        rec["build_s"] = time.perf_counter() - start
    except Exception as err:
        rec["polyfuse_traceback"] = traceback.format_exc(limit=6)
        return f"schedule/build failed: {one_line(err)}"
    ins = [inputs[a.name] for a in kernel.inputs]
    outs = []
    for a in kernel.outputs:
        shape = tuple(s if isinstance(s, int) else case.sizes[s] for s in a.shape)
        dtype = getattr(torch, TORCH_DTYPES[a.dtype.name])
        fill = float("nan") if dtype.is_floating_point else -1
        outs.append(torch.full(shape, fill, dtype=dtype, device=DEVICE))
    named_outs = {a.name: t for a, t in zip(kernel.outputs, outs, strict=True)}

    def run_polyfuse() -> dict[str, Any]:
        kernel(*ins, *outs)
        return named_outs
    return run_polyfuse


def run_case(case: Case, options: BenchOptions, timer: Timer, progress: Progress) -> dict[str, Any]:
    """The record of one case: sizes, work, and per candidate its first call, time, check or error."""
    import torch

    name, mode, sizes = case.operator, case.mode, dict(case.sizes)
    op = ops.get(name)
    rec: dict[str, Any] = {"operator": name, "mode": case.key, "group": case.group, "axis": list(case.axis),
                           "sizes": sizes, "sizes_text": baselines.describe_sizes(name, mode, sizes),
                           "candidates": {}, "notes": []}
    start = time.perf_counter()
    inputs_np = op.inputs(options.seed, mode, sizes, magnitude=1.0)
    inputs = {n: to_torch(a, DEVICE) for n, a in inputs_np.items()}
    program = op.program(mode, **sizes)
    out_bytes = sum(int(np.prod([int(getattr(s, "value", s)) for s in t.shape])) * t.dtype.numpy.itemsize
                    for t in program.outputs)
    rec["bytes"] = sum(a.nbytes for a in inputs_np.values()) + out_bytes
    rec["flops"] = baselines.flops(name, mode, sizes)
    rec["inputs_s"] = time.perf_counter() - start
    tol = op.tolerance(mode, sizes)

    reference, view = None, (lambda a: a)
    if options.reference:
        try:
            start = time.perf_counter()
            sub_inputs, sub_sizes, view, note = reference_subset(name, mode, sizes, inputs_np)
            reference = op.reference(sub_inputs, mode, sub_sizes)
            rec["reference_s"] = time.perf_counter() - start
            rec["reference_subset"] = note
            if note:
                rec["notes"].append(note)
        except Exception as err:
            rec["notes"].append(f"NumPy reference failed: {one_line(err)}")
    del inputs_np

    candidates: dict[str, Callable[[], Any] | str] = {
        "polyfuse": _polyfuse_candidate(case, inputs, options, rec)}
    prepared = baselines.prepare(name, mode, sizes)
    candidates["eager"] = lambda: prepared(inputs)
    if not options.compile:
        candidates["torch.compile"] = "skipped (--no-compile)"
    else:
        names = list(inputs)
        compiled = torch.compile(lambda *ts: prepared(dict(zip(names, ts, strict=True))))
        tensors = [inputs[n] for n in names]
        candidates["torch.compile"] = lambda: compiled(*tensors)
    try:
        for label, alt in baselines.alternatives(name, inputs, mode, sizes).items():
            skip_flex = label == "flex" and not options.compile
            candidates[label] = "skipped (--no-compile)" if skip_flex else alt
    except Exception as err:
        rec["notes"].append(f"alternatives failed: {one_line(err)}")

    results = {}
    timed: dict[str, Callable[[], Any]] = {}
    for label, fn in candidates.items():
        entry: dict[str, Any] = {}
        rec["candidates"][label] = entry
        if isinstance(fn, str):
            entry["error"] = fn
            continue
        progress(label)
        caught: list[str] = []
        try:
            out, entry["first_call_s"] = first_call(fn, caught)
            results[label] = {n: to_numpy(t) for n, t in out.items()}
            del out
            if reference is not None:
                entry["check"] = check(results[label], reference, tol, view)
            timed[label] = fn
        except Exception as err:
            entry["error"] = one_line(err)
            if caught:
                entry["warnings"] = caught
            broken = context_broken(err)
            if broken:
                rec["fatal"] = broken
                rec["notes"].append(broken)
                timed.clear()
                break
    if not rec["flops"] and not rec.get("fatal"):
        # The bandwidth a memory-bound kernel can reach, measured in the same run: a device-to-device copy that
        # reads and writes as many bytes as the case's inputs and outputs.
        try:
            src = torch.empty(rec["bytes"] // 2, dtype=torch.uint8, device=DEVICE)
            dst = torch.empty_like(src)
            timed["copy"] = lambda: dst.copy_(src)
        except Exception as err:
            rec["notes"].append(f"copy: {one_line(err)}")
    rounds = time_rounds(timed, options.rounds, timer, progress, rec)
    for label, times in rounds.items():
        entry = rec["candidates"][label] if label != "copy" else rec
        key = "ms" if label != "copy" else "copy_ms"
        entry[key] = min(times)
        entry[f"{key}_rounds"] = times
    if "polyfuse" in results and "eager" in results:
        widened = dict(tol)
        eager_check = rec["candidates"]["eager"].get("check", {})
        for n, (atol, rtol) in tol.items():
            if eager_check.get(n, {}).get("max_abs_err") is not None:
                widened[n] = (atol + eager_check[n]["max_abs_err"], rtol)
        rec["polyfuse_vs_eager"] = check(results["polyfuse"], results["eager"], widened)
    return rec


def time_rounds(timed: dict[str, Callable[[], Any]], rounds: int, timer: Timer, progress: Progress,
                rec: dict[str, Any]) -> dict[str, list[float]]:
    """Each of ``timed``'s median times in ``rounds`` rounds that alternate over them, by label; a candidate whose
    timing fails is recorded as failed in ``rec`` and leaves the rounds (a broken context ends them)."""
    times: dict[str, list[float]] = {label: [] for label in timed}
    for r in range(rounds):
        for label in list(timed):
            progress(f"{label} (round {r + 1} of {rounds})")
            try:
                times[label].append(timer(timed[label]))
            except Exception as err:
                del timed[label], times[label]
                if label == "copy":
                    rec["notes"].append(f"copy: {one_line(err)}")
                else:
                    rec["candidates"][label]["error"] = one_line(err)
                broken = context_broken(err)
                if broken:
                    rec["fatal"] = broken
                    rec["notes"].append(broken)
                    return times
    return times


def context_broken(err: BaseException) -> str | None:
    """After a failure: why the CUDA context is unusable (every later case would fail), or None."""
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as sync_err:
        return (f"the CUDA context is broken after {one_line(err)} ({one_line(sync_err)}): the run stops here; "
                f"rerun leaving this operator out")
    return None
