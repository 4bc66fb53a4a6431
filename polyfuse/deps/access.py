"""Access relations of blocks, tagged per reference.

Every load occurrence and the store of a block get their own *reference tag*, so
a dependence says not only which block instances depend on each other but
through which access: ``[s_exp[i, j] -> s_exp__r1[]] -> xmax[i]``.  Tags are
stable and readable: ``B__w`` is the store of block ``B``, ``B__r0, B__r1, …``
its loads in pre-order of the stored value, ``B__init0, …`` the loads of a
reduction's init expression.

A gather (``x[i, target[i]]``, an index that is a load of an integer input) is a *may* read: its
relation maps an instance to every element of the gathered dimension, so every dependence it could
carry is kept (the analysis stays sound without knowing ``target``).  The load of the index itself is
a reference of its own.  Stores never gather.

Reductions (a choice of this module, documented because dependences depend on
it): the init of ``X[idx]`` is *not* a separate statement.  The instance whose
reduce iterations are all 0 sets ``X[idx]`` to ``init`` and applies the update
to that value, so it reads the init's loads and does not read ``X[idx]`` from
memory; every other instance reads ``X[idx]`` (the *accumulator* read) and does
not evaluate the init.  Every load of ``X[idx]`` at exactly the store's indices
inside the update is an accumulator read; loads of ``X`` at other indices are
plain reads.  Within one instance all reads happen before the write.  A reduction
without init (after ``decompose_reduction``) reads its accumulator in every
instance, the first included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.deps.domains import first_reduce_instances, param_names
from polyfuse.deps.islconv import aff_text, build_map, dim_env
from polyfuse.deps.memo import memoized
from polyfuse.ir.expr import Expr, Load
from polyfuse.ir.gather import is_gather_index
from polyfuse.ir.stmt import Block, Program, Tensor
from polyfuse.ir.visit import loads

READ = "read"
WRITE = "write"

STORE = "store"
LOAD = "load"
ACCUMULATOR = "accumulator"
INIT = "init"


@dataclass(frozen=True)
class Access:
    """One tagged reference: block, tensor, read or write, and where it happens.

    ``relation`` maps block instances to the tensor elements they access,
    restricted to the instances where the access actually happens (an
    accumulator read is absent from the first reduce iteration, an init load
    present only there).  ``ref`` is the reference as written: its tensor
    (with the shape) and index expressions.
    """

    tag: str
    block: str
    tensor: str
    kind: str
    role: str
    text: str
    relation: isl.Map = field(compare=False)
    ref: Load = field(compare=False, repr=False)

    @property
    def is_read(self) -> bool:
        return self.kind == READ

    @property
    def tagged_domain(self) -> isl.Set:
        """``{ [B[iters] -> tag[]] }`` over the instances where the access happens."""
        tag = isl.Set("{ _t[] }").set_tuple_name(self.tag)
        return isl.Map.from_domain_and_range(self.relation.domain(), tag).wrap()

    @property
    def untag(self) -> isl.Map:
        """``{ [B[iters] -> tag[]] -> B[iters] }``: drops the reference tag."""
        return self.tagged_domain.unwrap().domain_map()

    @property
    def tagged(self) -> isl.Map:
        """``{ [B[iters] -> tag[]] -> X[indices] }``."""
        return self.untag.apply_range(self.relation)

    def __str__(self) -> str:
        return f"{self.tag}: {self.kind} {self.text} ({self.role})"


def _relation(block: Block, tensor: Tensor, indices: tuple[Expr, ...], params: tuple[str, ...],
              domain: isl.Set) -> isl.Map:
    """Instances -> elements; a gather index (``x[i, target[i]]``) may read any element of its dimension."""
    names = [iv.var.name for iv in block.iters]
    env = dim_env(names, params)
    idx, bounds = [], []
    for d, e in enumerate(indices):
        if is_gather_index(e):
            idx.append(f"_g{d}")
            extent = aff_text(tensor.shape[d], env, what=f"tensor {tensor.name!r}, shape dimension {d}")
            bounds.append(f"0 <= _g{d} < {extent}")
        else:
            idx.append(aff_text(e, env, what=f"block {block.name!r}: index {d} of tensor {tensor.name!r}"))
    rel = build_map(params, names, idx, bounds, in_name=block.name, out_name=tensor.name)
    return rel.intersect_domain(domain)


def _text(tensor: Tensor, indices: tuple[Expr, ...]) -> str:
    return f"{tensor.name}[{', '.join(str(i) for i in indices)}]"


def block_accesses(block: Block, domain: isl.Set, params: Sequence[str]) -> list[Access]:
    """The tagged accesses of one block: its loads (pre-order), init loads, then its store."""
    return list(_block_accesses(block, domain, tuple(params)))


@memoized(4096)
def _block_accesses(block: Block, domain: isl.Set, params: tuple[str, ...]) -> tuple[Access, ...]:
    """Cached per block (and domain): most blocks outlive many schedule steps unchanged."""
    st = block.store
    acc_load = Load(st.tensor, st.indices)
    first = first_reduce_instances(block, domain) if block.is_reduction and block.init is not None else None
    later = domain.subtract(first) if first is not None else domain
    out: list[Access] = []
    for k, ld in enumerate(loads(st.value)):
        is_acc = block.is_reduction and ld == acc_load
        where = later if is_acc else domain
        out.append(Access(f"{block.name}__r{k}", block.name, ld.tensor.name, READ,
                          ACCUMULATOR if is_acc else LOAD, _text(ld.tensor, ld.indices),
                          _relation(block, ld.tensor, ld.indices, params, where), ld))
    if block.init is not None and first is not None:
        for k, ld in enumerate(loads(block.init)):
            out.append(Access(f"{block.name}__init{k}", block.name, ld.tensor.name, READ, INIT,
                              _text(ld.tensor, ld.indices),
                              _relation(block, ld.tensor, ld.indices, params, first), ld))
    out.append(Access(f"{block.name}__w", block.name, st.tensor.name, WRITE, STORE,
                      _text(st.tensor, st.indices), _relation(block, st.tensor, st.indices, params, domain),
                      acc_load))
    return tuple(out)


def accesses(program: Program, domains: Mapping[str, isl.Set]) -> tuple[Access, ...]:
    """Every tagged access of the program, block by block in program order."""
    params = param_names(program)
    out: list[Access] = []
    for b in program.blocks():
        out.extend(_block_accesses(b, domains[b.name], params))
    return tuple(out)


def tagged_union(items: list[Access]) -> isl.UnionMap:
    """The union of the tagged relations of ``items`` (empty union if none)."""
    out = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    for a in items:
        out = out.union(isl.UnionMap.from_map(a.tagged))
    return out


__all__ = ["ACCUMULATOR", "INIT", "LOAD", "READ", "STORE", "WRITE", "Access", "accesses", "block_accesses",
           "tagged_union"]
