"""``Dot`` inside a thread block: tensor cores (``mma.sync`` m16n8k16 via ``ldmatrix``) or f32 FMA.

A dot ``out[m.., n..] = acc + Σ_k a[m.., k]·b[k, n..]`` goes to tensor cores when

1. the target has them (CUDA) and the result is f32; where an operand is split (below), every program input
   the operands read is declared ``finite`` (:func:`_finite_inputs`);
2. an operand is exactly f16 or bf16 (a load of such a tensor, possibly cast to f32, permuted
   or selected against zero) and the other is the same type or f32.  An f32 operand (attention's
   P in P·V) is split into two 16-bit parts, ``hi = round(x)`` and ``lo = round(x - hi)``, and
   multiplied twice: ``x·y = hi·y + lo·y`` with 22 (f16) or 16 (bf16) significant bits of ``x``
   instead of 11 or 8, so the product keeps the accuracy the f32 program has at the tolerance of
   the catalog (rounding P to f16 alone, as FlashAttention does, costs 2⁻¹¹ relative and fails it).
   Two f32 operands (quant_gemm, moe_routing's gate, performer) are both split into bf16 parts
   (f32's exponent range) and multiplied three times, ``hi·hi + lo·hi + hi·lo``: about 2⁻¹⁶
   relative per product (the dropped ``lo·lo`` and the rest below 16 bits), against 2⁻²⁴ in f32,
   which the catalog tolerances of these operators (sums over K terms) absorb with margin;
3. ``a`` and ``b`` share no axis but ``k`` (no batch axes).  A dot of two f32 operands with fewer
   than ``threads / REDUCE_LANES`` outputs (a row's sum of squares) is a block reduction instead.

The operands are staged in shared memory as 16-bit values, padded to M×K multiples of 16 and N
of 8 with zeros, each in the layout that keeps its global reads coalesced: ``[m][k]`` or
``[k][m]`` for ``a``, ``[n][k]`` or ``[k][n]`` for ``b`` (the tensor's contiguous axis last);
``ldmatrix`` (``.trans`` for the transposed layouts) turns rows into fragments.  Rows are padded
by 8 elements so that the eight rows one ``ldmatrix`` reads fall in different banks.  Each warp
owns a 16-row strip and up to eight 8-column tiles of the output, whose accumulators stay in
registers across the k loop; the epilogue adds ``acc`` and writes the block's result array.  (Several
accumulator sets over interleaved k steps, so that a warp with one tile does not wait for each mma in
turn, measured slower on the H200: global prefill 1.24 → 1.49 ms, decode B=32 1.05 → 1.13, MLA 0.136 →
0.140.)  A statement computed in a dot's epilogue is written row by row: what its value reads per row
(a rolling update's factor and statistics) is read once per fragment row, not once per element
(measured on the H200: MLA decode 0.208 → 0.136 ms, MLA B=32 0.674 → 0.480, quant_gemm 4.42 → 3.17,
causal prefill 2.54 → 2.10, together with the repair's factor computed per row, see
:func:`polyfuse.symbolic.from_sympy`).  Such per-row parts (``exp(m - m')``, quant_gemm's ``r/r'``)
are computed there, per fragment row, rather than in a pass of their own through shared memory.

Other dots stage their operands in shared memory in the dot's dtype and multiply with FMAs, except
those with few outputs and a long ``k``, which are block reductions of the products.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.emit_cpp import presplit
from polyfuse.emit_cpp.cfamily import axis_var
from polyfuse.emit_cpp.vector import aligned
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Cast, Const, Expr, Select
from polyfuse.ir.stmt import INPUT
from polyfuse.tiling.htile import Broadcast, Dot, Permute, Reduce, Slice, TileLoad, axes_of, depends_on, walk_tile_expr

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

LOW = {"f16": "f16", "bf16": "bf16"}
VEC16 = 8
"""16-bit values per 128-bit copy."""
REDUCE_LANES = 8
"""A non-tensor-core dot with at least this many threads per output and this long a ``k`` runs as a
block reduction (:func:`_reduce_dot`) instead of staging its operands for per-output FMA loops."""


def exact_low(x: Expr) -> DType | None:
    """The 16-bit float type ``x`` holds exactly (its values are such numbers), else None."""
    if x.dtype.name in LOW:
        return x.dtype
    if isinstance(x, Cast):
        return exact_low(x.value) if x.value.dtype.name in LOW or isinstance(x.value, (Permute, Select)) else None
    if isinstance(x, Permute):
        return exact_low(x.tile)
    if isinstance(x, Broadcast) and axes_of(x.tile) == tuple(a for a, _ in x.axes):
        return exact_low(x.tile)
    if isinstance(x, Select):
        t, f = x.true_value, x.false_value
        if isinstance(f, Const) and f.value == 0:
            return exact_low(t)
        if isinstance(t, Const) and t.value == 0:
            return exact_low(f)
    return None


def contiguous_axis(x: Expr, default: str) -> str:
    """The tile axis that runs along the last dimension of the first tensor ``x`` loads."""
    for n in walk_tile_expr(x):
        if isinstance(n, TileLoad):
            if any(isinstance(i, Slice) for i in n.index):
                last = n.index[-1]
                return last.axis if isinstance(last, Slice) else default
    return default


def mma_type(em: CudaEmitter, e: Dot) -> DType | None:
    """The operand type of a tensor-core lowering of ``e``, or None if it does not qualify."""
    if not em.tensor_cores or e.dtype != dt.f32:
        return None
    a_axes, b_axes = axes_of(e.a), axes_of(e.b)
    if e.axis not in a_axes or e.axis not in b_axes:
        return None
    if set(a_axes) & set(b_axes) - {e.axis}:
        return None
    ta, tb = exact_low(e.a), exact_low(e.b)
    if ta is not None and tb is not None and ta != tb:
        return None
    if (ta is None or tb is None) and not _finite_inputs(e):
        return None
    if ta is None and tb is None:
        # Two f32 operands: both split into bf16 hi + lo (f32's range; f16's would overflow past
        # 65504), three products hi·hi + lo·hi + hi·lo; a block reduction if there are few outputs.
        if _few_outputs(em, e):
            return None
        return dt.bf16 if e.a.dtype == dt.f32 and e.b.dtype == dt.f32 else None
    return ta or tb


def _finite_inputs(e: Dot) -> bool:
    """Every program input the operands read is declared ``finite``: a split product needs it.

    With an f32 operand split, ``x·y`` is ``hi·y + lo·y`` (or three products of parts): an infinite x
    or y meets a part that is 0 or of the other sign, ``0·inf`` or ``inf - inf``, NaN where the program
    has ±inf.  NaN inputs stay NaN either way, and values computed in the kernel from finite inputs
    are finite or NaN (a probability ``exp(s - m) <= 1``, a scaled value ``448·a/max|a|``).  Without
    the declaration the dot multiplies in f32 with FMAs, as the program does.
    """
    loads = [n for x in (e.a, e.b) for n in walk_tile_expr(x) if isinstance(n, TileLoad)]
    return all(ld.tensor.finite for ld in loads if ld.tensor.role == INPUT)


def _few_outputs(em: CudaEmitter, e: Dot) -> bool:
    """Whether ``e`` has so few outputs for its ``k`` that a block reduction suits it (:func:`_reduce_dot`)."""
    k = e.axis
    m_axes = [x for x in axes_of(e.a) if x != k]
    n_axes = [x for x in axes_of(e.b) if x != k and x not in m_axes]
    outputs = math.prod(em.sizes[x] for x in m_axes + n_axes)
    return outputs * REDUCE_LANES <= em.threads and em.sizes[k] >= REDUCE_LANES


def dot_pitch(em: CudaEmitter, e: Dot, axes: tuple[str, ...]) -> int | None:
    """The row pitch of a tensor-core dot's result array, or None for a dense array.

    The epilogue writes pairs of f32 from eight rows at once; rows ``pitch ≡ 8 (mod 32)`` words
    apart put each half-warp's pairs in 32 different banks (a pitch of ``n`` would give 8-way
    conflicts when ``n`` is a multiple of 32).
    """
    if mma_type(em, e) is None:
        return None
    n_axes = tuple(x for x in axes_of(e.b) if x != e.axis)
    if len(n_axes) != 1 or len(axes) < 2 or axes[-1] != n_axes[0] or em.sizes[axes[-1]] % 2:
        return None
    nn = em.sizes[axes[-1]]
    return nn + (8 - nn) % 32


def emit_dot(em: CudaEmitter, e: Dot, name: str, axes: tuple[str, ...], pitch: int | None = None) -> None:
    low = mma_type(em, e)
    if low is None:
        _fma_dot(em, e, name, axes)
    else:
        _mma_dot(em, e, name, low, pitch)


def emit_dot_into(em: CudaEmitter, e: Dot, write: Callable[[dict[str, str], str], None],
                  rows: Callable[[dict[str, str]], None] | None = None, split_k: bool = True) -> None:
    """A tensor-core dot whose epilogue hands each result (f32 text) to ``write(env, value)``.

    The epilogue visits the thread's two fragment rows in turn; ``rows(env)`` is called once per row,
    before its columns, with the row's axes bound: what it declares there is in scope for ``write``.
    ``split_k=False`` keeps the warp tiling of :func:`warp_tiling` (registers laid out by it receive the
    results: :mod:`polyfuse.emit_cpp.registers`) where :func:`k_groups` would split ``k``.
    """
    low = mma_type(em, e)
    assert low is not None
    _mma_dot(em, e, None, low, None, write, rows, split_k)


def _fma_dot(em: CudaEmitter, e: Dot, name: str, axes: tuple[str, ...]) -> None:
    ct = em.ctype(e.dtype)
    size = 8 if ct == "double" else 4
    k = e.axis
    m_axes = tuple(x for x in axes_of(e.a) if x != k)
    n_axes = tuple(x for x in axes_of(e.b) if x != k and x not in m_axes)
    batch = tuple(x for x in axes_of(e.b) if x != k and x in m_axes)
    if batch:
        _batched_dot(em, e, name, axes)
        return
    kk = em.sizes[k]
    mm = math.prod(em.sizes[x] for x in m_axes)
    nn = math.prod(em.sizes[x] for x in n_axes)
    if _few_outputs(em, e):
        _reduce_dot(em, e, name, axes)
        return
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


@dataclass(frozen=True)
class Staged:
    """How one operand of a tensor-core dot lies in shared memory: ``[k][rows]`` if ``trans``, else
    ``[rows][k]``, zero-padded to ``rows_pad`` × ``kp``, rows ``stride`` elements apart; a split
    operand's lo part follows its hi part, ``size`` elements later.

    Staging writes ``outer × inner`` elements.  ``[rows][k]`` operands skip their padding rows: row ``r``
    of a product depends on row ``r`` of ``a`` (column of ``b``) only, and the epilogue drops padding
    rows and columns, so whatever the shared memory held there never reaches a result (decode's single
    query row stages 1 row of 16, not 16).  The padding of ``k`` is written as zeros: it enters every sum.
    """

    x: Expr
    rows: int
    rows_pad: int
    rows_axes: tuple[str, ...]
    trans: bool
    stride: int
    split: bool
    size: int
    k: str
    kk: int
    kp: int

    @property
    def outer(self) -> int:
        return self.kp if self.trans else self.rows

    @property
    def inner(self) -> int:
        return self.rows_pad if self.trans else self.kp


def staging(em: CudaEmitter, e: Dot) -> tuple[Staged, Staged]:
    """The shared-memory layouts of ``e``'s operands (``e`` has a tensor-core lowering)."""
    k = e.axis
    kk = em.sizes[k]
    kp = _up(kk, 16)
    out = []
    for x, pad in ((e.a, 16), (e.b, 8)):
        axes = tuple(a for a in axes_of(x) if a != k)
        rows = math.prod(em.sizes[a] for a in axes)
        rows_pad = _up(rows, pad)
        trans = contiguous_axis(x, k) != k
        stride = (rows_pad if trans else kp) + 8
        out.append(Staged(x, rows, rows_pad, axes, trans, stride, exact_low(x) is None,
                          (kp if trans else rows_pad) * stride, k, kk, kp))
    return out[0], out[1]


