"""Experiment (not polyfuse code): decode with a split's partial product sum (pv_rf) kept in shared memory across
the key loop, as resident.py keeps the row statistics, against the default (which excludes products), same
process, alternating, same inputs.  usage: resexp.py OPS PRESET [SIZE=N ...]"""
import sys
import torch
from triton.testing import do_bench
import polyfuse.pipeline as P
from polyfuse import ops
from polyfuse.emit_cpp import resident
from polyfuse.ops.schedules import default_schedule
TORCH_DTYPES = None if __import__("sys").argv[1] == "--plan" else __import__("polyfuse.runtime.gpu", fromlist=["x"]).TORCH_DTYPES
from polyfuse.runtime.loaders import loader
from polyfuse.tiling.htile import Dot, TileStore, walk_tile_expr, walk_tile_stmts
original = resident.plan
def with_products(frame, loop, registers, fresh):
    # the same rule with the products' accumulators allowed: hide the Dot from the rule by planning on a copy
    kept = original(frame, loop, registers, fresh)
    names = {k.tensor for k in kept}
    extra = []
    for s in walk_tile_stmts(loop.body):
        if isinstance(s, TileStore) and s.tensor.name not in names and any(isinstance(n, Dot) for n in walk_tile_expr(s.value)):
            t = frame.tensors[s.tensor.name]
            if (t.role not in ("input", "output") and s.tensor.name not in registers and s.mask is None and not s.reducer
                    and s.tensor.name not in frame.shared_names):
                from polyfuse.tiling.htile import Slice
                size = 1
                for i in s.index:
                    if isinstance(i, Slice):
                        size *= i.size
                if size <= frame.options.resident_elements and not any(
                        getattr(n, "name", None) == loop.var.name for i in s.index
                        for n in walk_tile_expr(i.start if isinstance(i, Slice) else i)):
                    extra.append(resident.Resident(s.tensor.name, s.index, fresh(f"kept_{s.tensor.name}"), t.dtype))
    return kept + extra
MODE = [False]
def plan(frame, loop, registers, fresh):
    return with_products(frame, loop, registers, fresh) if MODE[0] else original(frame, loop, registers, fresh)
resident.plan = plan
dev = loader("cuda").device_spec() if len(sys.argv) > 1 and sys.argv[1] != "--plan" else None
if sys.argv[1] == "--plan":
    from polyfuse.device import PRESETS
    from polyfuse.emit_cpp import CUDA
    from polyfuse.pipeline import stages
    import dataclasses
    op = ops.get(sys.argv[2]); MODE[0] = True
    sch = default_schedule(sys.argv[2], "decode", op.program("decode", **op.presets["decode"]), target="cuda", device=PRESETS["sm_90a"])
    print(stages(sch, dataclasses.replace(CUDA, device=PRESETS["sm_90a"])).dump("plan"))
    sys.exit()
preset = sys.argv[2]
extra = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3:])}
for name in sys.argv[1].split(","):
    op = ops.get(name)
    sizes = {**op.presets[preset], **extra}
    mode = "decode" if preset.startswith("decode") else preset
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    runs = []
    for m in (False, True):
        MODE[0] = m
        P._KERNELS.clear()
        k = P.build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", fp_contract=True)
        ins = [inputs[a.name] for a in k.inputs]
        out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
        runs.append((lambda k=k, ins=ins, out=out: k(*ins, *out), out, "kept_pv" in k.kernel_source.text))
    times = [[], []]
    for r in range(4):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            times[i].append(do_bench(runs[i][0], warmup=25, rep=100, return_mode="median"))
    d = max(float((a.float() - b.float()).abs().max()) for a, b in zip(runs[0][1], runs[1][1]))
    t0, t1 = min(times[0]) * 1e3, min(times[1]) * 1e3
    print(f"{name} {preset} {extra}: default {t0:.1f}us | pv kept in shared memory {t1:.1f}us x{t0 / t1:.3f} d={d:.1e} (kept: {runs[1][2]})", flush=True)
