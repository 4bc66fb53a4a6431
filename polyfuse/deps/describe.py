"""Human-readable summary of a program's instances and dependences (``polyfuse explain``)."""

from __future__ import annotations

from polyfuse.deps.analysis import Dependences, analyze
from polyfuse.deps.dependence import Dependence
from polyfuse.ir.stmt import Program


def _block_line(program: Program, deps: Dependences, name: str) -> list[str]:
    block = program.block(name)
    what = "block"
    if block.reducer is not None:
        red = ", ".join(iv.var.name for iv in block.reduce_iters)
        what = f"reduction ({block.reducer.name} over {red})"
    lines = [f"  {name}: {what}", f"    instances: {deps.domains[name]}"]
    for a in deps.accesses:
        if a.block == name:
            lines.append(f"    {a.tag}: {a.kind} {a.text}" + ("" if a.role in ("load", "store") else f" ({a.role})"))
    return lines


def _dep_lines(title: str, deps: list[Dependence]) -> list[str]:
    if not deps:
        return []
    return [title] + [f"  {d.label} via {d.source_ref} -> {d.sink_ref}: {d.relation}" for d in deps]


def describe(program: Program, dependences: Dependences | None = None) -> str:
    """Blocks with their instance sets and references, then the dependences between blocks.

    Temporal dependences (a reduction's final value read by another block, what
    naive fusion may break and a repair must fix) are marked ``(temporal)``;
    a reduction's own update chain is listed separately.
    """
    deps = dependences if dependences is not None else analyze(program)
    params = f" [{', '.join(deps.params)}]" if deps.params else ""
    lines = [f"program {program.name}{params}", "blocks:"]
    for name in deps.domains:
        lines += _block_line(program, deps, name)
    inter = deps.inter_block
    lines += _dep_lines("dependences between blocks:", inter) or ["dependences between blocks: none"]
    lines += _dep_lines("reduction self-dependences:", [d for d in deps.self_reductions if d.kind == "flow"])
    lines += _dep_lines("other dependences within a block:",
                        [d for d in deps.all if d.source == d.sink and not d.self_reduction])
    return "\n".join(lines)


__all__ = ["describe"]
