"""Printing a ``Dot`` inside a thread block as its :class:`~polyfuse.emit_cpp.dotplan.DotPlan` says.

``mma.sync`` dots (:func:`_mma_dot`): the operands are staged (:mod:`polyfuse.emit_cpp.staging`, or taken
from a loop's kept tiles, :mod:`polyfuse.emit_cpp.stream`), each warp loads its fragments with ``ldmatrix``
(``.trans`` for transposed layouts) and multiplies its tiles over the k steps, its accumulators in registers;
a split ``k`` joins the warp groups' partial sums in shared memory; the epilogue adds ``acc`` and writes the
result array, or hands each result to a statement computed in place (:func:`emit_dot_into`), row by row of
the accumulator fragment, so that what the statement reads per row (a rolling update's factor and
statistics) is read once per fragment row, not once per element.  Where an operand is split into hi + lo
parts, a warp issues each tile's products with one part before those with the next (and, ``pair``, loads two
``b`` tiles with one ``ldmatrix.x4``), so that consecutive ``mma`` do not wait for each other.

Other dots: ``fma`` stages both operands in shared memory in the dot's dtype and multiplies with FMAs;
``block reduce`` is a block reduction of the products; ``per-output loop`` sums each output's k-slice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.cfamily import axis_var
from polyfuse.emit_cpp.dotplan import (
    BLOCK_REDUCE, FMA, LOW, MMA_SYNC, PER_OUTPUT, DotPlan, FragmentLayout, LdmatrixFragment, OperandPlan,
)
from polyfuse.emit_cpp.staging import copy_async, stage_elements, stage_raw, stage_vector
from polyfuse.emit_cpp.stream import consume, publish
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Cast, Expr
from polyfuse.tiling.htile import Dot, Reduce, axes_of

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter


def emit_dot(em: CudaEmitter, plan: DotPlan, e: Dot, name: str, axes: tuple[str, ...]) -> None:
    """``name = e`` (an array over ``axes``, rows ``plan.pitch`` apart if given), as ``plan`` says."""
    if plan.instruction == MMA_SYNC:
        _mma_dot(em, plan, e, name)
    elif plan.instruction == BLOCK_REDUCE:
        _reduce_dot(em, e, name, axes)
    elif plan.instruction == PER_OUTPUT:
        _batched_dot(em, e, name, axes)
    else:
        assert plan.instruction == FMA
        _fma_dot(em, e, name)


def emit_dot_into(em: CudaEmitter, plan: DotPlan, e: Dot, write: Callable[[dict[str, str], str], None],
                  rows: Callable[[dict[str, str]], None] | None = None) -> None:
    """A tensor-core dot whose epilogue hands each result (f32 text) to ``write(env, value)``.

    The epilogue visits the thread's two fragment rows in turn; ``rows(env)`` is called once per row,
    before its columns, with the row's axes bound: what it declares there is in scope for ``write``.
    """
    assert plan.instruction == MMA_SYNC
    _mma_dot(em, plan, e, None, write, rows)


def _fma_dot(em: CudaEmitter, e: Dot, name: str) -> None:
    ct = em.ctype(e.dtype)
    size = 8 if ct == "double" else 4
    k = e.axis
    m_axes = tuple(x for x in axes_of(e.a) if x != k)
    n_axes = tuple(x for x in axes_of(e.b) if x != k and x not in m_axes)
    kk = em.sizes[k]
    mm = math.prod(em.sizes[x] for x in m_axes)
    nn = math.prod(em.sizes[x] for x in n_axes)
    sa, sb = em.fresh("fa"), em.fresh("fb")
    em.shared_array(ct, sa, mm * kk * size)
    em.shared_array(ct, sb, kk * nn * size)
    for arr, x, rows, cols in ((sa, e.a, m_axes, (k,)), (sb, e.b, (k,), n_axes)):
        total = math.prod(em.sizes[a] for a in rows + cols)
        em.element_loop(f"for (int pf_e = pf_tid; pf_e < {total}; pf_e += {em.threads})")
        env = em.decode(rows + cols, "pf_e")
        em.line(f"{arr}[pf_e] = {em.convert(em.scalar(x, env), x.dtype, e.dtype)};")
        em.close()
    em.barrier()
    em.element_loop(f"for (int pf_e = pf_tid; pf_e < {mm * nn}; pf_e += {em.threads})")
    em.line(f"const int pf_m = pf_e / {nn}, pf_n = pf_e % {nn};")
    em.line(f"{ct} pf_s = 0;")
    em.line(f"for (int pf_k = 0; pf_k < {kk}; ++pf_k) pf_s += {sa}[pf_m * {kk} + pf_k] * {sb}[pf_k * {nn} + pf_n];")
    env = {**em.decode(m_axes, "pf_m"), **em.decode(n_axes, "pf_n")}
    em.line(f"{name}[pf_e] = {em.rounded(f'({em.scalar(e.acc, env)} + pf_s)', e.dtype)};")
    em.close()


def _reduce_dot(em: CudaEmitter, e: Dot, name: str, axes: tuple[str, ...]) -> None:
    """A dot with few outputs and a long ``k`` (a row's sum of squares): a block reduction of ``a·b``.

    Each output gets a group of threads that reads its ``k`` slice directly (vector loads where
    aligned), then shuffles and, past a warp, shared memory combine the partial sums.
    """
    product = BinOp("*", _as(e.a, e.dtype), _as(e.b, e.dtype))
    partial = em.fresh("sum")
    size = math.prod(em.sizes[a] for a in axes)
    ct = em.ctype(e.dtype)
    em.shared_array(ct, partial, size * (8 if ct == "double" else 4))
    em.block_reduce(Reduce("sum", product, e.axis), partial, axes)
    em.barrier()
    em.element_loop(f"for (int pf_e = pf_tid; pf_e < {size}; pf_e += {em.threads})")
    env = em.decode(axes, "pf_e")
    em.line(f"{name}[pf_e] = {em.rounded(f'({em.scalar(e.acc, env)} + {partial}[pf_e])', e.dtype)};")
    em.close()


def _as(x: Expr, d: DType) -> Expr:
    return x if x.dtype == d else Cast(d, x)


def _batched_dot(em: CudaEmitter, e: Dot, name: str, axes: tuple[str, ...]) -> None:
    """A dot with batch axes: each output element sums its k-slice directly."""
    total = math.prod(em.sizes[a] for a in axes)
    em.element_loop(f"for (int pf_e = pf_tid; pf_e < {total}; pf_e += {em.threads})")
    env = em.decode(axes, "pf_e")
    em.line(f"{name}[pf_e] = {serial_dot(em, e, env, 'pf_s')};")
    em.close()


def serial_dot(em: CudaEmitter, e: Dot, env: dict[str, str], acc: str) -> str:
    """Emit ``acc = Σ_k a·b`` for the output element at ``env`` (one thread's loop); return ``e.acc + acc``."""
    k = axis_var(e.axis)
    em.line(f"{em.ctype(e.dtype)} {acc} = 0;")
    em.open(em.axis_loop(e.axis, em.sizes[e.axis]))
    inner = {**env, e.axis: k}
    a = em.convert(em.scalar(e.a, inner), e.a.dtype, e.dtype)
    b = em.convert(em.scalar(e.b, inner), e.b.dtype, e.dtype)
    em.line(f"{acc} += {a} * {b};")
    em.close()
    return em.rounded(f"({em.scalar(e.acc, env)} + {acc})", e.dtype)


def _mma_dot(em: CudaEmitter, plan: DotPlan, e: Dot, name: str | None,
             write: Callable[[dict[str, str], str], None] | None = None,
             rows: Callable[[dict[str, str]], None] | None = None) -> None:
    assert plan.a is not None and plan.b is not None and plan.low is not None and plan.fragment is not None
    frag = plan.fragment
    low = plan.low
    a, b = plan.a.staged, plan.b.staged
    m_axes, n_axes = a.rows_axes, b.rows_axes
    mm, nn, kk = a.rows, b.rows, a.kk
    mp, np_, kp = a.rows_pad, b.rows_pad, a.kp
    low_name = LOW[low.name]
    em.line(f"// tensor cores: {mm}x{nn}x{kk} ({mp}x{np_}x{kp} padded), {low} operands, "
            f"a as [{'k][m' if a.trans else 'm][k'}]{' split hi+lo' if a.split else ''}, "
            f"b as [{'k][n' if b.trans else 'n][k'}]{' split hi+lo' if b.split else ''}")
    # Stage a and b (zero padding), the contiguous axis fastest; a split operand's lo part follows its
    # hi part.  An operand its loop keeps (polyfuse.emit_cpp.stream) is in the loop's buffer.
    arrays: list[str] = []
    own: list[tuple[OperandPlan, str]] = []
    for op, hint in ((plan.a, "ta"), (plan.b, "tb")):
        arr = em.fresh(hint)
        arrays.append(arr)
        if op.source in ("kept", "held"):
            consume(em, op, low, arr)
        else:
            em.shared_array("uint16_t", arr, op.staged.nbytes)
            own.append((op, arr))
    # The cp.async copies first: they are in flight while the other operand is converted.
    copying = False
    for op, arr in own:
        for part, offset in op.parts:
            copy_async(em, part, low, f"({arr} + {offset})" if offset else arr)
            copying = True
    for op, arr in own:
        if op.source == "cp.async":
            continue
        if op.source == "raw" and stage_raw(em, op.staged, low, arr):
            continue
        if stage_vector(em, op.staged, low_name, arr):
            continue
        stage_elements(em, op.staged, low_name, arr)
    sa, sb = arrays
    if copying:
        em.line("pf::cp_async_commit();")
        em.line("pf::cp_async_wait<0>();")
    publish(em, plan, waited=copying)
    warps = em.threads // em.warp
    groups, per, kgroups, pair = plan.groups, plan.per, plan.kgroups, plan.pair
    units = plan.units
    ntiles = np_ // 8
    mma = f"pf::mma_{LOW[low.name]}"
    em.line(f"const int pf_warp = pf_tid / {em.warp}, pf_lane = pf_tid % {em.warp};")
    if kgroups > 1:
        em.line(f"const int pf_kg = pf_warp / {units};  // this warp's share of k: steps pf_kg, pf_kg + {kgroups}, ...")
        em.open(f"for (int pf_t = pf_warp % {units}; pf_t < {units}; pf_t += {warps})")
    else:
        em.open(f"for (int pf_t = pf_warp; pf_t < {units}; pf_t += {warps})")
    em.line(f"const int pf_mt = pf_t / {groups}, pf_ng = pf_t % {groups};")
    em.line(f"float pf_c[{per}][4] = {{}};")
    if kgroups > 1:
        em.open(f"for (int pf_kk = pf_kg * 16; pf_kk < {kp}; pf_kk += {16 * kgroups})")
    else:
        em.open(f"for (int pf_kk = 0; pf_kk < {kp}; pf_kk += 16)")
    fa = LdmatrixFragment("a", a.trans)
    _fragments(em, "pf_fa", fa.registers, fa.instruction, sa, fa.address("pf_lane", "pf_mt", "pf_kk", a.stride),
               a.size, a.split)
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; pf_nb += {pair})" if pair > 1 else
            f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line(f"const int pf_nt = pf_ng * {per} + pf_nb;")
    em.open(f"if (pf_nt < {ntiles})")
    fb = LdmatrixFragment("b", b.trans, pair)
    b_at = fb.address("pf_lane", "pf_nt", "pf_kk", b.stride)
    if pair > 1:
        _paired_fragments(em, fb.instruction, sb, b_at, b.size, b.split)
    else:
        _fragments(em, "pf_fb", fb.registers, fb.instruction, sb, b_at, b.size, b.split)
    # The tiles' products with one part, then with the next: the mma of one accumulator are apart.
    for fa, fb in (("pf_fa", "pf_fb"), *((("pf_fa_lo", "pf_fb"),) if a.split else ()),
                   *((("pf_fa", "pf_fb_lo"),) if b.split else ())):
        for j in range(pair):
            em.line(f"{mma}(pf_c[pf_nb{f' + {j}' if j else ''}], {fa}, {fb}{j if pair > 1 else ''});")
    em.close()
    em.close()
    em.close()
    if kgroups > 1:
        _join_k_groups(em, kgroups, units, per)
    # Epilogue: the accumulator fragment's elements (M16N8: rows lane/4 (+8), columns 2*(lane%4) (+1)).
    if write is not None:
        _row_epilogue(em, e, frag, write, rows, (mm, mp, m_axes), (nn, per, groups, n_axes))
        em.close()
        if kgroups > 1:
            em.close()
        return
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    pitch = plan.pitch
    if pitch is not None:
        # Pairs of neighbouring columns (nn is even, so both or neither exist) as one 8-byte store.
        em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
        em.line(f"const int pf_m = pf_mt * 16 + {frag.row('pf_lane', 'pf_h')};")
        em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + {frag.col('pf_lane', '0')};")
        em.open(f"if (pf_m < {mm} && pf_n < {nn})")
        row_env = em.decode(m_axes, "pf_m")
        both = [em.rounded(f"({em.scalar(e.acc, {**row_env, n_axes[0]: col})} + pf_c[pf_nb][pf_h * 2 + {d}])",
                           e.dtype) for d, col in enumerate(("pf_n", "(pf_n + 1)"))]
        em.line(f"*reinterpret_cast<float2*>(&{name}[pf_m * {pitch} + pf_n]) = make_float2({both[0]}, {both[1]});")
    else:
        em.open("for (int pf_q = 0; pf_q < 4; ++pf_q)")
        em.line(f"const int pf_m = pf_mt * 16 + {frag.row('pf_lane', '(pf_q / 2)')};")
        em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + {frag.col('pf_lane', 'pf_q % 2')};")
        em.open(f"if (pf_m < {mm} && pf_n < {nn})")
        env = {**em.decode(m_axes, "pf_m"), **em.decode(n_axes, "pf_n")}
        total = em.rounded(f"({em.scalar(e.acc, env)} + pf_c[pf_nb][pf_q])", e.dtype)
        em.line(f"{name}[pf_m * {nn} + pf_n] = {total};")
    em.close()
    em.close()
    em.close()
    em.close()
    if kgroups > 1:
        em.close()


def _join_k_groups(em: CudaEmitter, kgroups: int, units: int, per: int) -> None:
    """Sum the partial accumulators of a split ``k`` into group 0's warps, which go on to the epilogue:
    groups 1… store theirs in shared memory (register-major, lane fastest: no bank conflicts), a block
    barrier, and group 0 adds them in group order.  Leaves the ``if`` of group 0 open."""
    part = em.fresh("kpart")
    regs = per * 4
    em.shared_array("float", part, (kgroups - 1) * units * regs * em.warp * 4)
    at = f"((pf_kg - 1) * {units} + pf_t) * {regs * em.warp} + (pf_nb * 4 + pf_q) * {em.warp} + pf_lane"
    em.open("if (pf_kg > 0)")
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    em.line(f"for (int pf_q = 0; pf_q < 4; ++pf_q) {part}[{at}] = pf_c[pf_nb][pf_q];")
    em.close()
    em.close()
    em.barrier()
    em.open("if (pf_kg == 0)")
    em.line("#pragma unroll")
    em.open(f"for (int pf_g = 1; pf_g < {kgroups}; ++pf_g)")
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    gat = at.replace("pf_kg - 1", "pf_g - 1")
    em.line("#pragma unroll")
    em.line(f"for (int pf_q = 0; pf_q < 4; ++pf_q) pf_c[pf_nb][pf_q] += {part}[{gat}];")
    em.close()
    em.close()


def _fragments(em: CudaEmitter, name: str, regs: int, load: str, arr: str, at: str, size: int, split: bool) -> None:
    """Declare and ``ldmatrix`` the fragment ``name`` (and ``name_lo`` from the lo half of a split operand)."""
    for part, offset in ((name, ""), (f"{name}_lo", f"{size} + ")) if split else ((name, ""),):
        em.line(f"uint32_t {part}[{regs}];")
        em.line(f"{load}({part}, &{arr}[{offset}{at}]);")


def _paired_fragments(em: CudaEmitter, load: str, arr: str, at: str, size: int, split: bool) -> None:
    """Declare ``pf_fb0``/``pf_fb1`` (and ``pf_fb_lo0``/``pf_fb_lo1``): the ``b`` fragments of tiles ``pf_nt`` and
    ``pf_nt + 1``, loaded by one ``ldmatrix.x4`` per part (lanes 16-31 address the second tile)."""
    for part, offset in (("pf_fb", ""), ("pf_fb_lo", f"{size} + ")) if split else (("pf_fb", ""),):
        em.line(f"uint32_t {part}[4];")
        em.line(f"{load}({part}, &{arr}[{offset}{at}]);")
        em.line(f"const uint32_t {part}0[2] = {{{part}[0], {part}[1]}}, {part}1[2] = {{{part}[2], {part}[3]}};")


def _row_epilogue(em: CudaEmitter, e: Dot, frag: FragmentLayout, write: Callable[[dict[str, str], str], None],
                  rows: Callable[[dict[str, str]], None] | None, m: tuple, n: tuple) -> None:
    """The epilogue of a dot written through ``write``: row by row (``pf_h``: rows lane/4 and lane/4 + 8 of
    the warp's strip), ``rows(env)`` first, then the row's columns (``pf_q = 2·pf_h + pf_j``).  A guard is
    emitted only where padding exists: rows past ``mm``, columns past ``nn`` or past the last tile."""
    mm, mp, m_axes = m
    nn, per, groups, n_axes = n
    em.line("#pragma unroll")
    em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
    em.line(f"const int pf_m = pf_mt * 16 + {frag.row('pf_lane', 'pf_h')};")
    em.open(f"if (pf_m < {mm})" if mm < mp else "")
    row_env = em.decode(m_axes, "pf_m")
    if rows is not None:
        rows(row_env)
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("const int pf_q = pf_h * 2 + pf_j;")
    em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + {frag.col('pf_lane', 'pf_j')};")
    em.open(f"if (pf_n < {nn})" if nn < groups * per * 8 else "")
    env = {**row_env, **em.decode(n_axes, "pf_n")}
    em.line(" ".join(f"(void){v};" for v in env.values()))  # the value may read none of them
    write(env, em.rounded(f"({em.scalar(e.acc, env)} + pf_c[pf_nb][pf_q])", e.dtype))
    for _ in range(5):
        em.close()
