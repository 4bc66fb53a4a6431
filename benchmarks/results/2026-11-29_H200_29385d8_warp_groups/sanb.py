"""attn_window decode with its keys split again into EXTENT parts bound to warp groups of a WARPS-warp block
(tests/test_warp_groups.py's _bound), on every input variant against NumPy (for compute-sanitizer).
usage: sanb.py WARPS EXTENT"""
import sys
sys.path.insert(0, "tests")
from test_warp_groups import _bound
from polyfuse import ops
from polyfuse.ops.variants import VARIANTS
from polyfuse.pipeline import build
warps, extent = int(sys.argv[1]), int(sys.argv[2])
op = ops.get("attn_window")
sizes = op.sizes("decode", {"Skv": 64 * extent})
k = build(_bound("attn_window", warps, extent), "cuda", sizes=sizes, werror=True)
assert "pf_group" in k.kernel_source.text
print("named barriers:", "named_sync(1 + pf_group" in k.kernel_source.text)
bad = 0
for variant in VARIANTS:
    inputs = op.inputs(3, "decode", sizes, 1.0, variant)
    r = ops.compare(k.run(inputs), op.reference(inputs, "decode", sizes), op.tolerance("decode", sizes))
    bad += not r.ok
    print(variant, "OK" if r.ok else "FAIL " + r.line(), flush=True)
print("sanb.py", warps, extent, "FAILS" if bad else "all OK")
