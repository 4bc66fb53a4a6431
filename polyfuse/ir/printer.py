"""Print programs as builder Python that rebuilds an equal program.

The text starts with ``from polyfuse.ir import *`` and defines ``program()``;
``exec`` it and call ``program()`` to get the Program back.  Perfect loop nests
whose loops carry the block's own iteration names print compactly as
``p.nest(...)``; everything else prints as explicit ``p.loop`` / ``p.block``.
A block's predicate prints as ``p.where(...)`` before its store.
"""

from __future__ import annotations

import math

from polyfuse.ir.expr import BinOp, Call, Cast, Const, Expr, Load, Select, Var
from polyfuse.ir.stmt import (
    BOUND, GLOBAL, INPUT, OUTPUT, SERIAL, Block, IterVar, Loop, Program, Reducer, Seq, Stmt,
    builtin_reducer, reducer_for_op, walk_stmts,
)

# Python's own precedence: `|` and `&` (our logical or/and) bind tighter than comparisons.
_PREC = {"<": 3, "<=": 3, ">": 3, ">=": 3, "or": 4, "and": 5, "+": 6, "-": 6, "*": 7, "/": 7, "//": 7, "%": 7,
         "neg": 8, "pow": 9}
_COMPARE = ("<", "<=", ">", ">=")
_INFIX = {"and": "&", "or": "|", "pow": "**"}
_FUNC_OPS = {"max": "maximum", "min": "minimum", "==": "eq", "!=": "ne"}
_DEFAULT_LITERAL = {"f32", "i32", "bool"}


def _literal_text(v: float | int | bool) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "INF" if v > 0 else "-INF"
    if isinstance(v, float) and math.isnan(v):
        return "NAN"
    return repr(v)


def _literal(c: Const) -> str:
    """A constant as the builder would recreate it: a bare literal where that gives
    the same dtype, ``const(v, "dtype")`` otherwise."""
    text = _literal_text(c.value)
    if c.dtype.name in _DEFAULT_LITERAL and (c.dtype.name != "f32" or isinstance(c.value, float)):
        return text
    return f'const({text}, "{c.dtype}")'


def _explicit(c: Expr) -> bool:
    return isinstance(c, Const)


def _const_call(c: Const) -> str:
    return f'const({_literal_text(c.value)}, "{c.dtype}")'


def expr_to_str(e: Expr, prec: int = 0, names: dict[str, str] | None = None) -> str:
    """Python source for an expression; ``names`` maps tensor names to their Python identifiers.

    Where every operand is a constant, one is printed as ``const(...)`` so that Python
    builds the node instead of computing the value.
    """
    def sub(x: Expr, p: int = 0, force: bool = False) -> str:
        if force and isinstance(x, Const):
            return _const_call(x)
        return expr_to_str(x, p, names)

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        text = _literal(e)
        return f"({text})" if text.startswith("-") and prec > 0 else text
    if isinstance(e, Load):
        return f"{(names or {}).get(e.tensor.name, e.tensor.name)}[{', '.join(sub(i) for i in e.indices)}]"
    if isinstance(e, Cast):
        v = e.value
        inner = f'const({_literal_text(v.value)}, "{v.dtype}")' if isinstance(v, Const) else sub(v)
        return f'cast("{e.type}", {inner})'
    if isinstance(e, Select):
        both = _explicit(e.true_value) and _explicit(e.false_value)
        return f"select({sub(e.cond)}, {sub(e.true_value, 0, both)}, {sub(e.false_value)})"
    if isinstance(e, Call):
        arg = e.args[0]
        if e.fn == "neg":
            text = f"-{sub(arg, _PREC['neg'] + 1, True)}"
            return f"({text})" if prec > _PREC["neg"] else text
        if e.fn == "not":
            return f"~{sub(arg, 99, True)}"
        return f"{e.fn}({sub(arg, 0, True)})"
    if isinstance(e, BinOp):
        both = _explicit(e.a) and _explicit(e.b)
        if e.op in _FUNC_OPS:
            return f"{_FUNC_OPS[e.op]}({sub(e.a, 0, both)}, {sub(e.b)})"
        p = _PREC[e.op]
        sym = _INFIX.get(e.op, e.op)
        if e.op == "pow":  # right-associative
            text = f"{sub(e.a, p + 1, both)} {sym} {sub(e.b, p)}"
        else:
            text = f"{sub(e.a, p, both)} {sym} {sub(e.b, p + 1)}"
        return f"({text})" if p < prec or (p == prec and e.op in _COMPARE) else text
    raise TypeError(f"cannot print {type(e).__name__}")


def _iter_spec(iv: IterVar, bind: Expr | None) -> str:
    fn = "reduce" if iv.is_reduce else "spatial"
    if bind is None:
        return expr_to_str(iv.extent) if not iv.is_reduce else f"reduce({expr_to_str(iv.extent)})"
    return f"{fn}({expr_to_str(iv.extent)}, {expr_to_str(bind)})"


def _reducer_args(b: Block, names: dict[str, str]) -> str:
    if b.reducer is None:
        return ""
    r, st = b.reducer, b.store
    args = []
    inferred = None
    if isinstance(st.value, BinOp) and b.reduce_term() is not None:
        inferred = reducer_for_op(st.value.op, st.tensor.dtype)
    if r != inferred:
        args.append(f"reducer={_reducer_text(r)}")
    if b.init is None:
        args.append("init=NO_INIT")
    elif b.init != r.identity:
        args.append(f"init={expr_to_str(b.init, 0, names)}")  # type: ignore[arg-type]
    return "".join(f", {a}" for a in args)


