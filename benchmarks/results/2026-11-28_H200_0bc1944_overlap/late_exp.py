"""Debug: the late P.V against in-turn, with variants of the emitted code (monkeypatched emitter)."""
import sys, numpy as np
from polyfuse import ops
from polyfuse.ops.schedules import default_schedule
from polyfuse.pipeline import build
from polyfuse.emit_cpp import CodegenOptions
import polyfuse.emit_cpp.fragment_emit as FE

name, sizes = "attn_global", {"Sq": 256, "Skv": 384, "D": 64, "Dv": 64}
op = ops.get(name); sizes = {**op.sizes("prefill"), **sizes}
sch = default_schedule(name, "prefill", op.program("prefill", **sizes), target="cuda")
inputs = op.inputs(8, "prefill", sizes, 1.0, "random")
ref = op.reference(inputs, "prefill", sizes)

def run(label, opts):
    k = build(sch, "cuda", sizes=sizes, codegen=opts)
    open(f"{sys.argv[1]}/{label}.cu", "w").write(k.kernel_source.text)
    return k.run(inputs)["out"]

base = run("in_turn", CodegenOptions(overlap_products=False))
print("in_turn vs numpy", ops.compare({"out": base}, ref, op.tolerance("prefill", sizes)).line())
orig_issue, orig_acc = FE._Late.issue, FE._Late.accumulators
def variant(label, issue=None, acc=None):
    FE._Late.issue = issue or orig_issue
    FE._Late.accumulators = acc or orig_acc
    try:
        out = run(label, CodegenOptions())
    finally:
        FE._Late.issue, FE._Late.accumulators = orig_issue, orig_acc
    d = np.abs(out.astype(np.float32) - base.astype(np.float32))
    print(f"{label}: same bits {np.array_equal(out, base)}; max diff {d.max():.3g}; rows differing {int((d.max(axis=-1) > 0).sum())} of {d.shape[-2]*d.shape[1]}; first bad row {np.argwhere(d.max(axis=-1) > 0)[:3].tolist()}", flush=True)

def issue_wait(self, em, fl, body, prev):
    orig_issue(self, em, fl, body, prev); em.line("pf::wgmma_wait<0>();")
def acc_noinit(self, em, fl, rows=True, product=True):
    st = fl.stmts[self.stmt.block]
    if product:
        em.line(f"float {self.acc}[{st.dot.b.staged.rows_pad // 8}][4];")
    for name, x in zip(self.rows, st.row_parts[st.value], strict=True) if rows else ():
        em.line(f"{em.ctype(x.dtype)} {name}[2];")
variant("late")
variant("late_wait_at_issue", issue=issue_wait)
variant("late_noinit", acc=acc_noinit)
variant("late_noinit_wait", issue=issue_wait, acc=acc_noinit)
