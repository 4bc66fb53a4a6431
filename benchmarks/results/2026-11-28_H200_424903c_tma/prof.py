"""Host cost of one polyfuse kernel call (torch tensors in, outputs given): cProfile over many launches."""
import cProfile, pstats, sys, time, torch
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
for name, mode, extra in (("attn_global", "decode", {}), ("attn_global", "prefill", {"Sq": 1024, "Skv": 1024})):
    op = ops.get(name)
    sizes = {**op.presets[mode], **extra}
    k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda", loader="cuda-python")
    inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, mode, sizes, 1.0).items()}
    ins = [inputs[a.name] for a in k.inputs]
    out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    k(*ins, *out); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500): k(*ins, *out)
    torch.cuda.synchronize()
    print(f"{name} {mode}: {(time.perf_counter() - t0) / 500 * 1e6:.1f} us per call (host, launches queued)", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(500): k(*ins, *out)
    pr.disable(); torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
