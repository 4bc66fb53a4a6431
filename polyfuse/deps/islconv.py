"""The one boundary between IR quasi-affine expressions and ISL.

IR names (sizes, loop variables, iteration variables, block and tensor names)
never reach the ISL parser: text is generated with placeholder identifiers
(``_p0``, ``_a0``, ``_b0``, ``_t``) and the real names are attached afterwards
through the ISL API.  That way a block called ``max`` or a size called ``mod``
(ISL keywords) cannot break parsing, and every ISL object still prints with the
names the user wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import islpy as isl

from polyfuse.errors import NonAffineIndex
from polyfuse.ir.affine import linear_form
from polyfuse.ir.expr import BinOp, Expr, conjuncts

IslObj = TypeVar("IslObj", isl.Set, isl.Map)


def aff_text(e: Expr, env: Mapping[str, str], *, what: str) -> str:
    """ISL text of the quasi-affine ``e`` with variables renamed through ``env``.

    ``what`` names the expression's place (block, binding, index) for errors:
    a non-affine expression or a variable not in ``env`` raises NonAffineIndex.
    """
    try:
        form = linear_form(e)
    except NonAffineIndex as err:
        raise NonAffineIndex(f"{what}: {err}") from None
    text = ""
    for atom, coeff in form.items():
        if atom == 1:
            base = ""
        elif isinstance(atom, str):
            if atom not in env:
                scope = ", ".join(sorted(env)) or "none"
                raise NonAffineIndex(f"{what}: {e} uses {atom!r}, which is not in scope here (in scope: {scope})")
            base = env[atom]
        else:
            base = _atom_text(atom, env, what)
        # ISL's parser takes ``3*x`` and ``- 3*x`` but not ``(3)*x``: emit signs explicitly.
        sign = "-" if coeff < 0 else "+"
        mag = str(abs(coeff)) if not base else (base if abs(coeff) == 1 else f"{abs(coeff)}*{base}")
        text += f" {sign} {mag}"
    return f"0{text}" if text else "0"


_ISL_COMPARE = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "="}


def condition_texts(cond: Expr, env: Mapping[str, str], *, what: str) -> list[str]:
    """ISL constraints of a conjunction of affine comparisons (a block's ``where``), one per conjunct."""
    out = []
    for c in conjuncts(cond):
        if not (isinstance(c, BinOp) and c.op in _ISL_COMPARE):
            raise NonAffineIndex(f"{what}: {c} is not a comparison of affine expressions")
        out.append(f"{aff_text(c.a, env, what=what)} {_ISL_COMPARE[c.op]} {aff_text(c.b, env, what=what)}")
    return out


def _atom_text(atom: BinOp, env: Mapping[str, str], what: str) -> str:
    """``a // d`` is ``floor(a/d)``; ``a % d`` is ``a - d*floor(a/d)`` (Python semantics, d > 0)."""
    inner = aff_text(atom.a, env, what=what)
    divisor = int(linear_form(atom.b)[1])
    floor = f"floor(({inner})/{divisor})"
    if atom.op == "//":
        return floor
    return f"(({inner}) - {divisor}*{floor})"


def param_env(params: Sequence[str]) -> dict[str, str]:
    """Placeholders of the size parameters."""
    return {p: f"_p{k}" for k, p in enumerate(params)}


def _params_text(params: Sequence[str]) -> str:
    return "[" + ", ".join(f"_p{k}" for k in range(len(params))) + "]"


def _rename_params(obj: IslObj, params: Sequence[str]) -> IslObj:
    for k, name in enumerate(params):
        pos = obj.find_dim_by_name(isl.dim_type.param, f"_p{k}")
        if pos >= 0:
            obj = obj.set_dim_name(isl.dim_type.param, pos, name)
    return obj


def build_set(params: Sequence[str], name: str | None, dims: Sequence[str], constraints: Sequence[str]) -> isl.Set:
    """``[params] -> { name[dims] : constraints }``; constraints use placeholders ``_a{k}`` for dims."""
    tup = "_t" if name is not None else ""
    dim_text = ", ".join(f"_a{k}" for k in range(len(dims)))
    cond = " and ".join(constraints)
    text = f"{_params_text(params)} -> {{ {tup}[{dim_text}]" + (f" : {cond} }}" if cond else " }")
    out = _rename_params(isl.Set(text), params)
    if name is not None:
        out = out.set_tuple_name(name)
    for k, d in enumerate(dims):
        out = out.set_dim_name(isl.dim_type.set, k, d)
    return out


def build_map(
    params: Sequence[str],
    in_dims: Sequence[str],
    out_exprs: Sequence[str],
    constraints: Sequence[str],
    *,
    in_name: str | None = None,
    out_name: str | None = None,
    out_dims: Sequence[str] | None = None,
) -> isl.Map:
    """``[params] -> { in_name[in_dims] -> out_name[out_exprs] : constraints }``.

    ``out_exprs`` and ``constraints`` are ISL text over the placeholders ``_a{k}``
    of the input dims and ``_p{k}`` of the params (see :func:`aff_text`).
    """
    in_tup = "_t" if in_name is not None else ""
    out_tup = "_u" if out_name is not None else ""
    in_text = ", ".join(f"_a{k}" for k in range(len(in_dims)))
    cond = " and ".join(constraints)
    text = (f"{_params_text(params)} -> {{ {in_tup}[{in_text}] -> {out_tup}[{', '.join(out_exprs)}]"
            + (f" : {cond} }}" if cond else " }"))
    out = _rename_params(isl.Map(text), params)
    if in_name is not None:
        out = out.set_tuple_name(isl.dim_type.in_, in_name)
    if out_name is not None:
        out = out.set_tuple_name(isl.dim_type.out, out_name)
    for k, d in enumerate(in_dims):
        out = out.set_dim_name(isl.dim_type.in_, k, d)
    for k, d in enumerate(out_dims or ()):
        out = out.set_dim_name(isl.dim_type.out, k, d)
    return out


def dim_env(names: Sequence[str], params: Sequence[str]) -> dict[str, str]:
    """Placeholders for input dims ``names`` (``_a{k}``) together with the params."""
    env = param_env(params)
    env.update({n: f"_a{k}" for k, n in enumerate(names)})
    return env


__all__ = ["aff_text", "build_map", "build_set", "condition_texts", "dim_env", "param_env"]
