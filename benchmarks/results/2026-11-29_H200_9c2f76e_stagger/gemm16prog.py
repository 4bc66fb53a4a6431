from polyfuse.ir import ProgramBuilder, reduce, cast
from polyfuse.transforms.schedule import Schedule
def gemm16(S=8192, H=4096, E=128, rows=64, step=64):
    p = ProgramBuilder("gemm16")
    x = p.input("x", (S, H), "f16")
    w = p.input("w", (H, E), "f16")
    z = p.output("z", (S, E), "f32")
    with p.nest("s_gate", s=S, e=E, h=reduce(H)) as (s, e, h):
        z[s, e] = z[s, e] + cast("f32", x[s, h]) * cast("f32", w[h, e])
    sch = Schedule(p.build())
    s, e, h = sch.get_loops("s_gate")
    _, s1 = sch.split(s, [None, rows])
    h0, h1 = sch.split(h, [None, step])
    sch.reorder([h0, s1, e, h1])
    partial = sch.rfactor(h0)
    sch.reverse_compute_at("s_gate", sch.loop(partial, h0.name))
    return sch.program
