"""Build each named prefill/decode kernel at its bench preset and count SASS instruction families (cuobjdump).
usage: sass.py OP:PRESET ..."""
import collections, re, subprocess, sys
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.runtime.loaders import loader
dev = loader("cuda").device_spec()
for spec in sys.argv[1:]:
    name, preset = spec.split(":")
    op = ops.get(name)
    mode = "decode" if preset.startswith("decode") else preset
    sizes = op.presets[preset]
    k = build(default_schedule(name, mode, op.program(mode, **sizes), target="cuda", device=dev), "cuda")
    sass = subprocess.run(["cuobjdump", "-sass", str(k.image)], capture_output=True, text=True).stdout
    counts = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    keys = ["HGMMA", "UTMALDG", "UBLKCP", "LDGSTS", "SYNCS", "BAR", "MUFU", "LDG", "STG"]
    print(f"{name} {preset}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in keys) + f"; maps {len(k.kernel_source.maps)}", flush=True)
