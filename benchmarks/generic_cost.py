"""What one kernel for every outer size costs: each catalog GPU kernel with size parameters (``gpu_symbolic``)
against the kernel of the same operator built for fixed sizes, at the bench preset, on the GPU.

    python benchmarks/generic_cost.py [--ops a,b] [--out DIR]

Both kernels are built as ``polyfuse check --backend cuda`` builds (contracted multiply-adds) for the device, run
on the same inputs (their outputs must agree to the operator's tolerance), and timed alternately with the bench's
timer (``triton.testing.do_bench``, CUDA events without Triton), three rounds each, the median kept.  Prints a
Markdown table and writes it to ``DIR/generic_cost.md`` with the raw times in ``generic_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from polyfuse import ops  # noqa: E402
from polyfuse.bench.measure import DEVICE, make_timer, to_torch, warm_up_gpu  # noqa: E402
from polyfuse.ops.schedules import default_schedule  # noqa: E402
from polyfuse.pipeline import build  # noqa: E402
from polyfuse.runtime.gpu import TORCH_DTYPES  # noqa: E402
from polyfuse.runtime.loaders import loader  # noqa: E402

ROUNDS = 3


def _kernel(name: str, mode: str, generic: bool, sizes: dict[str, int]):
    op = ops.get(name)
    program = op.generic_program(mode, "cuda", **sizes) if generic else op.program(mode, **sizes)
    device = loader("cuda").device_spec()
    return build(default_schedule(name, mode, program, "cuda", device=device), "cuda", fp_contract=True)


def measure(name: str, mode: str, timer) -> dict:
    import torch

    op = ops.get(name)
    sizes = dict(op.presets[mode])
    inputs = {k: to_torch(a, DEVICE) for k, a in op.inputs(0, mode, sizes).items()}
    kernels = {"fixed": _kernel(name, mode, False, sizes), "generic": _kernel(name, mode, True, sizes)}
    calls, outputs = {}, {}
    for label, kernel in kernels.items():
        ins = [inputs[a.name] for a in kernel.inputs]
        outs = [torch.empty(tuple(s if isinstance(s, int) else sizes[s] for s in a.shape),
                            dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device=DEVICE) for a in kernel.outputs]
        calls[label] = (lambda k=kernel, i=ins, o=outs: k(*i, *o))
        calls[label]()
        outputs[label] = {a.name: o for a, o in zip(kernel.outputs, outs, strict=True)}
    torch.cuda.synchronize()
    agree = ops.compare({k: v.float().cpu().numpy() for k, v in outputs["generic"].items()},
                        {k: v.float().cpu().numpy() for k, v in outputs["fixed"].items()}, op.tolerance(mode, sizes))
    times: dict[str, list[float]] = {"fixed": [], "generic": []}
    for _ in range(ROUNDS):
        for label in ("fixed", "generic"):
            times[label].append(timer(calls[label]))
    fixed, generic = statistics.median(times["fixed"]), statistics.median(times["generic"])
    return {"operator": name, "mode": mode, "sizes": sizes, "parameters": list(op.gpu_symbolic[mode]),
            "fixed_ms": fixed, "generic_ms": generic, "ratio": generic / fixed, "times": times,
            "agree": agree.ok, "agreement": agree.line()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated operators (default: every one with gpu_symbolic sizes)")
    parser.add_argument("--out", type=Path, default=Path("generic_cost"))
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--rep", type=float, default=100.0)
    args = parser.parse_args()
    names = args.ops.split(",") if args.ops else [n for n in ops.names() if ops.get(n).gpu_symbolic]
    timer, how = make_timer(args.warmup, args.rep)
    warm_up_gpu(1.0)
    device = loader("cuda").device_spec().describe()
    lines = [f"device: {device}; timer: {how}, median of {ROUNDS} alternating rounds", "",
             "| operator | mode | sizes | parameters | fixed ms | generic ms | generic/fixed | outputs agree |",
             "|---|---|---|---|---|---|---|---|"]
    records = []
    for name in names:
        for mode in ops.get(name).gpu_symbolic:
            try:
                r = measure(name, mode, timer)
            except Exception as err:  # one operator failing must not hide the others' numbers
                lines.append(f"| {name} | {mode} | | | failed: {type(err).__name__}: {str(err)[:200]} | | | |")
                print(lines[-1], flush=True)
                continue
            records.append(r)
            sizes = " ".join(f"{k}={v}" for k, v in r["sizes"].items())
            agree = "yes" if r["agree"] else "NO: " + r["agreement"]
            lines.append(f"| {name} | {mode} | {sizes} | {', '.join(r['parameters'])} | {r['fixed_ms']:.4f} | "
                         f"{r['generic_ms']:.4f} | {r['ratio']:.3f} | {agree} |")
            print(lines[-1], flush=True)
    if records:
        ratios = [r["ratio"] for r in records]
        lines += ["", f"generic/fixed over {len(ratios)} kernels: median {statistics.median(ratios):.3f}, "
                      f"min {min(ratios):.3f}, max {max(ratios):.3f}"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generic_cost.md").write_text("\n".join(lines) + "\n")
    (args.out / "generic_cost.json").write_text(json.dumps({"device": device, "records": records}, indent=1))
    print("\n".join(lines))
    return 0 if records and all(r["agree"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
