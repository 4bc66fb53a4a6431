"""The host C++ backend: tiles as local arrays, tile ops as plain loops, OpenMP across tiles.

The kernel is one ``extern "C"`` function (the C ABI the runtime loads through ctypes)::

    int <entry>(void* const* buffers, const int64_t* sizes);

``buffers`` holds the data pointers of the array arguments in signature order (inputs, then
outputs; C-contiguous, of the declared dtypes), ``sizes`` the values of the size parameters.
Temporaries live in the function (allocated once, or per iteration of their allocation loop);
the outermost loop chains whose iterations touch disjoint memory run under
``#pragma omp parallel for collapse(n)`` (see :mod:`polyfuse.tiling.parallel`).

The code is written so that g++ vectorizes the tile loops without any change of results:
selects evaluate both values (``pf::select``), ``exp`` is the branch-free ``pf::exp``, a reduction
runs its reduced axis outermost over a hoisted item tile, and a ``dot`` packs its operands and calls
``pf::gemm`` (register-blocked).  Every sum still runs in the tile interpreter's order.
"""

from __future__ import annotations

import math

from polyfuse.emit_cpp.cfamily import _REDUCE_INIT as REDUCE_INIT
from polyfuse.emit_cpp.cfamily import _REDUCER_OP as REDUCER_OP
from polyfuse.emit_cpp.cfamily import CFamilyEmitter, axis_var, flat, worth_hoisting
from polyfuse.emit_cpp.cfamily import _Materialized as Materialized
from polyfuse.tiling.parallel import allocated_at, parallel_depth, perfect_chain
from polyfuse.emit_cpp.target import GATHER_FAULT, KernelSource, Target, arg_of, entry_name
from polyfuse.ir.expr import Const, Expr, Select
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.tiling.htile import (
    Dot, Reduce, TileLoad, TileProgram, axes_of, has_gathers, slice_axes, walk_tile_expr,
)
from polyfuse.tiling.skip import skip_masked_tiles