def warp_tiling(em: CudaEmitter, mp: int, np_: int) -> tuple[int, int, int]:
    """How the warps cover an ``mp × np_`` output: ``mtiles`` strips of 16 rows, each in ``groups``
    groups of ``per`` 8-column tiles; warp ``w`` takes tiles ``w, w + warps, …`` (``t → (t / groups,
    t % groups)``).  ``per`` is the largest power of two up to 8 that still gives every warp a tile."""
    warps = em.threads // em.warp
    mtiles, ntiles = mp // 16, np_ // 8
    per = min(ntiles, 8)
    while per > 1 and mtiles * -(-ntiles // per) < warps:
        per //= 2
    return mtiles, -(-ntiles // per), per


def _mma_dot(em: CudaEmitter, e: Dot, name: str | None, low: DType, pitch: int | None = None,
             write: Callable[[dict[str, str], str], None] | None = None,
             rows: Callable[[dict[str, str]], None] | None = None, split_k: bool = True) -> None:
    from polyfuse.emit_cpp.stream import consume, publish

    a, b = staging(em, e)
    m_axes, n_axes = a.rows_axes, b.rows_axes
    mm, nn, kk = a.rows, b.rows, a.kk
    mp, np_, kp = a.rows_pad, b.rows_pad, a.kp
    low_name = LOW[low.name]
    em.line(f"// tensor cores: {mm}x{nn}x{kk} ({mp}x{np_}x{kp} padded), {low} operands, "
            f"a as [{'k][m' if a.trans else 'm][k'}]{' split hi+lo' if a.split else ''}, "
            f"b as [{'k][n' if b.trans else 'n][k'}]{' split hi+lo' if b.split else ''}")
    # Stage a and b (zero padding), the contiguous axis fastest; a split operand's lo part follows its
    # hi part.  An operand streamed by cp.async (polyfuse.emit_cpp.stream) is already in its buffer.
    arrays, operands, plans = [], [], []
    for op, hint in ((a, "ta"), (b, "tb")):
        arr = em.fresh(hint)
        arrays.append(arr)
        streamed = consume(em, op, arr)
        operands.append(streamed or op)
        if streamed is None:
            em.shared_array("uint16_t", arr, op.size * 2 * (2 if op.split else 1))
            plans.append((op, arr, _async_copies(em, op, low)))
    # The cp.async copies first: they are in flight while the other operand is converted.
    copying = False
    for _, arr, copies in plans:
        for part, offset in copies or ():
            copy_async(em, part, low, f"({arr} + {offset})" if offset else arr)
            copying = True
    for op, arr, copies in plans:
        if copies is not None:
            continue
        if not op.split and _stage_raw(em, op, low, arr):
            continue
        if _stage_vector(em, op, low_name, arr):
            continue
        em.element_loop(f"for (int pf_e = pf_tid; pf_e < {op.outer * op.inner}; pf_e += {em.threads})")
        env = _staged_element(em, "float pf_v = 0.0f;", op)
        em.line(f"pf_v = {em.convert(em.scalar(op.x, env), op.x.dtype, dt.f32)};")
        em.close()
        em.line(f"const int pf_at = pf_e / {op.inner} * {op.stride} + pf_e % {op.inner};")
        hi, lo = split_parts(low_name, "pf_v", "pf_hi")
        em.line(f"const uint16_t pf_hi = {hi};")
        em.line(f"{arr}[pf_at] = pf_hi;")
        if op.split:
            em.line(f"{arr}[{op.size} + pf_at] = {lo};")
        em.close()
    sa, sb = arrays
    a, b = operands
    if copying:
        em.line("pf::cp_async_commit();")
        em.line("pf::cp_async_wait<0>();")
    publish(em, waited=copying)
    warps = em.threads // em.warp
    mtiles, groups, per = warp_tiling(em, mp, np_)
    kgroups = k_groups(em, mtiles, np_ // 8, kp // 16) if split_k else 1
    if kgroups > 1:
        per = SPLIT_K_TILES
        groups = np_ // 8 // per
    units = mtiles * groups
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
    if a.trans:
        a_at = f"(pf_kk + pf_lane % 8 + (pf_lane / 16) * 8) * {a.stride} + pf_mt * 16 + ((pf_lane / 8) % 2) * 8"
    else:
        a_at = f"(pf_mt * 16 + pf_lane % 16) * {a.stride} + pf_kk + (pf_lane / 16) * 8"
    _fragments(em, "pf_fa", 4, "pf::ldmatrix_x4_trans" if a.trans else "pf::ldmatrix_x4", sa, a_at, a.size, a.split)
    pair = 2 if PAIRED_B and per % 2 == 0 and ntiles % 2 == 0 and (a.split or b.split) else 1
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; pf_nb += {pair})" if pair > 1 else
            f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line(f"const int pf_nt = pf_ng * {per} + pf_nb;")
    em.open(f"if (pf_nt < {ntiles})")
    nt = "(pf_nt + pf_lane / 16)" if pair > 1 else "pf_nt"
    if b.trans:
        b_at = f"(pf_kk + pf_lane % 16) * {b.stride} + {nt} * 8"
    else:
        b_at = f"({nt} * 8 + pf_lane % 8) * {b.stride} + pf_kk + ((pf_lane / 8) % 2) * 8"
    if pair > 1:
        _paired_fragments(em, "pf::ldmatrix_x4_trans" if b.trans else "pf::ldmatrix_x4", sb, b_at, b.size, b.split)
    else:
        _fragments(em, "pf_fb", 2, "pf::ldmatrix_x2_trans" if b.trans else "pf::ldmatrix_x2", sb, b_at, b.size,
                   b.split)
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
    # Epilogue: thread holds rows lane/4 (+8) and columns 2*(lane%4) (+1) of each 16x8 tile.
    if write is not None:
        _row_epilogue(em, e, write, rows, (mm, mp, m_axes), (nn, per, groups, n_axes))
        em.close()
        if kgroups > 1:
            em.close()
        return
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    if pitch is not None:
        # Pairs of neighbouring columns (nn is even, so both or neither exist) as one 8-byte store.
        em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
        em.line("const int pf_m = pf_mt * 16 + pf_lane / 4 + pf_h * 8;")
        em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + (pf_lane % 4) * 2;")
        em.open(f"if (pf_m < {mm} && pf_n < {nn})")
        rows = em.decode(m_axes, "pf_m")
        pair = [em.rounded(f"({em.scalar(e.acc, {**rows, n_axes[0]: col})} + pf_c[pf_nb][pf_h * 2 + {d}])", e.dtype)
                for d, col in enumerate(("pf_n", "(pf_n + 1)"))]
        em.line(f"*reinterpret_cast<float2*>(&{name}[pf_m * {pitch} + pf_n]) = make_float2({pair[0]}, {pair[1]});")
    else:
        em.open("for (int pf_q = 0; pf_q < 4; ++pf_q)")
        em.line("const int pf_m = pf_mt * 16 + pf_lane / 4 + (pf_q / 2) * 8;")
        em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + (pf_lane % 4) * 2 + pf_q % 2;")
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


SPLIT_K = True
"""A tensor-core dot with few output tiles and a long ``k`` splits ``k`` among its warps (:func:`k_groups`)."""
SPLIT_K_TILES = 2
"""8-column tiles per warp of a dot whose ``k`` is split among the warps.  Measured on the H200 (MLA decode
B=32 / B=1, ms): 2 0.406 / 0.115, 4 0.410 / 0.116, 8 0.703 / 0.197 (the partial sums of 8 groups cost a
block per SM)."""
SPLIT_K_STEPS = 16
"""Fewest 16-deep ``k`` steps (k ≥ 256) for which a dot's ``k`` is split among its warps."""


def k_groups(em: CudaEmitter, mtiles: int, ntiles: int, ksteps: int) -> int:
    """Into how many groups of warps the ``k`` steps of a tensor-core dot split (1: not split).

    Each warp owns ``SPLIT_K_TILES`` 8-column tiles and sums every ``g``-th ``k`` step of them, ``g`` the
    number of groups; the groups' partial sums meet in shared memory before the epilogue.  Where each warp
    would otherwise own one tile of a long ``k`` (MLA decode's score: 16 heads × 64 keys, k = 576), every
    warp reloaded the same rows of ``a`` from shared memory at each of 36 steps and waited on a chain of
    36 dependent mma; split in two, each ``a`` fragment serves two tiles and the chains are 18 deep.
    Measured on the H200 (split, four tiles per warp / not, ms): MLA decode B=32 0.413 / 0.425, B=1 0.116 / 0.120.
    Applies where the output has a multiple of ``SPLIT_K_TILES`` columns of tiles, the warps divide into
    whole groups of its ``mtiles × ntiles / SPLIT_K_TILES`` warp tiles, and each group gets ``SPLIT_K_STEPS / 4``
    steps or more of a ``k`` of at least ``SPLIT_K_STEPS``.  The sums are in another order than the unsplit
    product's (f32, within the catalog tolerance); a register accumulator's dot is not split (its registers
    follow :func:`warp_tiling`)."""
    warps = em.threads // em.warp
    if not SPLIT_K or ksteps < SPLIT_K_STEPS or ntiles % SPLIT_K_TILES:
        return 1
    units = mtiles * (ntiles // SPLIT_K_TILES)
    if warps % units or warps // units < 2 or ksteps < (warps // units) * SPLIT_K_STEPS // 4:
        return 1
    return warps // units


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


def _row_epilogue(em: CudaEmitter, e: Dot, write: Callable[[dict[str, str], str], None],
                  rows: Callable[[dict[str, str]], None] | None, m: tuple, n: tuple) -> None:
    """The epilogue of a dot written through ``write``: row by row (``pf_h``: rows lane/4 and lane/4 + 8 of
    the warp's strip), ``rows(env)`` first, then the row's columns (``pf_q = 2·pf_h + pf_j``).  A guard is
    emitted only where padding exists: rows past ``mm``, columns past ``nn`` or past the last tile."""
    mm, mp, m_axes = m
    nn, per, groups, n_axes = n
    em.line("#pragma unroll")
    em.open("for (int pf_h = 0; pf_h < 2; ++pf_h)")
    em.line("const int pf_m = pf_mt * 16 + pf_lane / 4 + pf_h * 8;")
    em.open(f"if (pf_m < {mm})" if mm < mp else "")
    row_env = em.decode(m_axes, "pf_m")
    if rows is not None:
        rows(row_env)
    em.line("#pragma unroll")
    em.open(f"for (int pf_nb = 0; pf_nb < {per}; ++pf_nb)")
    em.line("#pragma unroll")
    em.open("for (int pf_j = 0; pf_j < 2; ++pf_j)")
    em.line("const int pf_q = pf_h * 2 + pf_j;")
    em.line(f"const int pf_n = (pf_ng * {per} + pf_nb) * 8 + (pf_lane % 4) * 2 + pf_j;")
    em.open(f"if (pf_n < {nn})" if nn < groups * per * 8 else "")
    env = {**row_env, **em.decode(n_axes, "pf_n")}
    em.line(" ".join(f"(void){v};" for v in env.values()))  # the value may read none of them
    write(env, em.rounded(f"({em.scalar(e.acc, env)} + pf_c[pf_nb][pf_q])", e.dtype))
    for _ in range(5):
        em.close()


def _async_copies(em: CudaEmitter, op: Staged, low: DType) -> list[tuple[Staged, int]] | None:
    """The raw 16-bit parts of ``op`` to stage by cp.async, each with its offset in the staged array: the
    operand itself (``ASYNC_STAGING``), or the hi and lo arrays of a tensor split before the kernel
    (:mod:`polyfuse.emit_cpp.presplit`); None where ``op`` is staged through registers, or where its
    loop prefetches (its tiles arrive by :mod:`polyfuse.emit_cpp.stream`)."""
    if em.streaming is not None and em.streaming.stages > 0:
        return None
    halves = presplit.parts(em, op)
    if halves is not None:
        parts = [dataclasses.replace(op, x=h, split=False) for h in halves]
        if all(raw_staging(em, part, low) is not None for part in parts):
            return [(parts[0], 0), (parts[1], op.size)]
    if not op.split and ASYNC_STAGING and raw_staging(em, op, low) is not None:
        return [(op, 0)]
    return None


def split_parts(low: str, value: str, hi: str) -> tuple[str, str]:
    """C text of the 16-bit parts of f32 ``value``: ``hi = round(value)`` and ``lo = round(value - hi)``
    (0 for an infinite value, so that hi + lo is the value and its products are the program's ±inf, not
    NaN), ``hi`` naming where the hi part is held.  Every split (staging, :mod:`polyfuse.emit_cpp.presplit`)
    uses this one definition, so the parts are the same wherever they are made."""
    return (f"pf::float_to_{low}({value})",
            f"pf::float_to_{low}(pf::split_rest({value}, pf::{low}_to_float({hi})))")


def _fragments(em: CudaEmitter, name: str, regs: int, load: str, arr: str, at: str, size: int, split: bool) -> None:
    """Declare and ``ldmatrix`` the fragment ``name`` (and ``name_lo`` from the lo half of a split operand)."""
    for part, offset in ((name, ""), (f"{name}_lo", f"{size} + ")) if split else ((name, ""),):
        em.line(f"uint32_t {part}[{regs}];")
        em.line(f"{load}({part}, &{arr}[{offset}{at}]);")


PAIRED_B = True
"""In a dot with a split operand (hi + lo parts), a warp loads the ``b`` fragments of two neighbouring 8-column
tiles with one ``ldmatrix.x4`` (instead of two ``.x2``) and issues both tiles' products with one part before
those with the next, so that consecutive mma do not wait for each other.  Measured on the H200 with every dot of
even tiles paired (ms, paired / not): quant_gemm 2.34 / 2.51, causal prefill 1.74 / 1.78, GQA prefill 3.30 /
3.39, MLA decode 0.406 / 0.408; but global prefill 1.26 / 1.13, its score product (plain 16-bit operands) taking
it from 64 to 71 registers per thread (4 → 3 blocks per SM), hence split-operand dots only (with which the
benchmark still gave quant_gemm 2.33 and causal prefill 1.74, global prefill 1.13)."""


def _paired_fragments(em: CudaEmitter, load: str, arr: str, at: str, size: int, split: bool) -> None:
    """Declare ``pf_fb0``/``pf_fb1`` (and ``pf_fb_lo0``/``pf_fb_lo1``): the ``b`` fragments of tiles ``pf_nt`` and
    ``pf_nt + 1``, loaded by one ``ldmatrix.x4`` per part (lanes 16-31 address the second tile)."""
    for part, offset in (("pf_fb", ""), ("pf_fb_lo", f"{size} + ")) if split else (("pf_fb", ""),):
        em.line(f"uint32_t {part}[4];")
        em.line(f"{load}({part}, &{arr}[{offset}{at}]);")
        em.line(f"const uint32_t {part}0[2] = {{{part}[0], {part}[1]}}, {part}1[2] = {{{part}[2], {part}[3]}};")


def raw_operand(x: Expr, low: DType) -> tuple[TileLoad, list[Expr]] | None:
    """The load whose 16-bit values ``x`` is, and the conditions under which it is not zero, if so."""
    conditions: list[Expr] = []
    while True:
        if isinstance(x, Permute):
            x = x.tile
        elif isinstance(x, Cast) and x.value.dtype in (low, dt.f32):
            x = x.value
        elif isinstance(x, Broadcast) and axes_of(x.tile) == tuple(a for a, _ in x.axes):
            x = x.tile
        elif isinstance(x, Select) and isinstance(x.false_value, Const) and x.false_value.value == 0:
            conditions.append(x.cond)
            x = x.true_value
        else:
            break
    if not isinstance(x, TileLoad) or x.tensor.dtype != low:
        return None
    if x.mask is not None:
        if x.other is not None and x.other.value != 0:
            return None
        conditions.append(x.mask)
    return x, conditions


def raw_staging(em: CudaEmitter, op: Staged, low: DType) -> tuple[TileLoad, list[Expr]] | None:
    """The load and its conditions if ``op`` can be staged by copying its 16-bit values eight at a time."""
    found = raw_operand(op.x, low)
    if found is None or (op.trans and len(op.rows_axes) != 1):
        return None
    load, conditions = found
    fast = op.rows_axes[0] if op.trans else op.k
    extent = op.rows if op.trans else op.kk
    if extent % VEC16 or op.inner % VEC16 or not aligned(load.index, load.tensor.shape, fast, VEC16):
        return None
    if any(depends_on(c, fast) for c in conditions):
        return None
    return load, conditions


def _stage_raw(em: CudaEmitter, op: Staged, low: DType, arr: str) -> bool:
    """Stage ``op`` by copying its 16-bit values eight at a time (one 128-bit load and store), if it can."""
    found = raw_staging(em, op, low)
    if found is None:
        return False
    _raw_groups(em, op, *found, arr, "uint4 pf_q = make_uint4(0u, 0u, 0u, 0u);",
                "pf_q = *reinterpret_cast<const uint4*>(&{src});", "*reinterpret_cast<uint4*>({dst}) = pf_q;")
    return True


def _raw_groups(em: CudaEmitter, op: Staged, load: TileLoad, conditions: list[Expr], arr: str,
                declare: str, take: str, store: str) -> None:
    """The loop over ``op``'s 16-bit values eight at a time: ``declare`` the zero value, ``take`` the group
    at ``{src}`` where it exists and its conditions hold, then ``store`` it at ``{dst}`` in ``arr``.

    A group is at outer and inner index ``pf_o``, ``pf_i`` of the staged array, ``pf_d`` in ``arr``; a thread's
    groups are ``em.threads`` groups apart, so with ``STEPPED_GROUPS`` these (and the source pointer ``pf_p``,
    where the tile's strides in the tensor are constants: :func:`_tile_strides`) step from one group to the
    next by constants, with one carry past the end of a row at most.
    """
    groups = op.outer * op.inner // VEC16
    em.open("")
    strides = _tile_strides(em, op, load) if STEPPED_GROUPS else None
    if STEPPED_GROUPS:
        em.line(f"int pf_o = pf_tid * {VEC16} / {op.inner}, pf_i = pf_tid * {VEC16} % {op.inner};")
        em.line(f"int pf_d = pf_o * {op.stride} + pf_i;")
        if strides is not None:
            zero = em.access(load.tensor, load.index, dict.fromkeys((*op.rows_axes, op.k), "0"))
            first = f"pf_o * {strides[0]} + pf_i * {strides[1]}"
            em.line(f"const {em.stype(load.tensor.dtype)}* pf_p = &{zero} + ({first});")
        em.element_loop(f"for (int pf_g = pf_tid; pf_g < {groups}; pf_g += {em.threads})")
    else:
        em.element_loop(f"for (int pf_g = pf_tid; pf_g < {groups}; pf_g += {em.threads})")
        em.line(f"const int pf_o = pf_g * {VEC16} / {op.inner}, pf_i = pf_g * {VEC16} % {op.inner};")
        em.line(f"const int pf_d = pf_o * {op.stride} + pf_i;")
    env = _staged_element(em, declare, op, ("pf_o", "pf_i"))
    action = take.format(src="pf_p[0]" if strides is not None else em.access(load.tensor, load.index, env))
    if conditions:
        test = " && ".join(f"({em.scalar(c, env)})" for c in conditions)
        em.line(f"if ({test}) {{ {action} }}")
    else:
        em.line(action)
    em.close()
    em.line(store.format(dst=f"&{arr}[pf_d]"))
    if STEPPED_GROUPS:
        rows, rest = divmod(em.threads * VEC16, op.inner)
        step = [("pf_o", rows), ("pf_i", rest), ("pf_d", rows * op.stride + rest)]
        carry = [("pf_i", -op.inner), ("pf_o", 1), ("pf_d", op.stride - op.inner)]
        if strides is not None:
            step.append(("pf_p", rows * strides[0] + rest * strides[1]))
            carry.append(("pf_p", strides[0] - op.inner * strides[1]))
        em.line(" ".join(f"{v} += {n};" for v, n in step if n))
        if rest:
            em.line(f"if (pf_i >= {op.inner}) {{ {' '.join(f'{v} += {n};' for v, n in carry if n)} }}")
    em.close()
    em.close()


STEPPED_GROUPS = True
"""Raw staging steps each thread's place in the staged array, and its source pointer, from one group of eight
values to the next (add constants, carry once past the end of a row) instead of dividing the group's number
by the row length and building the tensor's 64-bit index at every group.  Measured on the H200 (ms, stepped /
divided): MLA decode B=32 (576-element rows, where the arithmetic was a third of the partial kernel's
instructions) 0.413 / 0.420, causal prefill S=4096 1.76 / 1.93, quant_gemm 2.51 / 2.58."""


def _tile_strides(em: CudaEmitter, op: Staged, load: TileLoad) -> tuple[int, int] | None:
    """The strides in ``load``'s tensor of the outer and inner index of ``op``'s staged array, where the index is
    affine in the tile's two axes with constant strides and the tile's offsets fit in 32 bits; else None."""
    if len(op.rows_axes) != 1 or load.tensor.name in em.shared_names:
        return None  # (a shared temporary has its own offsets: padded rows, a loop's resident copy)
    found = slice_strides(load, (op.rows_axes[0], op.k))
    if found is None:
        return None
    rows, k = found[op.rows_axes[0]], found[op.k]
    outer, inner = (k, rows) if op.trans else (rows, k)
    if (op.outer - 1) * outer + (op.inner - 1) * inner >= 2 ** 31:
        return None
    return outer, inner


def slice_strides(load: TileLoad, axes: tuple[str, ...]) -> dict[str, int] | None:
    """The element stride of each of ``axes`` in ``load``'s tensor, where each is the axis of exactly one
    ``Slice`` of the index, appears nowhere else in it, and the dimensions after its own are constants."""
    shape = load.tensor.shape
    strides: dict[str, int] = {}
    for d, i in enumerate(load.index):
        if isinstance(i, Slice) and i.axis in axes:
            if i.axis in strides or not all(isinstance(x, Const) for x in shape[d + 1:]):
                return None
            strides[i.axis] = math.prod(int(x.value) for x in shape[d + 1:])
        inner = i.start if isinstance(i, Slice) else i
        if any(depends_on(inner, a) for a in axes):
            return None
    return strides if len(strides) == len(axes) else None


ASYNC_STAGING = True
"""Raw 16-bit operands of a tensor-core dot are staged with cp.async (waited for before the dot's barrier)
instead of through registers, unless their loop prefetches (``stream.STREAM_STAGES``): every copy of a
thread is in flight at once and none holds a register.  Measured on the H200 (ms, on / off): attn_global
decode B=32 1.06 / 1.20, norm_inside decode B=32 1.11 / 1.42, causal decode 0.171 / 0.211, MLA decode 0.247 /
0.277, global prefill 1.48 / 1.60, causal prefill 2.62 / 2.67, softcap prefill 3.74 / 3.72."""
STAGE_GROUP = 4
"""Elements a thread converts and stores together when a staged operand has no vector reads.  Measured on
the H200 (ms, 4 / 1 / 8): causal prefill S=4096 2.68 / 2.80 / 2.67, global prefill 1.61 / 1.70 / –; for
decode's single query row 4 was slower (causal decode 0.216 / 0.193, norm_inside B=32 1.54 / 1.44), so
operands whose rows are mostly padding are not grouped.  It still was once their padding rows were no longer
staged (session 5, 4 / 1: norm_inside B=32 1.26 / 1.08, global B=32 1.19 / 1.06, causal decode 0.157 / 0.157)."""
_CHUNK = {2: "uint32_t", 4: "uint2", 8: "uint4"}
"""The integer type of ``vec`` 16-bit values, for one store."""


def _stage_vector(em: CudaEmitter, op: Staged, low_name: str, arr: str) -> bool:
    """Stage ``op`` (converted to 16 bits, split hi + lo) ``vec`` elements at a time: each thread computes
    ``vec`` neighbours along the staged rows — read with vector loads where its loads allow (f32: 128-bit
    loads of 4), else element by element (``STAGE_GROUP`` of them) — and stores each part with one
    ``vec × 2``-byte store, instead of two 2-byte stores per element."""
    if op.trans and len(op.rows_axes) != 1:
        return False
    fast = op.rows_axes[0] if op.trans else op.k
    extent = op.rows if op.trans else op.kk
    vec, loads = em.lane_plan([op.x], fast)
    if not loads:
        # No vector reads (attention's P, computed from shared scores): still grouped stores, unless most
        # rows are padding (decode's one query row, see STAGE_GROUP).
        vec = STAGE_GROUP if op.rows * 2 >= op.rows_pad else 1
    if vec == 1 or extent % vec or op.inner % vec:
        return False
    chunk = _CHUNK[vec]
    em.element_loop(f"for (int pf_g = pf_tid; pf_g < {op.outer * op.inner // vec}; pf_g += {em.threads})")
    em.line(f"const int pf_e = pf_g * {vec};")
    env = _staged_element(em, f"float pf_v[{vec}] = {{}};", op)
    em.load_lanes(loads, env, vec)
    for v, lane_env in em.lanes(env, fast, vec):
        em.line(f"pf_v[{v}] = {em.convert(em.scalar(op.x, lane_env), op.x.dtype, dt.f32)};")
    em.lane_arrays = {}
    em.close()
    em.line(f"const int pf_at = pf_e / {op.inner} * {op.stride} + pf_e % {op.inner};")
    em.line(f"alignas(16) uint16_t pf_hi[{vec}];")
    if op.split:
        em.line(f"alignas(16) uint16_t pf_lo[{vec}];")
    em.line("#pragma unroll")
    em.open(f"for (int pf_l = 0; pf_l < {vec}; ++pf_l)")
    hi, lo = split_parts(low_name, "pf_v[pf_l]", "pf_hi[pf_l]")
    em.line(f"pf_hi[pf_l] = {hi};")
    if op.split:
        em.line(f"pf_lo[pf_l] = {lo};")
    em.close()
    em.line(f"*reinterpret_cast<{chunk}*>(&{arr}[pf_at]) = *reinterpret_cast<const {chunk}*>(pf_hi);")
    if op.split:
        em.line(f"*reinterpret_cast<{chunk}*>(&{arr}[{op.size} + pf_at]) = *reinterpret_cast<const {chunk}*>(pf_lo);")
    em.close()
    return True


def copy_async(em: CudaEmitter, op: Staged, low: DType, arr: str) -> None:
    """Issue the cp.async copies that stage ``op`` (raw, :func:`raw_staging`) into ``arr``; elements
    outside the operand or under a false condition are zero-filled."""
    found = raw_staging(em, op, low)
    assert found is not None
    load = found[0]
    _raw_groups(em, op, *found, arr, f"const {em.stype(low)}* pf_src = {load.tensor.name}; bool pf_ok = false;",
                "pf_src = &{src}; pf_ok = true;", "pf::cp_async16({dst}, pf_src, pf_ok);")


def _staged_element(em: CudaEmitter, declare: str, op: Staged,
                    place: tuple[str, str] | None = None) -> dict[str, str]:
    """Row ``pf_r`` and ``pf_k`` of staged element ``pf_e`` of ``op`` (or of the element at outer and inner
    index ``place``), the zero value ``declare``d, and an open ``if`` for the elements inside the operand
    (padding stays zero); returns the axis environment of the element."""
    outer, inner = place or (f"pf_e / {op.inner}", f"pf_e % {op.inner}")
    if op.trans:
        em.line(f"[[maybe_unused]] const int pf_k = {outer}, pf_r = {inner};")
    else:
        em.line(f"[[maybe_unused]] const int pf_r = {outer}, pf_k = {inner};")
    em.line(declare)
    rows_in, k_in = (op.rows == op.rows_pad, op.kk == op.kp) if op.trans else (True, op.kk == op.kp)
    tests = [t for t, known in ((f"pf_r < {op.rows}", rows_in), (f"pf_k < {op.kk}", k_in)) if not known]
    em.open(f"if ({' && '.join(tests)})" if tests else "")
    return {**em.decode(op.rows_axes, "pf_r"), op.k: "pf_k"}


def _up(n: int, to: int) -> int:
    return -(-n // to) * to
