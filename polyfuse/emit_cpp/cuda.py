"""The CUDA backend: one ``__global__`` kernel per grid nest, thread blocks cooperating on tiles.

:mod:`polyfuse.emit_cpp.grid` splits the tile program into kernels.  In a **CTA kernel** each
thread block runs one iteration of the collapsed grid loops; its temporaries live in shared
memory (one dynamic buffer, static offsets) and every tile statement is shared by the block's
threads:

* elementwise work runs one element per thread per step, the store's last axis fastest so that
  neighbouring threads touch neighbouring addresses (coalesced);
* ``Reduce`` runs in-thread over a strided slice, then with warp shuffles (``shfl_xor``) across
  the lanes that share an output, then through shared memory across warps when one output needs
  more than a warp;
* ``Dot`` with f16 or bf16 operands runs on tensor cores (:mod:`polyfuse.emit_cpp.mma`);
  other dots stage their operands in shared memory and multiply in f32/f64;
* nodes that need loops of their own are materialized in shared memory in post-order, with a
  barrier after each step and after each statement.

A **map kernel** (a tile statement outside any loop) gives each thread one stored element and
computes what that element needs — reductions and dots included — in registers.

Precision: as the host backend, f16/bf16/fp8 values are computed in float and rounded after
every operation.  Tensor cores multiply 16-bit operands exactly and accumulate in f32; an f32
operand of such a dot (attention's P) is split into two 16-bit parts (:mod:`~polyfuse.emit_cpp.mma`),
so that it keeps the accuracy of the f32 program.
"""

from __future__ import annotations

import math

from polyfuse.emit_cpp.cfamily import (
    _REDUCE_INIT, _REDUCER_OP, CFamilyEmitter, _Materialized, axis_sizes, axis_var, static_numel,
)
from polyfuse.emit_cpp.grid import CTA, MAP, GridNest, partition
from polyfuse.emit_cpp.parallel import unit_loop
from polyfuse.emit_cpp import presplit, registers, resident, rows, stream
from polyfuse.emit_cpp.stream import StreamLoop, after_statement, close_streams, open_streams
from polyfuse.emit_cpp.target import KernelSource, Launch, Target, arg_of, entry_name
from polyfuse.errors import UnsupportedPattern
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Call, Const, Expr, Var
from polyfuse.ir.stmt import INPUT, OUTPUT, Loop, Seq, Stmt
from polyfuse.emit_cpp.vector import VECTOR_BYTES, aligned, chunks, per_element_loads
from polyfuse.tiling.inline import inline_products
from polyfuse.tiling.simplify import simplify_tiles
from polyfuse.tiling.skip import skip_masked_tiles
from polyfuse.tiling.htile import Dot, Reduce, Slice, TileLoad, TileProgram, TileStore, axes_of, depends_on

DEFAULT_WARPS = 8
MAP_THREADS = 256
UNROLL_REDUCE = 16
"""A reduction whose outputs get one thread each, over at most this many steps, is unrolled (its loads
issued together).  Measured on the H200: MLA decode, whose combine reads 32 split partials per output
from 8 blocks, 0.428 → 0.385 ms; unrolling the block-wide reductions of the row kernels as well made
layernorm_stats slower (0.088 → 0.099 ms), so those are left alone."""
MIN_BLOCKS: int | None = 3
"""A block kernel whose shared memory lets at most this many blocks reside on an SM (and more than one) asks
the compiler (``__launch_bounds__``) for registers that let all of them reside; None asks nothing.  Why: with
register accumulators attn_softcap prefill went from 64 to 93 registers per thread (ptxas -v), so from 4 to 2
resident blocks, and from 3.29 to 3.76 ms on the H200.  Measured on the H200 (ms, none / asking for 3 whatever
the shared memory allows): softcap prefill 3.74 / 2.97, GQA 4.89 / 4.85, causal 2.55 / 2.54; but global
prefill (42 KB, room for 5 blocks) 1.42 / 1.69 and norm_inside 1.99 / 2.13, where asking for 3 let the
compiler use more registers than the kernel had, hence the rule on shared memory."""
ELEMENT_UNROLL = 4
"""Unroll factor of the loops over the elements a thread handles (tile copies, element-wise statements).
Measured on the H200 (attn_global decode B=32, register-staged copies, ms): 2 1.39, 4 1.27, 8 1.68."""
SM_SHARED = 228 * 1024
"""Shared memory of one SM (H100/H200); each resident block also reserves 1 KB."""
SHARED_LIMIT = 227 * 1024
"""Dynamic shared memory one block may opt into on sm_90 (H100/H200)."""
FAST_EXP = True
"""f32 ``exp`` as ``__expf`` (``ex2.approx`` of ``x·log2 e``) in CUDA programs whose outputs are all 16-bit
floats.  Its error, at most ``2 + 1.173·|x|`` ulp (CUDA Math API), stays below an f16 output's rounding:
for attention that is the ``2·Skv·2^-24`` term of :func:`polyfuse.ops.attention.tolerance`.  Outputs in f32
keep ``exp`` (2 ulp), which their tolerances assume; so does HIP, whose ``__expf`` has no such bound.
Measured on the H200 (ms, exp / __expf, one run): MLA decode B=32 0.380 / 0.372, B=1 0.111 / 0.108,
causal prefill 1.71 / 1.61; global and norm_inside decode B=32 unchanged (1.04 / 1.04, 1.03 / 1.03)."""
_CHEAP_CALLS = ("neg", "not", "abs")
_SIZEOF = {"float": 4, "double": 8, "int32_t": 4, "int64_t": 8, "bool": 1, "int": 4, "uint16_t": 2, "uint8_t": 1}


