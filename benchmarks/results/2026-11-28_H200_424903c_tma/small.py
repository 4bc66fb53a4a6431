"""Short prefill kernels: do_bench of the call (what tune.py times), the host time of one call, and a CUDA graph of 20
launches (GPU time alone), for the option variants given.  usage: small.py OPS "tma=off;" S ..."""
import sys, time, torch, dataclasses
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.emit_cpp import CodegenOptions
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
configs = [dict(kv.split("=") for kv in c.split(",") if kv) for c in sys.argv[2].split(";")]
for S in map(int, sys.argv[3:]):
    for name in sys.argv[1].split(","):
        op = ops.get(name)
        sizes = {**op.presets["prefill"], "Sq": S, "Skv": S}
        inputs = {n: torch.from_numpy(a).cuda() for n, a in op.inputs(0, "prefill", sizes, 1.0).items()}
        parts = []
        for c in configs:
            o = CodegenOptions(**{a: b == "on" for a, b in c.items()})
            k = build(default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda", device=dev, options=o),
                      "cuda", codegen=o, loader="cuda-python")
            ins = [inputs[a.name] for a in k.inputs]
            out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
            s = torch.cuda.Stream()
            call = lambda: k.launch((*ins, *out), {}, stream=torch.cuda.current_stream().cuda_stream)
            with torch.cuda.stream(s):
                call(); torch.cuda.synchronize()
                bench = do_bench(call, warmup=25, rep=100, return_mode="median")
                t0 = time.perf_counter()
                for _ in range(200): call()
                host = (time.perf_counter() - t0) / 200
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s):
                    for _ in range(20): call()
            torch.cuda.synchronize()
            graph = do_bench(g.replay, warmup=25, rep=100, return_mode="median") / 20
            parts.append(f"[{','.join(f'{a}={b}' for a, b in c.items()) or 'default'}] bench {bench*1e3:.1f}us host {host*1e6:.1f}us graph {graph*1e3:.1f}us")
        print(f"{name} S={S}: " + " | ".join(parts), flush=True)
