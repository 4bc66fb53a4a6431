"""Default decode kernels of the tree on PYTHONPATH at B=1 and short caches, timed (do_bench median, best of two
rounds); with --sdpa also cuDNN's SDPA on the same inputs. One line per case."""
import sys
import torch
from triton.testing import do_bench
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.gpu import TORCH_DTYPES
from polyfuse.runtime.loaders import loader
from polyfuse.bench import baselines
dev = loader("cuda").device_spec()
label, sdpa = sys.argv[1], "--sdpa" in sys.argv
for case in sys.argv[2].split(","):
    name, skv = case.split(":")
    op = ops.get(name)
    sizes = {**op.presets["decode"], "Skv": int(skv)}
    inputs = {k: torch.from_numpy(v).cuda() for k, v in op.inputs(0, "decode", sizes).items()}
    sch = default_schedule(name, "decode", op.program("decode", **sizes), target="cuda", device=dev)
    k = build(sch, "cuda", fp_contract=True)
    ins = [inputs[a.name] for a in k.inputs]
    out = [torch.empty(a.shape, dtype=getattr(torch, TORCH_DTYPES[a.dtype.name]), device="cuda") for a in k.outputs]
    t = min(do_bench(lambda: k(*ins, *out), warmup=10, rep=50, return_mode="median") for _ in range(2))
    extra = ""
    if sdpa and name != "attn_mla_decode":
        try:
            fns = baselines.sdpa_variants(name, inputs, "decode", sizes)
            best = []
            for backend in ("sdpa:CUDNN_ATTENTION", "sdpa:FLASH_ATTENTION"):
                fn = fns[backend]
                if isinstance(fn, str):
                    continue
                try:
                    fn()
                    best.append(min(do_bench(fn, warmup=10, rep=50, return_mode="median") for _ in range(2)))
                except Exception:  # noqa: BLE001
                    pass
            ts = min(best)
            extra = f" best of cuDNN/FA SDPA {ts * 1000:.1f} us"
        except Exception as e:  # noqa: BLE001
            extra = f" cudnn n/a ({type(e).__name__}: {str(e)[:80]})"
    print(f"{label} {name} B={sizes['B']} Skv={skv}: {t * 1000:.1f} us ({len(k.kernel_source.launches)} launches){extra}",
          flush=True)
