"""MLA decode on wgmma (hand schedule: 64 heads x 256 value columns per block, 64-key steps) against the default
schedule and torch.compile: correctness vs NumPy at small and bench sizes, then timing (do_bench median)."""
import dataclasses, sys, time
import numpy as np
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
from polyfuse.bench import baselines
from polyfuse.transforms import Schedule

NAME = "attn_mla_decode"
dev = None  # set in main


def hand(sizes, heads=64, cols=256, keys=64, splits=1):
    op = ops.get(NAME)
    sizes = op.sizes("decode", sizes)
    sch = Schedule(op.program("decode", **sizes))
    _, h, i, dv, _ = sch.get_loops("pv")
    h0, h1 = sch.split(h, [None, heads])
    dv0, _ = sch.split(dv, [None, cols])
    sch.reorder([i, h0, dv0, h1])
    sch.reverse_compute_at("out", dv0)
    for block in ("row_sum", "p_exp", "row_max", "score", "qk"):
        sch.recompute_at(block, sch.loop("pv", "dv_0"))
    *_, rows, kk, _ = sch.get_loops("qk")
    if splits > 1:
        steps = -(-sizes["Skv"] // (splits * keys))
        split, step, tile = sch.split(kk, [None, steps, keys])
        sch.reorder([split, step, rows, tile])
        sch.reverse_compute_at("score", split)
        sch.split_k_update("row_sum", split)
        sch.split_k_update("pv", split, factor_axis=3)
        sch.reverse_compute_at("score", step)
        rolled = ("row_max_rf", "row_sum_rf", "pv_rf")
    else:
        step, tile = sch.split(kk, [None, keys])
        sch.reorder([step, rows, tile])
        sch.reverse_compute_at("score", step)
        rolled = ("row_max", "row_sum", "pv")
    for block in rolled:
        sch.rolling_update(block, step)
    sch.compact_buffers()
    return sch, sizes


VARIANTS = {"at_top": dict(prefetch=False, producer_warp=False), "prefetch": dict(producer_warp=False),
            "producer": {}}


def kernels(sizes, splits=(1,)):
    op = ops.get(NAME)
    out = {}
    for n in splits:
        sch, sizes = hand(sizes, splits=n)
        for label, opts in VARIANTS.items():
            out[f"{label}/{n}"] = build(sch, "cuda", fp_contract=True,
                                        codegen=dataclasses.replace(CodegenOptions(), **opts))
    d = default_schedule(NAME, "decode", op.program("decode", **sizes), target="cuda", device=dev)
    out["default"] = build(d, "cuda", fp_contract=True)
    return out, sizes


def check(sizes, variants, splits=(1,)):
    op = ops.get(NAME)
    ks, sizes = kernels(sizes, splits)
    if variants == ("random",):
        ks.pop("default")
    tol = op.tolerance("decode", sizes)
    for magnitude in op.magnitudes:
        for variant in variants:
            inputs = op.inputs(3, "decode", sizes, magnitude, variant)
            ref = op.reference(inputs, "decode", sizes)
            for label, k in ks.items():
                got = k.run(inputs)
                r = ops.compare({n: got[n] for n in ref}, ref, tol)
                print(f"check {sizes['B']}x{sizes['Skv']} {variant}@{magnitude:g} {label}: "
                      f"{'OK' if r.ok else 'FAIL'} {r.line()}", flush=True)


def timing(sizes, splits):
    op = ops.get(NAME)
    ks, sizes = kernels(sizes, splits)
    inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
    res = {}
    for label, k in ks.items():
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda")
               for a in k.outputs]
        res[label] = min(do_bench(lambda: k(*ins, *out), warmup=10, rep=100, return_mode="median") for _ in range(2))
    fn = torch.compile(baselines.prepare(NAME, "decode", sizes))
    fn(inputs)
    res["torch.compile"] = min(do_bench(lambda: fn(inputs), warmup=10, rep=100, return_mode="median") for _ in range(2))
    print(f"time B={sizes['B']} Skv={sizes['Skv']} " + " ".join(f"{k}={v * 1000:.1f}us" for k, v in res.items()),
          flush=True)


if __name__ == "__main__":
    dev = loader("cuda").device_spec()
    what = sys.argv[1]
    if what == "sanitize":
        check({"B": 1, "Skv": 256, "H": 128, "Dv": 512, "Drope": 64}, ("random",), (1, 2))
    elif what == "check":
        check({"B": 2, "Skv": 256, "H": 128, "Dv": 512, "Drope": 64}, ("random", "leading_zeros", "special", "ties"),
              (1, 2))
        check({"B": 2, "Skv": 384, "H": 128, "Dv": 512, "Drope": 64}, ("random", "leading_zeros", "special"), (1, 3))
        check({**ops.get(NAME).presets["decode"]}, ("random", "leading_zeros"))
    else:
        for b, skv, splits in ((32, 4096, (1,)), (1, 4096, (8, 16, 32)), (1, 32768, (16, 32, 64)),
                               (32, 1024, (1,)), (8, 4096, (4, 8))):
            timing({**ops.get(NAME).presets["decode"], "B": b, "Skv": skv}, splits)
