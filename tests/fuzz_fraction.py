"""How many of the fuzzer's generated cascades fuse: ``python tests/fuzz_fraction.py -n 1000 [--seed S]``.

Draws case ``k`` as ``fuzz_run.py`` does (``RandomDraw(seed + k)``: the same programs and schedules) but only
applies the schedule, without checking the result (``fuzz_run.py`` checks).  Prints, over the cases whose
schedule asks for a fusion: the share in which at least one fusion step applied, the share in which every one
did, and the share of fusion steps applied; and how many cascades hold a sibling reduction, a declared sign or a
finite input, and how many fused with an auxiliary state.
Run it with another ``PYTHONPATH`` to compare two versions of polyfuse on the same cascades.
"""

from __future__ import annotations

import argparse
import sys

from fuzz_cascades import RandomDraw, cascade
from fuzz_schedules import schedule
from polyfuse.ir.visit import loads


def _has_sibling(c) -> bool:
    """True if a reduction after the first reads no earlier one (directly or through a map's temporary)."""
    maps = {b.store.tensor.name: b for b in c.program.blocks() if b.reducer is None}

    def reads(expr) -> set[str]:
        out = set()
        for ld in loads(expr):
            out |= reads(maps[ld.tensor.name].store.value) if ld.tensor.name in maps else {ld.tensor.name}
        return out

    results = [c.program.block(r).store.tensor.name for r in c.reductions]
    return any(not reads(c.program.block(r).store.value) & set(results[:k]) - {results[k]}
               for k, r in enumerate(c.reductions) if k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    asked = some = every = steps = applied = siblings = signed = finite = states = 0
    for seed in range(args.seed, args.seed + args.n):
        draw = RandomDraw(seed)
        c = cascade(draw)
        s = schedule(draw, c)
        siblings += _has_sibling(c)
        signed += any(t.sign is not None for t in c.program.inputs)
        finite += any(t.finite for t in c.program.inputs)
        states += any(f.repair is not None and f.repair.auxiliaries for f in getattr(s.sch, "fusions", ()))
        if s.fusion_steps[0]:
            asked += 1
            some += s.fusion_steps[1] > 0
            every += s.fusion_steps[1] == s.fusion_steps[0]
            steps += s.fusion_steps[0]
            applied += s.fusion_steps[1]
    print(f"{args.n} cascades ({siblings} with a sibling reduction, {signed} with a declared input sign, {finite} "
          f"with a finite input, {states} fused with an auxiliary state); "
          f"{asked} ask for a fusion: at least one step applied in {some} ({some / max(asked, 1):.1%}), every step "
          f"in {every} ({every / max(asked, 1):.1%}); fusion steps applied {applied} of {steps} "
          f"({applied / max(steps, 1):.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
