"""Well-formedness of a Program, checked when it is built and after transforms."""

from __future__ import annotations

from polyfuse.errors import IRError
from polyfuse.ir.affine import check_affine
from polyfuse.ir.expr import BinOp, Call, Cast, Expr, Load, Select, conjuncts
from polyfuse.ir.gather import check_gather_index
from polyfuse.ir.stmt import THREAD_TAGS, Block, Loop, Program, Seq, Stmt, Tensor, LOOP_KINDS, BOUND
from polyfuse.ir.visit import walk_expr


def validate(program: Program) -> Program:
    """Check names, scoping, affinity, index counts and dtypes; return the program."""
    params = {p.name for p in program.params}
    tensors: dict[str, Tensor] = {}
    for t in program.tensors:
        if t.name in tensors:
            raise IRError(f"program {program.name!r} declares tensor {t.name!r} twice")
        tensors[t.name] = t
        for d, extent in enumerate(t.shape):
            check_affine(extent, allowed=params, what=f"tensor {t.name!r}, shape dimension {d}")
    if not program.outputs:
        raise IRError(f"program {program.name!r} has no output tensor")
    seen_blocks: set[str] = set()

    def check_expr(e: Expr, where: str, scope: set[str]) -> None:
        for n in walk_expr(e):
            if isinstance(n, Load):
                _check_access(n.tensor, n.indices, where, scope, tensors, gather=True)
            elif isinstance(n, BinOp) and n.op not in ("and", "or") and n.a.dtype != n.b.dtype:
                raise IRError(f"{where}: operands of {n.op!r} have dtypes {n.a.dtype} and {n.b.dtype}: {n}")
            elif isinstance(n, Select) and n.true_value.dtype != n.false_value.dtype:
                raise IRError(f"{where}: the two values of select differ in dtype: {n}")
            elif isinstance(n, Cast) and n.value.dtype == n.type:
                raise IRError(f"{where}: cast to {n.type} of a value that already has it: {n}")
            elif isinstance(n, Call) and not n.args:
                raise IRError(f"{where}: call of {n.fn} without an argument")

    def visit(s: Stmt, loop_vars: list[str]) -> None:
        if isinstance(s, Seq):
            for c in s.stmts:
                visit(c, loop_vars)
        elif isinstance(s, Loop):
            name = s.var.name
            if name in loop_vars or name in params:
                raise IRError(f"loop {name!r} is nested inside a loop or size of the same name")
            if s.kind not in LOOP_KINDS:
                raise IRError(f"loop {name!r}: kind {s.kind!r} is not one of {LOOP_KINDS}")
            if (s.kind == BOUND) != (s.thread is not None):
                raise IRError(f"loop {name!r}: a bound loop needs a thread tag and only a bound loop has one")
            if s.thread is not None and s.thread not in THREAD_TAGS:
                raise IRError(f"loop {name!r}: thread tag {s.thread!r} is not one of {THREAD_TAGS}")
            check_affine(s.extent, allowed=params, what=f"extent of loop {name!r}")
            visit(s.body, loop_vars + [name])
        elif isinstance(s, Block):
            _check_block(s, loop_vars, params, check_expr, tensors)
            _check_where(s, tuple(p.name for p in program.params))
            if s.name in seen_blocks:
                raise IRError(f"program {program.name!r} has two blocks named {s.name!r}")
            seen_blocks.add(s.name)
        else:
            raise IRError(f"unknown statement {type(s).__name__} in program {program.name!r}")

    visit(program.body, [])
    return program


