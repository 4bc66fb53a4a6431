"""compact_buffers: shrink each temporary to what one iteration of a loop touches (TVM's CompactBufferAllocation).

After fusion a temporary such as ``qk[B, H, S, S]`` is still declared at full
size although each of its values is produced and consumed within one iteration
of a loop (an 8×8 tile per ``(b, h, i_0, j_0)``).  For every temporary T the
pass finds its *allocation loop* L, the innermost loop enclosing every block
that accesses T across whose iterations no value of T flows, and gives T the
shape of the box it is accessed in per iteration of L: each access ``T[e]``
becomes ``T[e - lo]``, with ``lo`` written in the accessing block's own
iteration variables (through its bindings, e.g. ``i - (i // 8) * 8 = i % 8``).

Preconditions, checked per temporary T (one that fails is left as it is and
listed with the reason by :func:`compaction`; nothing is refused silently):
  1. T is a temporary: inputs and outputs keep their shape;
  2. every flow dependence on T (``deps.analyze(program).flow``: reduction
     self-dependences and reads of partial values included) relates instances
     that run in the same iteration of L and of every loop around L (their time
     vectors agree on those loops' coordinates).  This suffices for one buffer
     reused by every iteration: the instances of one iteration run contiguously,
     within it the map from T's elements to the buffer is one-to-one, so no
     write of another iteration can come between a read and its source;
  3. per iteration of L, each dimension of the accessed region lies in a box
     ``lo(loop vars) + [0, size)`` (:func:`~polyfuse.transforms.region.box`);
     a dimension shrinks only when ``size`` is a constant below its extent;
  4. in each accessing block the new index ``e - lo`` is one quasi-affine
     expression of the block's iteration variables.

L is the innermost loop that satisfies 2 (a deeper one gives a smaller box);
when values flow across even the outermost common loop, T is allocated at
program level and shrinks only if it is accessed in less than its extent.

Convention: the allocation loop L of a compacted T carries the annotation
``(ALLOC, T.name)`` = ``("alloc", "qk")``; code generators allocate T once per
iteration of L.  The memory scope T declares is left as it is.  A T allocated at
program level carries no annotation.  Reads of elements that no instance wrote
(e.g. a ``select`` that discards the value) read undefined values before and
after.  Accesses are bounded wherever they are evaluated (an init's loads and
both arms of a ``select`` included), not only where their value is used.

Before / after (fused attention, 8×8 tiles; ``qk`` is allocated under ``j_0``)::

    qk = temp((1, 2, 40, 40))                 qk = temp((1, 1, 8, 8))
    for b, h, i_0, j_0:                       for b, h, i_0, j_0:        # ("alloc", "qk")
        for i_1, j_1, d:                          for i_1, j_1, d:
            qk[b, h, i, j] += q·k                     qk[b, 0, i % 8, j % 8] += q·k
        for ax0, ax1:                             for ax0, ax1:
            score[…] = qk[b, h, i, j] * 0.25          score[…] = qk[b, 0, i % 8, j % 8] * 0.25
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import islpy as isl

from polyfuse import deps
from polyfuse.deps.dependence import Dependence
from polyfuse.deps.domains import iteration_domain, param_names
from polyfuse.deps.islconv import aff_text, build_map, dim_env
from polyfuse.deps.memo import memoized
from polyfuse.errors import IllegalTransform
from polyfuse.ir.affine import Atom, linear_form
from polyfuse.ir.expr import BinOp, Const, Expr, Load, Var, const
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Stmt, Store, Tensor, walk_stmts
from polyfuse.ir.validate import validate
from polyfuse.ir.visit import loads, map_block_exprs, map_expr
from polyfuse.transforms.region import aff_to_expr, box, instances_at
from polyfuse.transforms.tree import loops_of

ALLOC = "alloc"

Indices = tuple[Expr, ...]


@dataclass(frozen=True)
class Compacted:
    """A temporary given a smaller shape, allocated once per iteration of ``loops[-1]``."""

    tensor: str
    old_shape: tuple[Expr, ...]
    new_shape: tuple[Expr, ...]
    loops: tuple[str, ...]  # loop names from the root down to the allocation loop; () = program level

    @property
    def loop(self) -> str | None:
        return self.loops[-1] if self.loops else None

    def __str__(self) -> str:
        where = f"loop {'/'.join(self.loops)}" if self.loops else "program level"
        return f"{self.tensor}: {_shape(self.old_shape)} -> {_shape(self.new_shape)} at {where}"


@dataclass(frozen=True)
class Skipped:
    """A temporary left as it is, and why."""

    tensor: str
    reason: str

    def __str__(self) -> str:
        return f"{self.tensor}: kept ({self.reason})"


@dataclass(frozen=True)
class Compaction:
    """The compacted program with what was compacted and what was kept (and why)."""

    program: Program
    compacted: tuple[Compacted, ...]
    skipped: tuple[Skipped, ...]

    def __str__(self) -> str:
        return "\n".join(str(x) for x in (*self.compacted, *self.skipped)) or "no temporaries"


def compact_buffers(program: Program) -> Program:
    """``program`` with every temporary shrunk to its per-iteration box (see the module docstring)."""
    return compaction(program).program


def compaction(program: Program) -> Compaction:
    """:func:`compact_buffers` with its report: each temporary compacted (old and new shape, loop) or kept."""
    # Step 1. Check, per temporary: the allocation loop, the box, the new index of every access.
    # Only flow dependences of the temporaries decide where a temporary can live.
    info = deps.analyze(program, tensors={t.name for t in program.temps}, kinds=(deps.FLOW,))
    params = param_names(program)
    placed = [(b, loops_of(program, b.name)) for b in program.blocks()]
    plans: list[_Plan] = []
    skipped: list[Skipped] = []
    for t in program.temps:
        try:
            plans.append(_plan(info, params, placed, t))
        except _Skip as s:
            skipped.append(Skipped(t.name, s.reason))
    # Step 2. Rewrite declarations, accesses and allocation loops in one pass.
    new = _rewrite(program, plans) if plans else program
    return Compaction(validate(new), tuple(p.summary for p in plans), tuple(skipped))


# ------------------------------------------------------------------ checks

class _Skip(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, eq=False)
class _Plan:
    tensor: Tensor  # the compact declaration
    loop: Loop | None  # the allocation loop, by identity in the original tree
    indices: dict[tuple[str, Indices], Indices]  # (block, old indices) -> new indices
    summary: Compacted


Placement = tuple[Block, list[Loop]]


def _plan(info: deps.Dependences, params: tuple[str, ...], placed: list[Placement], t: Tensor) -> _Plan:
    users = [(b, loops) for b, loops in placed if _index_tuples(b, t.name)]
    if not users:
        raise _Skip("no block accesses it")
    common = _common_loops([loops for _, loops in users])
    depth, crossing = _allocation_depth(info, [d for d in info.flow if d.tensor == t.name], common)
    kept = common[:depth]
    los, shape, notes = _shrink(_region(params, kept, users, t), t)
    if not los:
        where = (f"per iteration of loop {kept[-1].var.name!r}" if kept else
                 "at program level" + ("" if common else " (no loop encloses all the blocks that access it)"))
        if crossing:
            notes.append(f"not deeper: {crossing}")
        raise _Skip(f"accessed in its whole extent {where}" + "".join(f"; {x}" for x in notes))
    indices = _new_indices(params, kept, users, t, los)
    compact = Tensor(t.name, shape, t.dtype, t.role, t.scope)
    summary = Compacted(t.name, t.shape, shape, tuple(lp.var.name for lp in kept))
    return _Plan(compact, kept[-1] if kept else None, indices, summary)


def _shrink(region: isl.Map, t: Tensor) -> tuple[dict[int, Expr], tuple[Expr, ...], list[str]]:
    """Per dimension that shrinks, its offset (in the kept loop variables); the new shape; why others do not."""
    los: dict[int, Expr] = {}
    shape = list(t.shape)
    notes: list[str] = []
    n = region.dim(isl.dim_type.out)
    for k, extent in enumerate(t.shape):
        rel = region.project_out(isl.dim_type.out, k + 1, n - k - 1).project_out(isl.dim_type.out, 0, k)
        try:
            (ext,) = box(rel, what=f"dimension {k}")
        except IllegalTransform as err:
            notes.append(str(err))
            continue
        if isinstance(ext.size, Const) and (not isinstance(extent, Const) or ext.size.value < extent.value):
            los[k], shape[k] = ext.lo, ext.size
    return los, tuple(shape), notes


def _new_indices(params: tuple[str, ...], kept: list[Loop], users: list[Placement], t: Tensor,
                 los: dict[int, Expr]) -> dict[tuple[str, Indices], Indices]:
    """Every access ``T[e]`` as ``T[e - lo]``, ``lo`` pulled back from loop points to each block's instances."""
    names = [lp.var.name for lp in kept]
    env = dim_env(names, params)
    dims = sorted(los)
    lo_texts = [aff_text(los[k], env, what=f"offset of {t.name!r}") for k in dims]
    lo = isl.PwMultiAff.from_map(build_map(params, names, lo_texts, []))
    out: dict[tuple[str, Indices], Indices] = {}
    for b, loops in users:
        dom = iteration_domain(b, params)
        to_point = instances_at(params, kept, loops[len(kept):], b, dom).reverse()
        offsets = lo.pullback_pw_multi_aff(isl.PwMultiAff.from_map(to_point))
        for idx in _index_tuples(b, t.name):
            access = isl.PwMultiAff.from_map(_access(params, b, t.name, idx, dom))
            new = list(idx)
            for j, k in enumerate(dims):
                shifted = access.get_pw_aff(k).sub(offsets.get_pw_aff(j)).intersect_domain(dom)
                new[k] = _single_expr(shifted, f"block {b.name!r}: index {k} of {t.name}[{', '.join(map(str, idx))}]")
            out[(b.name, idx)] = tuple(new)
    return out


