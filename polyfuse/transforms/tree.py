"""Locating and rewriting parts of a program's statement tree.

Statements are frozen and compare structurally, so a position in the tree is
found by object identity (``is``), never by equality: two identical loop nests
in different places are different places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from polyfuse.errors import IllegalTransform, InternalError
from polyfuse.ir.expr import Expr, Var
from polyfuse.ir.simplify import simplify
from polyfuse.ir.stmt import Block, Loop, Program, Seq, Stmt, walk_stmts
from polyfuse.ir.visit import free_vars, map_block_exprs, seq, substitute


def block_path(program: Program, block: str) -> tuple[list[Stmt], Block]:
    """The statements from the root down to ``block`` (loops and sequences), and the block."""
    path: list[Stmt] = []

    def go(s: Stmt) -> Block | None:
        if isinstance(s, Block):
            return s if s.name == block else None
        path.append(s)
        kids = [s.body] if isinstance(s, Loop) else list(s.stmts) if isinstance(s, Seq) else []
        for k in kids:
            found = go(k)
            if found is not None:
                return found
        path.pop()
        return None

    found = go(program.body)
    if found is None:
        known = ", ".join(b.name for b in program.blocks())
        raise IllegalTransform(f"program {program.name!r} has no block {block!r}; blocks: {known}")
    return path, found


def loops_of(program: Program, block: str) -> list[Loop]:
    """The loops enclosing ``block``, outermost first."""
    path, _ = block_path(program, block)
    return [s for s in path if isinstance(s, Loop)]


def find_loop(program: Program, block: str, loop: str) -> Loop:
    """The loop named ``loop`` that encloses ``block`` (IllegalTransform naming both otherwise)."""
    loops = loops_of(program, block)
    for lp in loops:
        if lp.var.name == loop:
            return lp
    names = ", ".join(lp.var.name for lp in loops) or "none"
    raise IllegalTransform(f"block {block!r} is not inside a loop named {loop!r}; its loops: {names}")


def replace_node(root: Stmt, target: Stmt, new: Stmt | None) -> Stmt:
    """``root`` with the node that *is* ``target`` replaced by ``new`` (or removed if None)."""
    hit = [False]

    def go(s: Stmt) -> Stmt | None:
        if s is target:
            hit[0] = True
            return new
        if isinstance(s, Loop):
            body = go(s.body)
            if body is None:
                return None
            return s.replace(body=body)
        if isinstance(s, Seq):
            kids = [k for k in (go(c) for c in s.stmts) if k is not None]
            return seq(*kids) if kids else None
        return s

    out = go(root)
    if not hit[0]:
        raise InternalError("replace_node: the target statement is not in the tree")
    if out is None:
        raise InternalError("replace_node: removing the target left the program empty")
    return out


def map_blocks(stmt: Stmt, fn: Callable[[Block], Block]) -> Stmt:
    """Apply ``fn`` to every block under ``stmt``."""
    if isinstance(stmt, Block):
        return fn(stmt)
    if isinstance(stmt, Loop):
        return stmt.replace(body=map_blocks(stmt.body, fn))
    if isinstance(stmt, Seq):
        return stmt.replace(stmts=tuple(map_blocks(s, fn) for s in stmt.stmts))
    return stmt


def rebind(stmt: Stmt, mapping: Mapping[str, Expr]) -> Stmt:
    """Substitute loop variables in the bindings of every block under ``stmt``."""
    def fix(b: Block) -> Block:
        return b.replace(bindings=tuple(simplify(substitute(x, mapping)) for x in b.bindings))
    return map_blocks(stmt, fix)


def binding_loop_vars(b: Block, *, reduce: bool) -> set[str]:
    """Loop variables used by the bindings of ``b``'s reduce (or spatial) iterations."""
    out: set[str] = set()
    for iv, bnd in zip(b.iters, b.bindings, strict=True):
        if iv.is_reduce == reduce:
            out |= free_vars(bnd)
    return out


def loop_names(stmt: Stmt) -> set[str]:
    return {s.var.name for s in walk_stmts(stmt) if isinstance(s, Loop)}


def fresh_loop_name(program: Program, base: str, taken: set[str] | None = None) -> str:
    """``base`` if no loop, size or iteration variable of the program uses it, else ``base_1``, …"""
    used = loop_names(program.body) | {p.name for p in program.params} | (taken or set())
    used |= {iv.var.name for b in program.blocks() for iv in b.iters}
    if base not in used:
        return base
    k = 1
    while f"{base}_{k}" in used:
        k += 1
    return f"{base}_{k}"


def blocks_under(stmt: Stmt) -> list[Block]:
    return [s for s in walk_stmts(stmt) if isinstance(s, Block)]


def rename_iter_free(stmt: Stmt, old: str, new: str) -> Stmt:
    """Rename loop variable ``old`` to ``new`` in loops and bindings under ``stmt``."""
    def go(s: Stmt) -> Stmt:
        if isinstance(s, Loop):
            var = Var(new) if s.var.name == old else s.var
            return s.replace(var=var, body=go(s.body))
        if isinstance(s, Seq):
            return s.replace(stmts=tuple(go(c) for c in s.stmts))
        if isinstance(s, Block):
            return s.replace(bindings=tuple(substitute(b, {old: Var(new)}) for b in s.bindings))
        return s
    return go(stmt)


__all__ = [
    "binding_loop_vars", "block_path", "blocks_under", "find_loop", "fresh_loop_name", "loop_names", "loops_of",
    "map_blocks", "map_block_exprs", "rebind", "rename_iter_free", "replace_node",
]