class CudaEmitter(CFamilyEmitter):
    """CUDA C++ for nvcc; subclassed by the HIP emitter."""

    header = "polyfuse_gpu.h"
    math_functions = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "floor": "floor",
                      "ceil": "ceil", "exp2": "exp2", "log2": "log2", "abs": "fabs", "pow": "pow"}
    tensor_cores = True
    fast_exp_function: str | None = "__expf"
    """The approximate f32 exp of ``FAST_EXP``; None: always the accurate one."""
    stream_stages: int | None = None
    """Buffers per streamed tile of a rolling loop (:mod:`~polyfuse.emit_cpp.stream`; None: ``STREAM_STAGES``);
    0 streams none: every dot stages its operands with 128-bit loads and stores."""

    def __init__(self, program: TileProgram, target: Target):
        partitioned, self.nests = partition(inline_products(skip_masked_tiles(simplify_tiles(program))))
        super().__init__(partitioned)
        self.target = target
        self.warp = target.warp_size
        self.tensors = {t.name: t for t in partitioned.tensors}
        self.shared_names = {n for nest in self.nests for n in nest.shared}
        self.inline = False
        self.lane: int | None = None
        self.lane_arrays: dict[TileLoad, str] = {}
        self.memo: list[dict] = [{}]
        self.threads = DEFAULT_WARPS * self.warp
        self.scratch = 0
        self.peak = 0
        self.pitches: dict[str, int] = {}
        """Row pitch (elements) of the shared temporaries whose rows are padded."""
        self.overrides: dict[Expr, str] = {}
        """Nodes whose value is a C expression already at hand (a dot's result in its epilogue)."""
        self.streaming: StreamLoop | None = None
        """The loop whose operand tiles stream through cp.async (:mod:`~polyfuse.emit_cpp.stream`)."""
        self.block = ""
        """The block of the statement being emitted."""
        self.stages: int | None = 0
        """Stream buffers per varying operand of the kernel being emitted (None: no streams; see ``nest_kernel``)."""
        self.unit_vars: dict[str, Var] = {}
        """Grid loops of one iteration of the kernel being emitted, by name (their variables are 0)."""
        self.accumulators: dict[str, registers.Accumulator] = {}
        """Statements of the loop being emitted whose accumulators live in registers, by block."""
        self.resident: dict[str, resident.Resident] = {}
        """Global temporaries kept in shared memory across the loops being emitted, by tensor."""
        self.per_row: tuple[Expr, set, tuple[str, ...]] | None = None
        """While a dot's epilogue is planned: the dot, the accumulator's loads and the dot's column axes."""
        self.presplit: dict[str, tuple] = {}
        """f32 input tensors split into bf16 hi + lo scratch arrays before the kernels
        (:mod:`~polyfuse.emit_cpp.presplit`)."""
        self.fast_exp = FAST_EXP and self.fast_exp_function is not None and bool(program.outputs) and all(
            t.dtype.is_float and t.dtype.bits == 16 for t in program.outputs)
        """f32 ``exp`` is ``fast_exp_function`` (see ``FAST_EXP``)."""

    # ------------------------------------------------------------ table of differences
    def kernel_qualifiers(self, threads: int) -> str:
        return f'extern "C" __global__ void __launch_bounds__({threads})'

    def call(self, fn: str, x: str, d: DType) -> str:
        if fn == "abs" and not d.is_float:
            return f"pf::iabs({x})"
        if fn == "exp" and self.fast_exp and d == dt.f32:
            return f"{self.fast_exp_function}({x})"
        return super().call(fn, x, d)

    # ------------------------------------------------------------ scopes (memo of inline values)
    def open(self, header: str) -> None:
        super().open(header)
        self.memo.append({})

    def close(self) -> None:
        super().close()
        self.memo.pop()

    def worth_hoisting(self, e: Expr) -> bool:
        """Only costly operands: hoisting costs a pass through shared memory and a barrier.

        A math function or a division is computed once per element of its own axes; index
        arithmetic, comparisons and selects are cheaper to recompute than to share, and so is integer
        arithmetic of loop variables alone (a loop bound ``i_0 // 2 + 1``), the same for every element.
        """
        from polyfuse.tiling.htile import axes_of, walk_tile_expr

        if self.per_row is not None and _per_row(e, *self.per_row):
            return False  # a dot's epilogue computes it once per fragment row (_row_values)
        return super().worth_hoisting(e) and any(
            (isinstance(n, Call) and n.fn not in _CHEAP_CALLS)
            or (isinstance(n, BinOp) and n.op in ("/", "//", "%", "pow") and (n.dtype.is_float or axes_of(n)))
            for n in walk_tile_expr(e))

    def element_loop(self, header: str) -> None:
        """A loop over the elements a thread handles; unrolled (``ELEMENT_UNROLL``) so their loads are in flight
        together."""
        self.line(f"#pragma unroll {ELEMENT_UNROLL}")
        self.open(header)

    def barrier(self) -> None:
        self.line("__syncthreads();")

    def warp_barrier(self) -> None:
        self.line("pf::syncwarp();")

    def stmt(self, s: Stmt) -> None:
        """A sequence's runs of row statements are emitted as row groups (:mod:`~polyfuse.emit_cpp.rows`)."""
        if not isinstance(s, Seq):
            super().stmt(s)
            return
        for part in rows.split(self, rows.reorder(self, list(s.stmts))):
            if isinstance(part, list):
                rows.emit(self, part)
            else:
                self.stmt(part)

    def loop(self, s: Loop) -> None:
        """A loop of a block: its rolling accumulators stay in registers (:mod:`~polyfuse.emit_cpp.registers`)
        and the tiles its dots read from inputs may stream in ahead of use (:mod:`~polyfuse.emit_cpp.stream`)."""
        accumulators = registers.plan(self, s) if self.tensor_cores else {}
        for acc in accumulators.values():
            registers.load(self, acc)
        outer, self.accumulators = self.accumulators, accumulators
        kept_at = self.scratch
        kept = resident.plan(self, s, {acc.store.tensor.name for acc in accumulators.values()})
        resident.load(self, kept)
        outer_kept, added = dict(self.resident), {r.tensor for r in kept} - self.shared_names
        self.resident.update((r.tensor, r) for r in kept)
        self.shared_names |= added  # no vector paths of global memory for them
        state = open_streams(self, s, self.stages) if self.tensor_cores and self.streaming is None else None
        mark = self.scratch
        self.streaming = state
        super().loop(s)
        self.streaming = None
        if state is not None:
            close_streams(self, state)
        self.scratch = mark
        self.resident = outer_kept
        self.shared_names -= added
        resident.store(self, kept)
        self.scratch = kept_at
        self.accumulators = outer
        used = [acc for acc in accumulators.values() if acc.used]
        for acc in used:
            registers.store(self, acc)
        if used:
            self.barrier()

    def access(self, tensor, index, env: dict[str, str]) -> str:
        """An access; to the shared copy where the loop being emitted keeps the tensor
        (:mod:`~polyfuse.emit_cpp.resident`)."""
        kept = self.resident.get(tensor.name)
        if kept is not None:
            return f"{kept.name}[{kept.at(env, index)}]"
        return super().access(tensor, index, env)

    def offset(self, tensor, idx: list[str]) -> str:
        """Row-major offset; 32-bit arithmetic for a block's shared temporaries (they are small)."""
        if tensor.name not in self.shared_names or not idx:
            return super().offset(tensor, idx)
        text = f"({idx[0]})"
        padded, pitch = self.pitches.get(tensor.name, (None, None))
        for d, (dim, i) in enumerate(zip(tensor.shape[1:], idx[1:], strict=True), start=1):
            text = f"({text} * {pitch if d == padded else self.scalar(dim, {})} + {i})"
        return text

    # ------------------------------------------------------------ shared-memory scratch
    def take(self, nbytes: int) -> int:
        """Byte offset of ``nbytes`` of per-statement scratch (16-byte aligned)."""
        offset = self.scratch
        self.scratch = offset + _align(nbytes)
        self.peak = max(self.peak, self.scratch)
        return offset

    def shared_array(self, ctype: str, name: str, nbytes: int) -> None:
        self.line(f"{ctype}* {name} = reinterpret_cast<{ctype}*>(pf_smem + {self.take(nbytes)});")

    def decode(self, axes: tuple[str, ...], flat: str) -> dict[str, str]:
        """Declare the axis variables of the row-major element ``flat`` over ``axes``."""
        stride = 1
        for a in reversed(axes):
            size = self.sizes[a]
            if a == axes[0]:
                text = f"({flat}) / {stride}" if stride > 1 else f"({flat})"
            else:
                text = f"(({flat}) / {stride}) % {size}" if stride > 1 else f"({flat}) % {size}"
            t = self.widths.tile
            self.line(f"[[maybe_unused]] const {t} {axis_var(a)} = static_cast<{t}>({text});")
            stride *= size
        return {a: axis_var(a) for a in axes}

    # ------------------------------------------------------------ vector lanes
    def lane_plan(self, exprs: list[Expr], axis: str) -> tuple[int, list[TileLoad]]:
        """Lanes per thread along ``axis`` and the loads read as vectors (see :mod:`~polyfuse.emit_cpp.vector`)."""
        loads: list[TileLoad] = []
        for e in exprs:
            for x in per_element_loads(e, self.materialized):
                if x not in loads and x.tensor.name not in self.shared_names and not x.tensor.dtype.is_bool:
                    loads.append(x)
        extent = self.sizes[axis]
        for vec in (8, 4, 2):
            if extent % vec:
                continue
            chosen = [x for x in loads if _SIZEOF[self.stype(x.tensor.dtype)] * vec <= VECTOR_BYTES
                      and aligned(x.index, x.tensor.shape, axis, vec)
                      and (x.mask is None or not depends_on(x.mask, axis))]
            if chosen:
                return vec, chosen
        return 1, []

    def vector_store(self, s: TileStore, axis: str, vec: int) -> bool:
        t = s.tensor
        return (vec > 1 and s.reducer is None and t.name not in self.shared_names and not t.dtype.is_bool
                and aligned(s.index, t.shape, axis, vec) and (s.mask is None or not depends_on(s.mask, axis)))

    def load_lanes(self, loads: list[TileLoad], env: dict[str, str], vec: int) -> None:
        """Read each load's ``vec`` lanes at ``env`` (lane 0) into a register array."""
        self.lane_arrays = {}
        for x in loads:
            st = self.stype(x.tensor.dtype)
            arr = self.fresh("v")
            ctype, n = chunks(_SIZEOF[st], vec)
            self.line(f"alignas(16) {st} {arr}[{vec}];")
            src = self.access(x.tensor, x.index, env)
            copy = " ".join(f"reinterpret_cast<{ctype}*>({arr})[{c}] = reinterpret_cast<const {ctype}*>(&{src})[{c}];"
                            for c in range(n))
            if x.mask is None:
                self.line(copy)
            else:
                other = self.to_storage(self.literal(x.other.value if x.other is not None else 0, x.tensor.dtype),
                                        x.tensor.dtype)
                self.line(f"if ({self.scalar(x.mask, env)}) {{ {copy} }} else {{ "
                          f"for (int pf_l = 0; pf_l < {vec}; ++pf_l) {arr}[pf_l] = {other}; }}")
            self.lane_arrays[x] = arr

    def lanes(self, env: dict[str, str], axis: str, vec: int):
        """``(lane, env of that lane)`` for each of ``vec`` consecutive elements from ``env``."""
        for v in range(vec):
            self.lane = v
            yield v, {**env, axis: f"({env[axis]} + {v})"}
        self.lane = None

    def store_elements(self, s: TileStore, axes: tuple[str, ...], flat: str, step: str, total: int) -> None:
        """The loop storing ``total`` elements of ``s``: ``flat`` is the first, ``step`` the stride."""
        inner = axes[-1]
        exprs = [s.value] + ([s.mask] if s.mask is not None else [])
        vec, loads = self.lane_plan(exprs, inner)
        itemsize = _SIZEOF.get(self.stype(s.tensor.dtype), 1)
        if vec == 1:
            vec = next((v for v in (8, 4, 2) if self.sizes[inner] % v == 0 and itemsize * v <= VECTOR_BYTES
                        and self.vector_store(s, inner, v)), 1)
        as_vector = self.vector_store(s, inner, vec) and itemsize * vec <= 2 * VECTOR_BYTES
        if vec == 1 or (not loads and not as_vector):
            self.element_loop(f"for ({flat}; pf_e < {total}; pf_e += {step})")
            self.assign(s, self.decode(axes, "pf_e"))
            self.close()
            return
        self.element_loop(f"for ({flat.replace('pf_e', 'pf_g')}; pf_g < {total // vec}; pf_g += {step})")
        self.line(f"const {flat.split()[0]} pf_e = pf_g * {vec};")
        env = self.decode(axes, "pf_e")
        self.load_lanes(loads, env, vec)
        if not as_vector:
            for _, lane_env in self.lanes(env, inner, vec):
                self.assign(s, lane_env)
        else:
            st = self.stype(s.tensor.dtype)
            out = self.fresh("w")
            self.line(f"alignas(16) {st} {out}[{vec}];")
            for v, lane_env in self.lanes(env, inner, vec):
                value = self.convert(self.scalar(s.value, lane_env), s.value.dtype, s.tensor.dtype)
                self.line(f"{out}[{v}] = {self.to_storage(value, s.tensor.dtype)};")
            ctype, n = chunks(_SIZEOF[st], vec)
            dst = self.access(s.tensor, s.index, env)
            copy = " ".join(f"reinterpret_cast<{ctype}*>(&{dst})[{c}] = reinterpret_cast<const {ctype}*>({out})[{c}];"
                            for c in range(n))
            self.line(f"if ({self.scalar(s.mask, env)}) {{ {copy} }}" if s.mask is not None else copy)
        self.lane_arrays = {}
        self.close()

    # ------------------------------------------------------------ expressions (map kernels compute inline)
    def scalar(self, e: Expr, env: dict[str, str]) -> str:
        if e in self.overrides:
            return self.overrides[e]
        if self.lane is not None and isinstance(e, TileLoad) and e in self.lane_arrays:
            return self.from_storage(f"{self.lane_arrays[e]}[{self.lane}]", e.tensor.dtype)
        if self.inline and isinstance(e, (Reduce, Dot)):
            key = (e, tuple(sorted(env.items())))
            for memo in reversed(self.memo):
                if key in memo:
                    return memo[key]
            text = self.inline_reduce(e, env) if isinstance(e, Reduce) else self.inline_dot(e, env)
            self.memo[-1][key] = text
            return text
        return super().scalar(e, env)

    def combine(self, op: str, acc: str, item: str, ct: str) -> str:
        kind = _REDUCER_OP[op]
        if kind in ("max", "min"):
            return f"pf::{kind}<{ct}>({acc}, {item})"
        if kind == "or":
            return f"({acc} || {item})"
        return f"({acc} {kind} {item})"

    def reduce_type(self, e: Reduce) -> str:
        return "int" if e.op == "or" else self.ctype(e.dtype)

    def reduce_result(self, e: Reduce, acc: str) -> str:
        return f"({acc} != 0)" if e.op == "or" else self.rounded(acc, e.dtype)

    def inline_reduce(self, e: Reduce, env: dict[str, str]) -> str:
        acc, ct = self.fresh("acc"), self.reduce_type(e)
        self.line(f"{ct} {acc} = {_REDUCE_INIT[e.op]};")
        r = axis_var(e.axis)
        self.open(self.axis_loop(e.axis, self.sizes[e.axis]))
        item = self.scalar(e.tile, {**env, e.axis: r})
        self.line(f"{acc} = {self.combine(e.op, acc, item, ct)};")
        self.close()
        return self.reduce_result(e, acc)

    def inline_dot(self, e: Dot, env: dict[str, str]) -> str:
        from polyfuse.emit_cpp.mma import serial_dot

        return serial_dot(self, e, env, self.fresh("dot"))

    # ------------------------------------------------------------ CTA statements
    def store(self, s: TileStore) -> None:
        self.sizes = axis_sizes(s)
        self.materialized = {}
        mark = self.scratch
        self.block = s.block
        self.line(f"// {s.block}")
        self.open("")
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        if self.dot_in_place(s, axes):
            self.close()
            self.barrier()
            after_statement(self)
            self.scratch = mark
            return
        for e in [s.value] + ([s.mask] if s.mask is not None else []):
            self.materialize_within(e)
        if self.reads_other_elements(s):
            self.materialize(s.value)
        if axes:
            total = math.prod(self.sizes[a] for a in axes)
            self.store_elements(s, axes, f"{self.widths.tile} pf_e = pf_tid", str(self.threads), total)
        else:
            self.open("if (pf_tid == 0)")
            self.assign(s, {})
            self.close()
        self.close()
        self.barrier()
        after_statement(self)
        self.scratch = mark
        self.materialized = {}

    def dot_in_place(self, s: TileStore, axes: tuple[str, ...]) -> bool:
        """A statement computed in the epilogue of its tensor-core dot, written in place.

        Applies when the value holds one dot over exactly the statement's axes, under elementwise
        operations only (a select against masked rows, a scale): each thread evaluates the value
        for the result elements it holds in registers and stores it, so neither the dot's result
        array nor a second pass over it exists.  The store's own reads happen in the thread that
        writes the element, after the operands are staged, so this is safe unless the value reads
        the temporary at other elements.
        """
        from polyfuse.emit_cpp.mma import emit_dot_into, mma_type, staging
        from polyfuse.tiling.htile import walk_tile_expr

        dots = [n for n in walk_tile_expr(s.value) if isinstance(n, Dot)]
        acc = self.accumulators.get(s.block)
        in_registers = acc is not None and acc.store == s
        shared = s.tensor.name in self.shared_names
        if (len(dots) != 1 or s.mask is not None or s.reducer is not None
                or not (shared or in_registers) or set(axes) != set(axes_of(dots[0]))
                or mma_type(self, dots[0]) is None or not _elementwise_path(s.value, dots[0])):
            return False
        e = dots[0]
        own = {n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == s.tensor.name}
        n_axes = staging(self, e)[1].rows_axes
        self.materialized[e] = _Materialized("", ())  # a placeholder: the dot is not materialized
        self.per_row = (e, own, n_axes)
        try:
            if self.reads_other_elements(s) or any(
                    isinstance(n, TileLoad) and n.tensor.name == s.tensor.name and n.index != s.index
                    for n in walk_tile_expr(e.acc)):
                return False
            self.materialize_within(s.value)
        finally:
            del self.materialized[e]
            self.per_row = None
        if in_registers and any(n in own for m in self.materialized for n in walk_tile_expr(m)):
            in_registers = False  # a hoisted operand reads the accumulator: it must stay in memory
            if not shared:
                return False
        target = f"{acc.name}[pf_nb][pf_q]" if in_registers else None

        def write(env: dict[str, str], value: str) -> None:
            self.line(f"const {self.ctype(e.dtype)} pf_d = {value};")
            self.overrides[e] = "pf_d"
            if target is not None:
                self.overrides.update({n: target for n in own})
            result = self.convert(self.scalar(s.value, env), s.value.dtype, s.tensor.dtype)
            for n in [e, *own] if target is not None else [e]:
                del self.overrides[n]
            if target is not None:
                self.line(f"{target} = {result};")
            else:
                self.line(f"{self.access(s.tensor, s.index, env)} = {self.to_storage(result, s.tensor.dtype)};")

        hoisted = _row_values(s.value, e, own, n_axes)

        def rows(env: dict[str, str]) -> None:
            for x in hoisted:
                name = self.fresh("row")
                self.line(f"const {self.ctype(x.dtype)} {name} = {self.scalar(x, env)};")
                self.overrides[x] = name

        try:
            emit_dot_into(self, e, write, rows, split_k=not in_registers)
        finally:
            for x in hoisted:
                self.overrides.pop(x, None)
        if in_registers:
            acc.used = True
        return True

    def materialize(self, e: Expr) -> None:
        axes = axes_of(e)
        size = math.prod(self.sizes[a] for a in axes)
        name = self.fresh()
        ct = self.ctype(e.dtype)  # an "or" reduction is stored as bool (its accumulator is an int)
        pitch = None
        if isinstance(e, Dot):
            from polyfuse.emit_cpp.mma import dot_pitch, emit_dot

            pitch = dot_pitch(self, e, axes)
            rows = size // self.sizes[axes[-1]] if pitch else 1
            self.shared_array(ct, name, (rows * pitch if pitch else size) * _SIZEOF[ct])
            emit_dot(self, e, name, axes, pitch)
        else:
            self.shared_array(ct, name, size * _SIZEOF[ct])
        if isinstance(e, Reduce):
            self.block_reduce(e, name, axes)
        elif not isinstance(e, Dot):
            self.element_loop(f"for (int pf_e = pf_tid; pf_e < {size}; pf_e += {self.threads})")
            env = self.decode(axes, "pf_e")
            self.line(f"{name}[pf_e] = {self.scalar(e, env)};")
            self.close()
        self.barrier()
        self.materialized[e] = _Materialized(name, axes, pitch)

    def shuffle_combine(self, op: str, acc: str, ct: str, lanes: int) -> None:
        """Combine ``acc`` across groups of ``lanes`` lanes (a butterfly of xor shuffles).

        Every lane of the warp must execute each shuffle: the shuffled value is read into a
        variable first, since ``acc || shfl(...)`` would skip the shuffle where ``acc`` is true.
        """
        self.open(f"for (int pf_s = {lanes // 2}; pf_s > 0; pf_s >>= 1)")
        self.line(f"const {ct} pf_other = pf::shfl_xor({acc}, pf_s);")
        self.line(f"{acc} = {self.combine(op, acc, 'pf_other', ct)};")
        self.close()

    def reduce_items(self, e: Reduce, env: dict[str, str], acc: str, ct: str, first: str, step: int) -> None:
        """``acc ⊕= e.tile[r]`` for ``r = first, first + step, …`` (``vec`` neighbours per step where loads allow)."""
        r, length = axis_var(e.axis), self.sizes[e.axis]
        vec, loads = self.lane_plan([e.tile], e.axis)
        if first == "0" and -(-length // vec) <= UNROLL_REDUCE:
            # One thread per output and a short slice (a combine over splits): unrolled, so that all its
            # loads are in flight at once.
            self.line("#pragma unroll")
        t = self.widths.tile
        if vec == 1:
            self.open(f"for ({t} {r} = {first}; {r} < {length}; {r} += {step})")
            self.line(f"{acc} = {self.combine(e.op, acc, self.scalar(e.tile, {**env, e.axis: r}), ct)};")
            self.close()
            return
        self.open(f"for ({t} {r} = ({first}) * {vec}; {r} < {length}; {r} += {step * vec})")
        inner = {**env, e.axis: r}
        self.load_lanes(loads, inner, vec)
        for _, lane_env in self.lanes(inner, e.axis, vec):
            self.line(f"{acc} = {self.combine(e.op, acc, self.scalar(e.tile, lane_env), ct)};")
        self.lane_arrays = {}
        self.close()

    def reduce_lanes(self, outputs: int, length: int | None = None) -> int:
        """Lanes per output when the block shares ``outputs`` reductions: as many as the threads allow, a
        power of two, and (given the ``length`` reduced) no more than the elements rounded up to one."""
        lanes = _pow2_floor(max(1, self.threads // outputs))
        return lanes if length is None else min(lanes, _pow2_ceil(length))

    def block_reduce(self, e: Reduce, name: str, axes: tuple[str, ...]) -> None:
        """``name[o] = op_r e.tile[o, r]`` for every output ``o``, by the whole block."""
        outputs = math.prod(self.sizes[a] for a in axes)
        length = self.sizes[e.axis]
        ct = self.reduce_type(e)
        lanes = self.reduce_lanes(outputs, length)
        if lanes <= self.warp:
            per_round = self.threads // lanes
            self.open(f"for (int pf_o0 = 0; pf_o0 < {outputs}; pf_o0 += {per_round})")
            self.line(f"const int pf_o = pf_o0 + pf_tid / {lanes};")
            acc = self.fresh("acc")
            self.line(f"{ct} {acc} = {_REDUCE_INIT[e.op]};")
            self.open(f"if (pf_o < {outputs})")
            env = self.decode(axes, "pf_o")
            self.reduce_items(e, env, acc, ct, f"pf_tid % {lanes}" if lanes > 1 else "0", lanes)
            self.close()
            if lanes > 1:
                self.shuffle_combine(e.op, acc, ct, lanes)
            self.line(f"if (pf_o < {outputs} && pf_tid % {lanes} == 0) {name}[pf_o] = {self.reduce_result(e, acc)};")
            self.close()
            return
        warps = self.threads // self.warp
        partial = self.fresh("red")
        self.shared_array(ct, partial, warps * _SIZEOF[ct])
        self.open(f"for (int pf_o = 0; pf_o < {outputs}; ++pf_o)")
        env = self.decode(axes, "pf_o")
        acc = self.fresh("acc")
        self.line(f"{ct} {acc} = {_REDUCE_INIT[e.op]};")
        self.reduce_items(e, env, acc, ct, "pf_tid", self.threads)
        self.shuffle_combine(e.op, acc, ct, self.warp)
        self.line(f"if (pf_tid % {self.warp} == 0) {partial}[pf_tid / {self.warp}] = {acc};")
        self.barrier()
        self.open("if (pf_tid == 0)")
        self.line(f"{ct} pf_w = {partial}[0];")
        step = self.combine(e.op, "pf_w", f"{partial}[pf_i]", ct)
        self.line(f"for (int pf_i = 1; pf_i < {warps}; ++pf_i) pf_w = {step};")
        self.line(f"{name}[pf_o] = {self.reduce_result(e, 'pf_w')};")
        self.close()
        self.barrier()
        self.close()

    # ------------------------------------------------------------ kernels
    def nest_kernel(self, nest: GridNest, name: str) -> Launch:
        """One kernel; where its streamed tiles (:mod:`~polyfuse.emit_cpp.stream`) would take more shared
        memory than ``STREAM_SHARED_BUDGET``, it is emitted again with one buffer per tile, then
        without streaming."""
        at, depth = len(self.lines), self.depth
        most = stream.STREAM_STAGES if self.stream_stages is None else self.stream_stages
        attempts: list[int | None] = [*range(most, -1, -1), None]
        for stages in attempts:
            self.stages = stages
            launch = self.nest_kernel_once(nest, name)
            if stages is None or self.peak <= min(stream.STREAM_SHARED_BUDGET, SHARED_LIMIT):
                break
            del self.lines[at:]
            self.depth = depth
        if self.peak > SHARED_LIMIT:
            raise UnsupportedPattern(f"kernel {name} needs {self.peak} bytes of shared memory (tiles and their "
                                     f"temporaries); a block may use {SHARED_LIMIT}. Use smaller tiles in the schedule")
        return launch

    def nest_kernel_once(self, nest: GridNest, name: str) -> Launch:
        self.scratch, self.peak = 0, 0
        warps = _warps(nest.chain)
        self.threads = warps * self.warp if nest.kind == CTA else MAP_THREADS
        header_at = len(self.lines)
        self.line(f"{self.kernel_qualifiers(self.threads)} {name}({self.parameters()})")
        self.line("{")
        self.depth += 1
        if nest.kind == MAP:
            blocks = self.map_body(nest.body)
            self.depth -= 1
            self.line("}")
            self.line("")
            return Launch(name, blocks, self.threads, 0)
        self.line("extern __shared__ __align__(16) unsigned char pf_smem[];")
        self.line("const int pf_tid = static_cast<int>(threadIdx.x);")
        self.line("(void)pf_tid;")
        blocks: Expr = Const(1, dt.i64)
        # Grid loops of one iteration: their variables are 0 (stream.py compares tile offsets with that).
        self.unit_vars = {lp.var.name: lp.var for lp in nest.chain if unit_loop(lp)}
        if nest.chain:
            self.line("int64_t pf_bid = blockIdx.x;")
            for lp in reversed(nest.chain):
                ext = self.scalar(lp.extent, {})
                t = self.widths.loop
                self.line(f"const {t} {lp.var.name} = static_cast<{t}>(pf_bid % {ext});")
                self.line(f"pf_bid /= {ext};")
            for lp in nest.chain:
                blocks = lp.extent if blocks == Const(1, dt.i64) else BinOp("*", blocks, lp.extent)
        for t in nest.shared:
            tensor = self.tensors[t]
            size = static_numel(tensor)
            if size is None:
                raise UnsupportedPattern(f"temporary {t!r} lives in shared memory per block but its shape "
                                         f"{list(map(str, tensor.shape))} is not static; give it a constant shape")
            dims = [int(d.value) for d in tensor.shape]
            inner = max((d for d, n in enumerate(dims) if n > 1), default=0)
            if inner > 0 and dims[inner] % 32 == 0 and size > dims[inner]:
                # Rows 8 words apart in the banks: the row reductions and the tensor-core epilogues
                # that touch several rows at once hit different banks.  (Trailing axes of size 1
                # are indexed by 0, so the last axis longer than 1 gets the padding.)
                self.pitches[t] = (inner, dims[inner] + 8)
                size = size // dims[inner] * (dims[inner] + 8)
            self.shared_array(self.stype(tensor.dtype), t, size * _SIZEOF[self.stype(tensor.dtype)])
        words = self.scratch // 4
        if words:
            self.line(f"for (int pf_z = pf_tid; pf_z < {words}; pf_z += {self.threads}) "
                      f"reinterpret_cast<uint32_t*>(pf_smem)[pf_z] = 0u;")
            self.barrier()
        self.stmt(nest.body)
        self.depth -= 1
        self.line("}")
        self.line("")
        resident = SM_SHARED // (self.peak + 1024)
        if MIN_BLOCKS and 1 < resident <= MIN_BLOCKS:
            # Ask the compiler for registers that let as many blocks reside as shared memory does: the
            # statements' barriers are hidden by the other resident blocks.
            self.lines[header_at] = self.lines[header_at].replace(
                f"__launch_bounds__({self.threads})", f"__launch_bounds__({self.threads}, {resident})")
        self.lines[header_at] += f"  // {self.peak} bytes of shared memory, {self.threads} threads"
        return Launch(name, blocks, self.threads, self.peak)

    def map_body(self, s: TileStore) -> Expr:
        self.sizes = axis_sizes(s)
        self.materialized = {}
        if self.reads_other_elements(s):
            raise UnsupportedPattern(f"block {s.block!r}: a statement outside any loop reads {s.tensor.name!r} at "
                                     f"elements it also writes; it cannot run one element per thread")
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        total = math.prod(self.sizes[a] for a in axes)
        self.line(f"// {s.block}: one element per thread")
        self.inline = True
        self.store_elements(s, axes, f"int64_t pf_e = static_cast<int64_t>(blockIdx.x) * {self.threads} + threadIdx.x",
                            f"static_cast<int64_t>(gridDim.x) * {self.threads}", total)
        self.inline = False
        return Const(max(1, min(-(-total // self.threads), 1 << 20)), dt.i64)

    def arguments(self) -> list:
        p = self.program
        inputs = [t for t in p.tensors if t.role == INPUT]
        outputs = [t for t in p.tensors if t.role == OUTPUT]
        scratch = [t for t in p.tensors if t.role not in (INPUT, OUTPUT) and t.name not in self.shared_names]
        return inputs + outputs + scratch + [part for split in self.presplit.values() for part in split]

    def parameters(self) -> str:
        parts = []
        for t in self.arguments():
            const = "const " if t.role == INPUT else ""
            parts.append(f"{const}{self.stype(t.dtype)}* {self.restrict} {t.name}")
        parts += [f"const int64_t {v.name}" for v in self.program.params]
        return ", ".join(parts)

    def kernel(self, entry: str) -> KernelSource:
        p = self.program
        self.presplit = presplit.plan(self, self.nests)
        self.line(f'#include "{self.header}"')
        self.line("")
        self.line(f"// {p.name}: generated by polyfuse for {self.target.backend} ({self.target.arch}); "
                  f"{len(self.presplit) + len(self.nests)} kernel(s), launched in order")
        launches = presplit.emit_kernels(self, entry)
        launches += tuple(self.nest_kernel(nest, f"{entry}_k{k}") for k, nest in enumerate(self.nests))
        args = self.arguments()
        signature = tuple(arg_of(t) for t in args)
        return KernelSource("\n".join(self.lines) + "\n", entry, signature, tuple(v.name for v in p.params),
                            self.target, launches)


def _row_values(value: Expr, dot: Expr, own: set, n_axes: tuple[str, ...]) -> list[Expr]:
    """The largest parts of a dot epilogue's ``value`` that are the same along the dot's columns
    (``n_axes``): the repair factors and statistics of a rolling update, read once per row of the
    thread's fragment instead of once per element.  Not the dot, the accumulator's own elements,
    reductions, or integer division (whose divisor a select may guard)."""
    from polyfuse.tiling.htile import tile_children, walk_tile_expr

    def fixed(x: Expr) -> bool:
        return _per_row(x, dot, own, n_axes)

    found: list[Expr] = []

    def visit(x: Expr) -> None:
        if isinstance(x, (Var, Const, Reduce)) or x == dot or x in own or x in found:
            return
        if fixed(x):
            if any(isinstance(n, (TileLoad, Var)) for n in walk_tile_expr(x)):
                found.append(x)  # (a constant stays in the text: the compiler folds it)
            return
        for c in tile_children(x):
            visit(c)

    visit(value)
    return found


def _per_row(x: Expr, dot: Expr, own: set, n_axes: tuple[str, ...]) -> bool:
    """Whether a dot epilogue computes ``x`` once per fragment row: it is the same along the dot's
    columns and holds no dot, accumulator element, reduction or integer division."""
    from polyfuse.tiling.htile import walk_tile_expr

    if any(depends_on(x, a) for a in n_axes):
        return False
    for n in walk_tile_expr(x):
        if n == dot or n in own or isinstance(n, (Reduce, Dot)):
            return False
        if isinstance(n, BinOp) and n.op in ("//", "%", "/") and n.dtype.is_int:
            return False
    return True


def _elementwise_path(root: Expr, target: Expr) -> bool:
    """Whether ``target`` is reached from ``root`` through elementwise nodes only (no reduction)."""
    from polyfuse.tiling.htile import tile_children

    if root is target or root == target:
        return True
    if isinstance(root, (Reduce, Dot)):
        return False
    return any(_elementwise_path(c, target) for c in tile_children(root))


def _align(n: int) -> int:
    return (n + 15) // 16 * 16


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(chain: tuple[Loop, ...]) -> int:
    for lp in chain:
        for k, v in lp.annotations:
            if k == "warps":
                return int(v)  # type: ignore[call-overload]
    return DEFAULT_WARPS


def emit_cuda(program: TileProgram, target: Target) -> KernelSource:
    return CudaEmitter(program, target).kernel(entry_name(program.name))