def _index_tuples(block: Block, tensor: str) -> list[Indices]:
    """The distinct index tuples with which ``block`` loads or stores ``tensor``."""
    return list(_indices_by_tensor(block).get(tensor, ()))


@memoized(1024)
def _indices_by_tensor(block: Block) -> Mapping[str, tuple[Indices, ...]]:
    """Per tensor, the distinct index tuples of ``block``'s loads and store (one walk for every temporary)."""
    exprs = [block.store.value] + ([block.init] if block.init is not None else [])
    found: dict[str, dict[Indices, None]] = {}
    for ld in (ld for e in exprs for ld in loads(e)):
        found.setdefault(ld.tensor.name, {})[ld.indices] = None
    found.setdefault(block.store.tensor.name, {})[block.store.indices] = None
    return MappingProxyType({name: tuple(idx) for name, idx in found.items()})


def _common_loops(nests: list[list[Loop]]) -> list[Loop]:
    """The loops (by identity) that enclose every one of the nests, outermost first."""
    out: list[Loop] = []
    for level in zip(*nests, strict=False):
        if any(lp is not level[0] for lp in level):
            break
        out.append(level[0])
    return out


def _allocation_depth(info: deps.Dependences, flows: list[Dependence], common: list[Loop]) -> tuple[int, str]:
    """How many of the ``common`` loops (outermost first) no flow crosses; if not all, which flow crosses the next."""
    crossing = ""
    for depth in range(len(common), 0, -1):
        loop = common[depth - 1].var.name
        bad = next(((d, m) for d in flows if not (m := _crossing(info, d, depth)).is_empty()), None)
        if bad is None:
            return depth, crossing
        crossing = f"{bad[0].label} crosses iterations of loop {loop!r} (e.g. {bad[1].lexmin()})"
    return 0, crossing


