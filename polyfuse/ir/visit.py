"""Generic traversals of IR trees: mapping, substitution, matching, collection."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from polyfuse.errors import IRError, UnboundSize
from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var
from polyfuse.ir.stmt import Block, IterVar, Loop, Program, Seq, Stmt, Store, Tensor


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, BinOp):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, Cast):
        return (e.value,)
    return ()


def with_children(e: Expr, new: tuple[Expr, ...]) -> Expr:
    """Rebuild ``e`` with new children (returns ``e`` itself when nothing changed)."""
    if new == children(e):
        return e
    if isinstance(e, Load):
        return Load(e.tensor, new)
    if isinstance(e, BinOp):
        return BinOp(e.op, new[0], new[1])
    if isinstance(e, Call):
        return Call(e.fn, new)
    if isinstance(e, Select):
        return Select(new[0], new[1], new[2])
    if isinstance(e, Cast):
        return Cast(e.type, new[0])
    return e


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Pre-order rewrite: ``fn(node)`` returns a replacement or None to descend."""
    out = fn(e)
    if out is not None:
        return out
    kids = children(e)
    if not kids:
        return e
    return with_children(e, tuple(map_expr(k, fn) for k in kids))


def walk_expr(e: Expr) -> Iterator[Expr]:
    """Pre-order traversal of an expression."""
    yield e
    for k in children(e):
        yield from walk_expr(k)


def substitute(e: Expr, mapping: Mapping[Var, Expr] | Mapping[str, Expr]) -> Expr:
    """Replace variables (by Var or by name) with expressions."""
    by_name = {(k.name if isinstance(k, Var) else k): v for k, v in mapping.items()}
    if not by_name:
        return e
    return map_expr(e, lambda n: by_name.get(n.name) if isinstance(n, Var) else None)


def free_vars(e: Expr) -> set[str]:
    """Names of the variables an expression reads."""
    return {n.name for n in walk_expr(e) if isinstance(n, Var)}


def loads(e: Expr) -> list[Load]:
    """Every load in an expression, outermost first (loads inside indices included)."""
    return [n for n in walk_expr(e) if isinstance(n, Load)]


def match_pattern(
    pattern: Expr, value: Expr, *, fixed: Mapping[Var, Expr], wildcards: tuple[Var, ...]
) -> dict[Var, Expr] | None:
    """Match ``value`` against ``pattern``; ``fixed`` vars must equal given expressions,
    ``wildcards`` bind to whatever stands at their place (consistently)."""
    bound: dict[Var, Expr] = {}

    def go(p: Expr, v: Expr) -> bool:
        if isinstance(p, Var) and p in fixed:
            return fixed[p] == v
        if isinstance(p, Var) and p in wildcards:
            if p in bound:
                return bound[p] == v
            bound[p] = v
            return True
        if type(p) is not type(v):
            return False
        if isinstance(p, (Var, Const)):
            return p == v
        if isinstance(p, BinOp) and p.op != v.op:  # type: ignore[attr-defined]
            return False
        if isinstance(p, Call) and p.fn != v.fn:  # type: ignore[attr-defined]
            return False
        if isinstance(p, Cast) and p.type != v.type:  # type: ignore[attr-defined]
            return False
        if isinstance(p, Load) and p.tensor != v.tensor:  # type: ignore[attr-defined]
            return False
        pk, vk = children(p), children(v)
        return len(pk) == len(vk) and all(go(a, b) for a, b in zip(pk, vk, strict=True))

    return bound if go(pattern, value) else None


# ------------------------------------------------------------------ statements

def map_stmt(stmt: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Pre-order statement rewrite: ``fn`` returns a replacement or None to descend."""
    out = fn(stmt)
    if out is not None:
        return out
    if isinstance(stmt, Loop):
        return stmt.replace(body=map_stmt(stmt.body, fn))
    if isinstance(stmt, Seq):
        return stmt.replace(stmts=tuple(map_stmt(s, fn) for s in stmt.stmts))
    return stmt


def map_block_exprs(block: Block, fn: Callable[[Expr], Expr]) -> Block:
    """Apply ``fn`` to every expression of a block (extents, bindings, store, init, where)."""
    st = block.store
    return block.replace(
        iters=tuple(IterVar(iv.var, fn(iv.extent), iv.kind) for iv in block.iters),
        bindings=tuple(fn(b) for b in block.bindings),
        store=Store(st.tensor, tuple(fn(i) for i in st.indices), fn(st.value)),
        init=None if block.init is None else fn(block.init),
        where=None if block.where is None else fn(block.where),
    )


def map_program_exprs(program: Program, fn: Callable[[Expr], Expr]) -> Program:
    """Apply ``fn`` to every expression of a program's body (blocks and loop extents)."""

    def visit(s: Stmt) -> Stmt | None:
        if isinstance(s, Block):
            return map_block_exprs(s, fn)
        if isinstance(s, Loop):
            return s.replace(extent=fn(s.extent), body=map_stmt(s.body, visit))
        return None

    return program.replace(body=map_stmt(program.body, visit))


def replace_tensor(program: Program, old: Tensor, new: Tensor) -> Program:
    """Swap a tensor declaration and every access to it."""

    def fix_expr(e: Expr) -> Expr:
        return map_expr(e, lambda n: Load(new, tuple(fix_expr(i) for i in n.indices))
                        if isinstance(n, Load) and n.tensor == old else None)

    def visit(s: Stmt) -> Stmt | None:
        if isinstance(s, Block):
            b = map_block_exprs(s, fix_expr)
            if b.store.tensor == old:
                b = b.replace(store=Store(new, b.store.indices, b.store.value))
            return b
        return None

    tensors = tuple(new if t == old else t for t in program.tensors)
    return program.replace(tensors=tensors, body=map_stmt(program.body, visit))


def bind_sizes(program: Program, sizes: Mapping[str, int]) -> Program:
    """Specialise size parameters to integer values."""
    known = {p.name for p in program.params}
    unknown = sorted(set(sizes) - known)
    if unknown:
        raise UnboundSize(
            f"program {program.name!r} has no size parameter {', '.join(unknown)}; "
            f"its parameters are: {', '.join(sorted(known)) or '(none)'}"
        )
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UnboundSize(f"size {k} must be a non-negative integer, got {v!r}")
    from polyfuse.ir.simplify import simplify

    mapping = {k: Const(int(v), Var(k).dtype) for k, v in sizes.items()}

    def fix(e: Expr) -> Expr:
        return simplify(substitute(e, mapping))

    tensors = {t: Tensor(t.name, tuple(fix(d) for d in t.shape), t.dtype, t.role, t.scope) for t in program.tensors}
    out = program
    for old, new in tensors.items():
        if old != new:
            out = replace_tensor(out, old, new)
    out = map_program_exprs(out, fix)
    return out.replace(params=tuple(p for p in program.params if p.name not in sizes))


def seq(*stmts: Stmt) -> Stmt:
    """A sequence, flattened; a single statement stands for itself."""
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.stmts if isinstance(s, Seq) else (s,))
    if not flat:
        raise IRError("an empty sequence of statements is not a program body")
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