def _reducer_text(r: Reducer) -> str:
    if r == builtin_reducer(r.name, r.dtype) if r.name in ("sum", "prod", "max", "min") else False:
        return f'"{r.name}"'
    body = expr_to_str(r.combine)
    return (f'make_reducer("{r.name}", lambda {r.lhs.name}, {r.rhs.name}: {body}, '
            f'identity={_literal(r.identity)}, dtype="{r.dtype}")')


def _compact_nest(s: Stmt) -> Block | None:
    """The block of a perfect, plain loop nest that binds it by identity, else None."""
    loops: list[Loop] = []
    while isinstance(s, Loop):
        if s.kind != SERIAL or s.thread is not None or s.annotations:
            return None
        loops.append(s)
        s = s.body
    if not isinstance(s, Block) or len(loops) != len(s.iters):
        return None
    for lp, iv, b in zip(loops, s.iters, s.bindings, strict=True):
        if lp.var.name != iv.var.name or b != Var(iv.var.name) or lp.extent != iv.extent:
            return None
    return s


def _unpack(names: list[str]) -> str:
    return f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"


def _stmt_lines(s: Stmt, indent: int, out: list[str], names: dict[str, str]) -> None:
    pad = "    " * indent
    compact = _compact_nest(s)
    if compact is not None:
        b = compact
        specs = ", ".join(f"{iv.var.name}={_iter_spec(iv, None)}" for iv in b.iters)
        head = f'{pad}with p.nest("{b.name}", {specs}{_reducer_args(b, names)})'
        out.append(f"{head} as {_unpack([iv.var.name for iv in b.iters])}:")
        _body_lines(b, indent + 1, out, names)
    elif isinstance(s, Seq):
        for c in s.stmts:
            _stmt_lines(c, indent, out, names)
    elif isinstance(s, Loop):
        extra = ""
        if s.kind == BOUND:
            extra += f', thread="{s.thread}"'
        elif s.kind != SERIAL:
            extra += f', kind="{s.kind}"'
        if s.annotations:
            extra += f", annotations={s.annotations!r}"
        out.append(f'{pad}with p.loop("{s.var.name}", {expr_to_str(s.extent)}{extra}) as {s.var.name}:')
        _stmt_lines(s.body, indent + 1, out, names)
    elif isinstance(s, Block):
        specs = ", ".join(f"{iv.var.name}={_iter_spec(iv, b)}" for iv, b in zip(s.iters, s.bindings, strict=True))
        head = f'{pad}with p.block("{s.name}", {specs}{_reducer_args(s, names)})'
        out.append(f"{head} as {_unpack([iv.var.name for iv in s.iters])}:")
        _body_lines(s, indent + 1, out, names)
    else:
        raise TypeError(f"cannot print {type(s).__name__}")


def _body_lines(b: Block, indent: int, out: list[str], names: dict[str, str]) -> None:
    """The block's predicate (``p.where(...)``), if any, then its store."""
    pad = "    " * indent
    if b.where is not None:
        out.append(f"{pad}p.where({expr_to_str(b.where, 0, names)})")
    st = b.store
    idx = ", ".join(expr_to_str(i) for i in st.indices)
    target = names.get(st.tensor.name, st.tensor.name)
    out.append(f"{'    ' * indent}{target}[{idx}] = {expr_to_str(st.value, 0, names)}")


def stmt_to_str(s: Stmt) -> str:
    out: list[str] = []
    _stmt_lines(s, 0, out, {})
    return "\n".join(out)


def print_program(program: Program) -> str:
    """The program as builder Python defining ``program()``."""
    names = _tensor_identifiers(program)
    lines = ["from polyfuse.ir import *", "", "", "def program():", f'    p = ProgramBuilder("{program.name}")']
    for v in program.params:
        lines.append(f'    {v.name} = p.size("{v.name}")')
    for t in program.tensors:
        shape = ", ".join(expr_to_str(d) for d in t.shape) + ("," if t.ndim == 1 else "")
        role = {INPUT: "input", OUTPUT: "output"}.get(t.role, "temp")
        scope = f', scope="{t.scope}"' if t.scope != GLOBAL else ""
        sign = (f', sign="{t.sign}"' if t.sign is not None else "") + (", finite=True" if t.finite else "")
        lines.append(f'    {names[t.name]} = p.{role}("{t.name}", ({shape}), "{t.dtype}"{scope}{sign})')
    _stmt_lines(program.body, 1, lines, names)
    lines.append("    return p.build()")
    return "\n".join(lines) + "\n"


def _tensor_identifiers(program: Program) -> dict[str, str]:
    """Python identifiers for tensors, renamed (``k`` -> ``k_``) where a variable has the same name."""
    taken = {v.name for v in program.params} | {"p"}
    for st in walk_stmts(program.body):
        if isinstance(st, Loop):
            taken.add(st.var.name)
        elif isinstance(st, Block):
            taken |= {iv.var.name for iv in st.iters}
    out = {}
    for t in program.tensors:
        ident = t.name
        while ident in taken:
            ident += "_"
        taken.add(ident)
        out[t.name] = ident
    return out


def program_from_source(text: str) -> Program:
    """Execute printed program text and return its Program."""
    namespace: dict[str, object] = {}
    exec(compile(text, "<polyfuse program>", "exec"), namespace)
    return namespace["program"]()  # type: ignore[operator]