class HostCppEmitter(CFamilyEmitter):
    """C++17 for g++/clang++ with OpenMP; includes ``polyfuse_host.h``."""

    header = "polyfuse_host.h"
    math_functions = {**CFamilyEmitter.math_functions, "exp": "pf::exp"}
    """``pf::exp`` (polyfuse_host.h) vectorizes and is within 1 ulp for float; std::exp for double."""

    def __init__(self, program: TileProgram):
        super().__init__(program)
        self.tensors = {t.name: t for t in program.tensors}
        self.allocated = {name for s in _loops(program.body) for name in allocated_at(s)}

    def parallel_pragma(self, collapse: int) -> str | None:
        clause = f" collapse({collapse})" if collapse > 1 else ""
        return f"#pragma omp parallel for{clause} schedule(static)"

    def local_array(self, ctype: str, name: str, size: int, *, zero: bool) -> list[str]:
        """As in the core, marked ``[[maybe_unused]]``: a temporary the program writes and never reads is
        legal, and g++'s -Wunused-but-set-variable must not fail a -Werror build over it."""
        lines = super().local_array(ctype, name, size, zero=zero)
        return [f"[[maybe_unused]] {lines[0]}", *lines[1:]] if size <= self.large_array else lines

    def heap_array(self, ctype: str, name: str, size: str) -> list[str]:
        """A zeroed array on the heap, freed at the end of its scope (``unique_ptr``, not ``std::vector``: a vector
        of ``bool`` packs bits and has no ``data()``)."""
        return [f"const auto {name}_heap = std::make_unique<{ctype}[]>({size});",
                f"{ctype}* {self.restrict} {name} = {name}_heap.get();"]

    def allocate(self, s: Loop) -> None:
        for name in allocated_at(s):
            t = self.tensors[name]
            size = self.static_size(t.shape)
            if size is None:
                for text in self.heap_array(self.stype(t.dtype), name, self.numel(t.shape)):
                    self.line(text)
            else:
                for text in self.local_array(self.stype(t.dtype), name, size, zero=True):
                    self.line(text)

    def scalar(self, e: Expr, env: dict[str, str]) -> str:
        """As in the core, except that ``Select`` evaluates both values, as the tile interpreter does.

        A C ``?:`` evaluates one branch only, and a compiler may not hoist a load or a float operation
        out of a branch, so a loop with one does not vectorize; ``pf::select`` takes both as arguments.
        """
        # (``materialized`` exists only while a store is emitted; loop extents are emitted outside one.)
        if isinstance(e, Select) and e not in getattr(self, "materialized", {}):
            return (f"{self.helpers}select({self.scalar(e.cond, env)}, {self.scalar(e.true_value, env)}, "
                    f"{self.scalar(e.false_value, env)})")
        return super().scalar(e, env)

    def materialize(self, e: Expr) -> None:
        """As in the core, except for reductions (:meth:`reduce`)."""
        if isinstance(e, Reduce):
            self.reduce(e)
        else:
            super().materialize(e)

    def reduce(self, e: Reduce) -> None:
        """A reduction whose loops vectorize: the item tile first, then the reduced axis outermost.

        A non-trivial item (``exp(score - max)``, say) is computed into a local array by an
        elementwise loop, which vectorizes; the combining loop then runs the reduced axis outside
        the kept axes, every kept element with its own accumulator in a local array.  Each still
        combines its items in order along the reduced axis, as the tile interpreter does.
        """
        if worth_hoisting(e.tile) and e.tile not in self.materialized:
            self.materialize(e.tile)
        axes = axes_of(e)
        size = self.sizes
        ct = self.ctype(e.dtype)
        name = self.fresh()
        for text in self.local_array(ct, name, math.prod(size[a] for a in axes), zero=False):
            self.line(text)
        env = {a: axis_var(a) for a in axes}
        at = flat(axes, size, env)
        count = self.for_axes(axes, size)
        self.line(f"{name}[{at}] = {REDUCE_INIT[e.op]};")
        self.close_n(count)
        reduced = axis_var(e.axis)
        self.open(self.axis_loop(e.axis, size[e.axis]))
        count = self.for_axes(axes, size)
        item = self.scalar(e.tile, {**env, e.axis: reduced})
        op = REDUCER_OP[e.op]
        acc = f"{name}[{at}]"
        combined = f"{self.helpers}{op}<{ct}>({acc}, {item})" if op in ("max", "min") else (
            f"({acc} || {item})" if op == "or" else f"({acc} {op} {item})")
        self.line(f"{acc} = {combined};")
        self.close_n(count + 1)
        if self.rounded(acc, e.dtype) != acc:
            count = self.for_axes(axes, size)
            self.line(f"{acc} = {self.rounded(acc, e.dtype)};")
            self.close_n(count)
        self.materialized[e] = Materialized(name, axes)

    def dot(self, e: Dot, name: str, axes: tuple[str, ...]) -> None:
        """``name = acc + Σ_k a·b``: operands packed row-major, then ``pf::gemm`` per batch element.

        The operands are packed as ``A[batch][m][k]`` and ``B[batch][k][n]`` (batch: the axes both
        have, m: only ``a``'s, n: only ``b``'s), each read in its memory order; ``pf::gemm``
        (polyfuse_host.h) keeps blocks of products in vector registers.  Every product is still
        summed in k order from zero, as the tile interpreter sums it.
        """
        a_axes = tuple(x for x in axes_of(e.a) if x != e.axis)
        b_axes = tuple(x for x in axes_of(e.b) if x != e.axis)
        batch = tuple(x for x in a_axes if x in b_axes)
        m_axes = tuple(x for x in a_axes if x not in batch)
        n_axes = tuple(x for x in b_axes if x not in batch)
        size = self.sizes
        nb, m, n, k = (math.prod(size[x] for x in xs) for xs in (batch, m_axes, n_axes, (e.axis,)))
        ct = self.ctype(e.dtype)
        packed = []
        for x, outer, inner in ((e.a, (*batch, *m_axes), (e.axis,)), (e.b, batch, (e.axis, *n_axes))):
            arr = self.fresh("op")
            packed.append(arr)
            order = (*outer, *inner)
            for text in self.local_array(ct, arr, math.prod(size[a] for a in order), zero=False):
                self.line(text)
            env = {a: axis_var(a) for a in order}
            count = self.for_axes(_memory_order(x, order), size)
            self.line(f"{arr}[{flat(order, size, env)}] = {self.convert(self.scalar(x, env), x.dtype, e.dtype)};")
            self.close_n(count)
        a_arr, b_arr = packed
        prod = self.fresh("prod")
        for text in self.local_array(ct, prod, nb * m * n, zero=False):
            self.line(text)
        gemm = f"{self.helpers}gemm<{ct}, {m}, {n}, {k}>"
        if nb == 1:
            self.line(f"{gemm}({a_arr}, {b_arr}, {prod});")
        else:
            v = self.fresh("b")
            self.open(f"for ({self.widths.tile} {v} = 0; {v} < {nb}; ++{v})")
            self.line(f"{gemm}({a_arr} + {v} * {m * k}, {b_arr} + {v} * {k * n}, {prod} + {v} * {m * n});")
            self.close()
        env = {a: axis_var(a) for a in axes}
        count = self.for_axes(axes, size)
        at = f"({flat(batch, size, env)} * {m} + {flat(m_axes, size, env)}) * {n} + {flat(n_axes, size, env)}"
        total = self.rounded(f"({self.scalar(e.acc, env)} + {prod}[{at}])", e.dtype)
        self.line(f"{name}[{flat(axes, size, env)}] = {total};")
        self.close_n(count)

    def static_size(self, shape) -> int | None:
        if all(isinstance(d, Const) for d in shape):
            return math.prod(int(d.value) for d in shape)
        return None

    def numel(self, shape) -> str:
        return " * ".join(f"static_cast<int64_t>({self.scalar(d, {})})" for d in shape) or "1"

    def top(self, s: Stmt) -> None:
        """A top-level statement: a loop chain that may run in parallel, or anything else."""
        if isinstance(s, Seq):
            for c in s.stmts:
                self.top(c)
            return
        if not isinstance(s, Loop):
            self.stmt(s)
            return
        depth = parallel_depth(s)
        if depth == 0:
            self.stmt(s)
            return
        chain = perfect_chain(s)[:depth]
        self.line(self.parallel_pragma(depth))
        for lp in chain:
            self.line(self.loop_header(lp) + " {")
        self.depth += 1
        for lp in chain:
            self.allocate(lp)
        self.stmt(chain[-1].body)
        self.depth -= 1
        self.line("}" * len(chain))

    def kernel(self, entry: str) -> KernelSource:
        p = self.program
        args = [t for t in p.tensors if t.role == INPUT] + [t for t in p.tensors if t.role == OUTPUT]
        self.line(f'#include "{self.header}"')
        self.line("#include <cstdint>")
        self.line("#include <memory>")
        self.line("")
        self.line(f"// {p.name}: generated by polyfuse for the host (C ABI: buffers in signature order, sizes)")
        self.open(f'extern "C" int {entry}(void* const* buffers, const int64_t* sizes)')
        self.line("(void)buffers;")
        self.line("(void)sizes;")
        # an input or size the program declares but never reads is still an argument
        for k, param in enumerate(p.params):
            self.line(f"[[maybe_unused]] const int64_t {param.name} = sizes[{k}];")
        for k, t in enumerate(args):
            const = "const " if t.role == INPUT else ""
            st = self.stype(t.dtype)
            self.line(f"[[maybe_unused]] {const}{st}* {self.restrict} {t.name} = "
                      f"static_cast<{const}{st}*>(buffers[{k}]);")
        if has_gathers(p):  # the runtime passes the fault record after the arguments
            self.line(f"int64_t* {GATHER_FAULT} = static_cast<int64_t*>(buffers[{len(args)}]);")
        for t in p.tensors:
            if t.role not in (INPUT, OUTPUT) and t.name not in self.allocated:
                for line in self.heap_array(self.stype(t.dtype), t.name, self.numel(t.shape)):
                    self.line(line)
        self.top(p.body)
        self.line("return 0;")
        self.close()
        signature = tuple(arg_of(t) for t in args)
        return KernelSource("\n".join(self.lines) + "\n", entry, signature,
                            tuple(v.name for v in p.params), Target("cpp"), gathers=tuple(self.gather_sites))


def _memory_order(e: Expr, axes: tuple[str, ...]) -> tuple[str, ...]:
    """``axes`` reordered so that the loops over them read ``e``'s first tile load in memory order."""
    for n in walk_tile_expr(e):
        if isinstance(n, TileLoad):
            loaded = tuple(a for a in slice_axes(n.index) if a in axes)
            return tuple(a for a in axes if a not in loaded) + loaded
    return axes


def _loops(s: Stmt):
    if isinstance(s, Loop):
        yield s
        yield from _loops(s.body)
    elif isinstance(s, Seq):
        for c in s.stmts:
            yield from _loops(c)


def emit_host(program: TileProgram) -> KernelSource:
    return HostCppEmitter(skip_masked_tiles(program)).kernel(entry_name(program.name))