def _check_block(b: Block, loop_vars: list[str], params: set[str], check_expr, tensors: dict) -> None:
    where = f"block {b.name!r}"
    if len(b.bindings) != len(b.iters):
        raise IRError(f"{where} has {len(b.iters)} iteration variables but {len(b.bindings)} bindings")
    names = [iv.var.name for iv in b.iters]
    if len(set(names)) != len(names):
        raise IRError(f"{where} has repeated iteration variable names {names}")
    clash = sorted(set(names) & params)
    if clash:
        raise IRError(f"{where}: iteration variable {clash[0]!r} has the name of a size parameter")
    loop_scope = set(loop_vars) | params
    for iv, bnd in zip(b.iters, b.bindings, strict=True):
        check_affine(iv.extent, allowed=params, what=f"{where}, extent of {iv.var.name!r}")
        check_affine(bnd, allowed=loop_scope, what=f"{where}, binding of {iv.var.name!r}")
    scope = set(names) | params
    st = b.store
    if st.tensor.role == "input":
        raise IRError(f"{where} writes to input tensor {st.tensor.name!r}")
    _check_access(st.tensor, st.indices, f"{where}, store", scope, tensors)
    check_expr(st.value, where, scope)
    if st.value.dtype != st.tensor.dtype:
        raise IRError(f"{where}: stores a {st.value.dtype} value into {st.tensor.dtype} tensor {st.tensor.name!r}")
    if b.reduce_iters and b.reducer is None:
        red = ", ".join(iv.var.name for iv in b.reduce_iters)
        raise IRError(f"{where} has reduce iterations ({red}) but no reducer")
    if b.reducer is not None:
        if b.reducer.dtype != st.tensor.dtype:
            raise IRError(f"{where}: reducer {b.reducer.name} is over {b.reducer.dtype}, "
                          f"the output {st.tensor.name!r} is {st.tensor.dtype}")
        if b.init is not None:  # None: the reduction accumulates into the tensor's current value
            if b.init.dtype != st.tensor.dtype:
                raise IRError(f"{where}: init has dtype {b.init.dtype}, "
                              f"the output {st.tensor.name!r} is {st.tensor.dtype}")
            check_expr(b.init, f"{where}, init", {iv.var.name for iv in b.spatial_iters} | params)
    elif b.init is not None:
        raise IRError(f"{where} has an init value but is not a reduction")


WHERE_OPS = ("<", "<=", ">", ">=", "==")


def _check_where(b: Block, params: tuple[str, ...]) -> None:
    """``where`` is a conjunction of comparisons of quasi-affine expressions of the block's
    iteration variables and the sizes; a reduction with an init keeps every first instance."""
    if b.where is None:
        return
    what = f"block {b.name!r}, where"
    if not isinstance(b.where, Expr) or not b.where.dtype.is_bool:
        dtype = b.where.dtype if isinstance(b.where, Expr) else type(b.where).__name__
        raise IRError(f"{what}: the predicate {b.where} is a {dtype}, not a boolean condition")
    scope = {iv.var.name for iv in b.iters} | set(params)
    for c in conjuncts(b.where):
        if not (isinstance(c, BinOp) and c.op in WHERE_OPS):
            raise IRError(f"{what}: {c} is not a comparison; a predicate is a conjunction (&) of comparisons "
                          f"({', '.join(WHERE_OPS)}) of affine integer expressions")
        for side in (c.a, c.b):
            check_affine(side, allowed=scope, what=f"{what} {c}")
    if b.init is not None and b.reduce_iters:
        from polyfuse.deps.domains import require_init_origins  # ISL; deps builds on the IR, so imported late

        require_init_origins(b, params)


def _check_access(t: Tensor, indices, where: str, scope: set[str], tensors: dict, *, gather: bool = False) -> None:
    """Indices are affine in ``scope``; with ``gather`` (a read), an index may be a gather index."""
    if tensors.get(t.name) != t:
        raise IRError(f"{where}: tensor {t.name!r} is not declared by the program (or declared differently)")
    if len(indices) != t.ndim:
        raise IRError(f"{where}: tensor {t.name!r} has {t.ndim} dimensions but is indexed with {len(indices)}")
    check = check_gather_index if gather else check_affine
    for d, idx in enumerate(indices):
        check(idx, allowed=scope, what=f"{where}: index {d} of tensor {t.name!r}")
