"""Staging a tensor-core operand in shared memory: the copy loops (CUDA).

Where an operand comes from is decided by the kernel plan (:class:`~polyfuse.emit_cpp.dotplan.OperandPlan`);
this module prints the copies:

* raw 16-bit operands are copied eight values (128 bits) at a time, by ``cp.async`` (:func:`copy_async`) or
  through registers (:func:`stage_raw`); each thread steps its place in the staged array, and its source
  pointer where the tile's strides are constants, from one group of eight to the next (add constants, carry
  once past the end of a row) instead of dividing the group's number by the row length;
* computed or f32 operands are converted to 16 bits (split into hi + lo where f32) several neighbours at a
  time — read with vector loads where the loads allow, else ``stage_group`` elements — and stored with one
  store per part (:func:`stage_vector`), or element by element (:func:`stage_elements`).

Every split into hi + lo uses :func:`split_parts`, so the parts are the same wherever they are made.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from polyfuse.emit_cpp.dotplan import VEC16, Staged, raw_staging
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import Const, Expr
from polyfuse.tiling.htile import Slice, TileLoad, depends_on

if TYPE_CHECKING:
    from polyfuse.emit_cpp.cuda import CudaEmitter

_CHUNK = {2: "uint32_t", 4: "uint2", 8: "uint4"}
"""The integer type of ``vec`` 16-bit values, for one store."""


def split_parts(low: str, value: str, hi: str) -> tuple[str, str]:
    """C text of the 16-bit parts of f32 ``value``: ``hi = round(value)`` and ``lo = round(value - hi)``
    (0 for an infinite value, so that hi + lo is the value and its products are the program's ±inf, not
    NaN), ``hi`` naming where the hi part is held.  Every split (staging, :mod:`polyfuse.emit_cpp.presplit`)
    uses this one definition, so the parts are the same wherever they are made."""
    return (f"pf::float_to_{low}({value})",
            f"pf::float_to_{low}(pf::split_rest({value}, pf::{low}_to_float({hi})))")


def stage_raw(em: CudaEmitter, op: Staged, low: DType, arr: str) -> bool:
    """Stage ``op`` by copying its 16-bit values eight at a time (one 128-bit load and store), if it can."""
    found = raw_staging(op, low)
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
    groups are ``em.threads`` groups apart, so these (and the source pointer ``pf_p``, where the tile's strides
    in the tensor are constants: :func:`_tile_strides`) step from one group to the next by constants, with one
    carry past the end of a row at most.
    """
    groups = op.outer * op.inner // VEC16
    em.open("")
    strides = _tile_strides(em, op, load)
    em.line(f"int pf_o = pf_tid * {VEC16} / {op.inner}, pf_i = pf_tid * {VEC16} % {op.inner};")
    if not op.swizzled:  # (a swizzled place is computed from pf_o, pf_i)
        em.line(f"int pf_d = pf_o * {op.stride} + pf_i;")
    if strides is not None:
        zero = em.access(load.tensor, load.index, dict.fromkeys((*op.rows_axes, op.k), "0"))
        first = f"pf_o * {strides[0]} + pf_i * {strides[1]}"
        em.line(f"const {em.stype(load.tensor.dtype)}* pf_p = &{zero} + ({first});")
    em.element_loop(f"for (int pf_g = pf_tid; pf_g < {groups}; pf_g += {em.threads})")
    env = _staged_element(em, declare, op, ("pf_o", "pf_i"))
    action = take.format(src="pf_p[0]" if strides is not None else em.access(load.tensor, load.index, env))
    if conditions:
        test = " && ".join(f"({em.scalar(c, env)})" for c in conditions)
        em.line(f"if ({test}) {{ {action} }}")
    else:
        em.line(action)
    em.close()
    em.line(store.format(dst=f"&{arr}[{op.at('pf_o', 'pf_i') if op.swizzled else 'pf_d'}]"))
    rows, rest = divmod(em.threads * VEC16, op.inner)
    step = [("pf_o", rows), ("pf_i", rest)]
    carry = [("pf_i", -op.inner), ("pf_o", 1)]
    if not op.swizzled:
        step.append(("pf_d", rows * op.stride + rest))
        carry.append(("pf_d", op.stride - op.inner))
    if strides is not None:
        step.append(("pf_p", rows * strides[0] + rest * strides[1]))
        carry.append(("pf_p", strides[0] - op.inner * strides[1]))
    em.line(" ".join(f"{v} += {n};" for v, n in step if n))
    if rest:
        em.line(f"if (pf_i >= {op.inner}) {{ {' '.join(f'{v} += {n};' for v, n in carry if n)} }}")
    em.close()
    em.close()


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


def stage_vector(em: CudaEmitter, op: Staged, low_name: str, arr: str) -> bool:
    """Stage ``op`` (converted to 16 bits, split hi + lo) ``vec`` elements at a time: each thread computes
    ``vec`` neighbours along the staged rows — read with vector loads where its loads allow (f32: 128-bit
    loads of 4), else element by element (``stage_group`` of them) — and stores each part with one
    ``vec × 2``-byte store, instead of two 2-byte stores per element."""
    if op.trans and len(op.rows_axes) != 1:
        return False
    fast = op.rows_axes[0] if op.trans else op.k
    extent = op.rows if op.trans else op.kk
    vec, loads = em.lane_plan([op.x], fast)
    if not loads:
        # No vector reads (attention's P, computed from shared scores): still grouped stores, unless most
        # rows are padding (decode's one query row).
        vec = em.options.stage_group if op.rows * 2 >= op.rows_pad else 1
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
    em.line(f"const int pf_at = {op.at(f'pf_e / {op.inner}', f'pf_e % {op.inner}')};")
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
    found = raw_staging(op, low)
    assert found is not None
    load = found[0]
    _raw_groups(em, op, *found, arr, f"const {em.stype(low)}* pf_src = {load.tensor.name}; bool pf_ok = false;",
                "pf_src = &{src}; pf_ok = true;", "pf::cp_async16({dst}, pf_src, pf_ok);")


def stage_elements(em: CudaEmitter, op: Staged, low_name: str, arr: str) -> None:
    """Stage ``op`` element by element: compute, convert to 16 bits (split hi + lo where f32), store."""
    em.element_loop(f"for (int pf_e = pf_tid; pf_e < {op.outer * op.inner}; pf_e += {em.threads})")
    env = _staged_element(em, "float pf_v = 0.0f;", op)
    em.line(f"pf_v = {em.convert(em.scalar(op.x, env), op.x.dtype, dt.f32)};")
    em.close()
    em.line(f"const int pf_at = {op.at(f'pf_e / {op.inner}', f'pf_e % {op.inner}')};")
    hi, lo = split_parts(low_name, "pf_v", "pf_hi")
    em.line(f"const uint16_t pf_hi = {hi};")
    em.line(f"{arr}[pf_at] = pf_hi;")
    if op.split:
        em.line(f"{arr}[{op.size} + pf_at] = {lo};")
    em.close()


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