def _crossing(info: deps.Dependences, dep: Dependence, depth: int) -> isl.Map:
    """The pairs of ``dep`` whose instances run in different iterations of the ``depth`` outermost loops.

    Time vectors are ``(p0, l1, p1, l2, …)``: the first ``2·depth`` coordinates
    fix the sequence positions down to and the values of those loops.
    """
    src, dst = info.schedule[dep.source], info.schedule[dep.sink]
    space = isl.Space.map_from_domain_and_range(src.get_space().range(), dst.get_space().range())
    same_time = isl.Map.universe(space)
    for k in range(2 * depth):
        same_time = same_time.equate(isl.dim_type.in_, k, isl.dim_type.out, k)
    same = src.apply_range(same_time).apply_range(dst.reverse())
    return dep.relation.subtract(same)


@memoized(1024)
def _access(params: tuple[str, ...], block: Block, tensor: str, idx: Indices, dom: isl.Set) -> isl.Map:
    """``{ B[iters] -> T[idx] }`` over the whole domain (wherever the access is evaluated)."""
    names = [iv.var.name for iv in block.iters]
    env = dim_env(names, params)
    texts = [aff_text(e, env, what=f"block {block.name!r}: index {k} of tensor {tensor!r}") for k, e in enumerate(idx)]
    return build_map(params, names, texts, [], in_name=block.name, out_name=tensor).intersect_domain(dom)


def _region(params: tuple[str, ...], kept: list[Loop], users: list[Placement], t: Tensor) -> isl.Map:
    """``{ [kept loop vars] -> T[indices] }``: the elements of T the blocks access per iteration of ``kept``."""
    out: isl.Map | None = None
    for b, loops in users:
        dom = iteration_domain(b, params)
        inst = instances_at(params, kept, loops[len(kept):], b, dom)
        for idx in _index_tuples(b, t.name):
            rel = inst.apply_range(_access(params, b, t.name, idx, dom))
            out = rel if out is None else out.union(rel)
    assert out is not None
    return out


def _single_expr(pw: isl.PwAff, what: str) -> Expr:
    """``pw`` as one IR index expression (``a % d`` where ISL has ``a - d·floor(a/d)``), or _Skip."""
    pieces = pw.coalesce().get_pieces()
    affs = [aff for _, aff in pieces]
    if affs and any(not a.plain_is_equal(affs[0]) for a in affs[1:]):
        # Pieces written differently may still be one function: ISL splits ``j % 16`` of a nested split
        # into pieces (``j``, ``j - 16``, …); keep the first piece that equals ``pw`` on its whole domain.
        whole = [a for a in affs if isl.PwAff.from_aff(a).intersect_domain(pw.domain()).is_equal(pw)]
        affs = whole[:1] or affs
    if not affs or any(not a.plain_is_equal(affs[0]) for a in affs[1:]):
        raise _Skip(f"{what} minus its offset is not one quasi-affine expression of the block's "
                    f"iteration variables: {pw}")
    return _with_mods(aff_to_expr(affs[0]))


def _with_mods(e: Expr) -> Expr:
    """Rewrite ``m·a - m·d·(a // d)`` inside a linear form as ``m·(a % d)``, after writing each floor
    with its simplest numerator (:func:`_simplest_floor`)."""
    form: dict[Atom, int] = {}
    for atom, c in linear_form(e).items():
        for key, v in (_simplest_floor(atom) if isinstance(atom, BinOp) else {atom: 1}).items():
            form[key] = form.get(key, 0) + c * v
    form = {k: v for k, v in form.items() if v}
    floors = [a for a in form if isinstance(a, BinOp) and a.op == "//"]
    changed = False
    for atom in floors:
        c = form.get(atom, 0)
        if not isinstance(atom.b, Const) or not c or c % int(atom.b.value):
            continue
        d = int(atom.b.value)
        m = -c // d
        rest = {k: v for k, v in form.items() if k != atom}
        for key, v in linear_form(atom.a).items():
            rest[key] = rest.get(key, 0) - m * v
        rest = {k: v for k, v in rest.items() if v}
        if len(rest) < len(form) - 1:
            rest[atom.a % d] = m
            form, changed = rest, True
    return _from_form(form) if changed else e


def _simplest_floor(atom: BinOp) -> dict[Atom, int]:
    """``⌊L/d⌋`` (``L = Σ a·x + b``) as a linear form around the simpler of its two equal floors.

    With ``a = q·d - s`` (``0 <= s < d``) and ``b = qb·d + rb``, ``⌊L/d⌋ = Σ q·x + qb - ⌊(Σ s·x + d-1-rb)/d⌋``;
    the usual form keeps ``⌊(Σ (a mod d)·x + rb)/d⌋``.  ISL writes ``⌊j/16⌋`` as ``j - ⌊(15j + 15)/16⌋``
    when it eliminates the inner loops of a nested split; the first form gives back ``⌊j/16⌋``.
    """
    if atom.op != "//" or not isinstance(atom.b, Const):
        return {atom: 1}
    d = int(atom.b.value)
    numerator = linear_form(atom.a)
    terms = {k: a for k, a in numerator.items() if k != 1}
    qb, rb = divmod(numerator.get(1, 0), d)
    usual = sum(a % d for a in terms.values()) + rb
    flipped = sum(-a % d for a in terms.values()) + d - 1 - rb
    if flipped >= usual:
        return {atom: 1}
    inner = {k: -a % d for k, a in terms.items() if -a % d} | ({1: d - 1 - rb} if d - 1 - rb else {})
    out: dict[Atom, int] = {k: -(-a // d) for k, a in terms.items() if -(-a // d)}
    if qb:
        out[1] = qb
    if inner:
        out[_from_form(inner) // d] = -1
    return out


def _from_form(form: dict[Atom, int]) -> Expr:
    """The expression ``Σ coefficient·atom`` of a linear form."""
    out: Expr | None = None
    for atom, c in form.items():
        if atom == 1:
            continue
        term = Var(atom) if isinstance(atom, str) else atom
        assert isinstance(term, Expr)
        if out is None:
            out = term if c == 1 else term * c
        else:
            scaled = term if abs(c) == 1 else term * abs(c)
            out = out + scaled if c > 0 else out - scaled
    rest = form.get(1, 0)
    if out is None:
        return const(rest)
    if rest:
        out = out + rest if rest > 0 else out - (-rest)
    return out


# ------------------------------------------------------------------ rewrite

def _rewrite(program: Program, plans: list[_Plan]) -> Program:
    by_name = {p.tensor.name: p for p in plans}
    allocs: dict[int, list[str]] = {}
    for p in plans:
        if p.loop is not None:
            allocs.setdefault(id(p.loop), []).append(p.tensor.name)

    def fix_block(b: Block) -> Block:
        def moved(idx: Indices, name: str) -> Indices:
            return by_name[name].indices[(b.name, idx)]

        def compact_load(n: Expr) -> Expr | None:
            if isinstance(n, Load) and n.tensor.name in by_name:
                return Load(by_name[n.tensor.name].tensor, moved(n.indices, n.tensor.name))
            return None

        def fix(e: Expr) -> Expr:
            return map_expr(e, compact_load)

        out = map_block_exprs(b, fix)
        st = b.store
        if st.tensor.name in by_name:
            out = out.replace(store=Store(by_name[st.tensor.name].tensor, moved(st.indices, st.tensor.name),
                                          out.store.value))
        return out

    def go(s: Stmt) -> Stmt:
        if isinstance(s, Loop):
            extra = tuple((ALLOC, n) for n in allocs.get(id(s), ()) if (ALLOC, n) not in s.annotations)
            return s.replace(body=go(s.body), annotations=s.annotations + extra)
        if isinstance(s, Seq):
            return s.replace(stmts=tuple(go(c) for c in s.stmts))
        if isinstance(s, Block):
            return fix_block(s)
        return s

    tensors = tuple(by_name[t.name].tensor if t.name in by_name else t for t in program.tensors)
    return program.replace(tensors=tensors, body=go(program.body))


def outside_allocation(program: Program) -> str | None:
    """A description of the first block that accesses a tensor outside the loop ``compact_buffers``
    allocated it in (None if there is none).  A compacted tensor exists only per iteration of that loop;
    a later transform that moves an access out of it (``decompose_reduction``'s init, a copy of
    ``cache_read``) would leave code generators a name with no storage."""

    def visit(s: Stmt, scope: frozenset[str], allocated: frozenset[str]) -> str | None:
        if isinstance(s, Loop):
            mine = frozenset(str(v) for k, v in s.annotations if k == ALLOC)
            return visit(s.body, scope | mine, allocated)
        if isinstance(s, Seq):
            return next((r for c in s.stmts if (r := visit(c, scope, allocated)) is not None), None)
        if isinstance(s, Block):
            names = {s.store.tensor.name} | {ld.tensor.name for ld in loads(s.store.value)}
            names |= {ld.tensor.name for e in (s.init, s.where) if e is not None for ld in loads(e)}
            stray = sorted((names & allocated) - scope)
            return f"block {s.name!r} accesses {stray[0]!r}" if stray else None
        return None

    allocated = frozenset(str(v) for lp in walk_stmts(program.body) if isinstance(lp, Loop)
                          for k, v in lp.annotations if k == ALLOC)
    return visit(program.body, frozenset(), allocated) if allocated else None


def _shape(shape: tuple[Expr, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


__all__ = ["ALLOC", "Compacted", "Compaction", "Skipped", "compact_buffers", "compaction", "outside_allocation"]
