"""The CUDA backend: one ``__global__`` kernel per grid nest, thread blocks cooperating on tiles.

:mod:`polyfuse.tiling.gpu` has cut the tile program into kernels and :mod:`polyfuse.emit_cpp.plan` has
decided how each runs (threads, layouts, dot instructions, shared memory); this module prints the plan, front
to back, and checks as it declares each shared array that it lies where the plan placed it.  In a **CTA
kernel** each thread block runs one iteration of the collapsed grid loops; its temporaries live in shared
memory (one dynamic buffer, static offsets) and every tile statement is shared by the block's threads:

* elementwise work runs one element per thread per step, the store's last axis fastest so that
  neighbouring threads touch neighbouring addresses (coalesced);
* ``Reduce`` runs in-thread over a strided slice, then with warp shuffles (``shfl_xor``) across
  the lanes that share an output, then through shared memory across warps when one output needs
  more than a warp;
* ``Dot`` runs as its :class:`~polyfuse.emit_cpp.dotplan.DotPlan` says (:mod:`polyfuse.emit_cpp.mma`):
  f16/bf16 operands on tensor cores, other dots with FMAs in f32/f64;
* nodes that need loops of their own are materialized in shared memory in post-order, with a
  barrier after each step and after each statement.

A **map kernel** (a tile statement outside any loop) gives each thread one stored element and
computes what that element needs — reductions and dots included — in registers.

Precision: as the host backend, f16/bf16/fp8 values are computed in float and rounded after
every operation.  Tensor cores multiply 16-bit operands exactly and accumulate in f32; an f32
operand of such a dot (attention's P) is split into two 16-bit parts (:mod:`~polyfuse.emit_cpp.mma`),
so that it keeps the accuracy of the f32 program.  ``exp`` of f32 values is ``pf::exp_fast`` (``__expf``'s
sequence, flushing results under 2^-126 to 0) where every output is a
16-bit float (the options' ``fast_exp``: its error stays below such an output's rounding, the
``2·Skv·2^-24`` term of :func:`polyfuse.ops.attention.tolerance`); HIP keeps the accurate one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

from polyfuse.emit_cpp import (
    fold, fragment_emit, groups, onchip, presplit, registers, resident, rows, stagger, stream, tma,
)
from polyfuse.emit_cpp.cfamily import (
    _REDUCE_INIT, _REDUCER_OP, SIZEOF, CFamilyEmitter, _Materialized, align16, axis_sizes, axis_var, reduce_lanes,
)
from polyfuse.emit_cpp.dotplan import SWIZZLE_ALIGN
from polyfuse.emit_cpp.mma import emit_dot, emit_dot_into, serial_dot
from polyfuse.emit_cpp.plan import KernelPlan, LoopPlan, ProgramPlan, StmtPlan
from polyfuse.emit_cpp.reciprocal import reciprocal_constant
from polyfuse.emit_cpp.target import GATHER_FAULT, KernelSource, Launch, Target, TensorMapArg, arg_of
from polyfuse.emit_cpp.vector import VECTOR_BYTES, VectorLanes, chunks
from polyfuse.emit_cpp.widths import INT32_MAX
from polyfuse.errors import InternalError, UnsupportedPattern
from polyfuse.ir import dtypes as dt
from polyfuse.ir.dtypes import DType
from polyfuse.ir.expr import BinOp, Const, Expr
from polyfuse.ir.stmt import INPUT, OUTPUT, TEMP, Loop, Seq, Stmt, Tensor
from polyfuse.tiling.gpu import GpuProgram
from polyfuse.tiling.grid import MAP
from polyfuse.tiling.parallel import unit_loop
from polyfuse.tiling.htile import (
    Broadcast, Dot, Reduce, Slice, TileLoad, TileStore, axes_of, has_gathers, walk_tile_expr,
)

class CudaEmitter(VectorLanes, CFamilyEmitter):
    """CUDA C++ for nvcc; subclassed by the HIP emitter."""

    header = "polyfuse_gpu.h"
    math_functions = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "floor": "floor",
                      "ceil": "ceil", "exp2": "exp2", "log2": "log2", "abs": "fabs", "pow": "pow"}
    fast_exp_function: str | None = "pf::exp_fast"
    """The approximate f32 exp of the options' ``fast_exp``; None: always the accurate one."""
    size_limit = INT32_MAX
    """Size parameters are at most 2^31 - 1 (the runtime checks it at launch): a generic kernel, whose grid is the
    rows or the batch, then keeps the 32-bit index arithmetic of the kernel of fixed sizes wherever that fits."""

    def __init__(self, gpu: GpuProgram, target: Target, plan: ProgramPlan):
        super().__init__(gpu.program)
        self.gpu = gpu
        self.target = target
        self.options = target.options
        self.plan = plan
        self.warp = target.warp_size
        self.tensors = {t.name: t for t in gpu.program.tensors}
        self.shared_names = {n for nest in gpu.nests for n in nest.shared}
        self.sizes: dict[str, int] = {}
        self.inline = False
        self.lane: int | None = None
        self.lane_arrays: dict[TileLoad, str] = {}
        self.memo: list[dict] = [{}]
        self.threads = 0
        self.scratch = 0
        self.peak = 0
        self.kernel_plan: KernelPlan | None = None
        """The plan of the kernel being printed."""
        self.stmt_plan: StmtPlan | None = None
        """The plan of the statement being printed."""
        self.pitches: dict[str, tuple[int, int]] = {}
        """(dimension, row pitch in elements) of the shared temporaries whose rows are padded."""
        self.overrides: dict[Expr, str] = {}
        """Nodes whose value is a C expression already at hand (a dot's result in its epilogue)."""
        self.inverses: dict[Expr, str] = {}
        """Divisors whose reciprocal a register holds (the rows-on-chip plan's): ``x / d`` prints as ``x * r``."""
        self.guards: dict[Expr, str] = {}
        """The flag of each such divisor taken only where its row passed ``pf::rcp_normal``."""
        self.resident: dict[str, resident.Resident] = {}
        """Global temporaries kept in shared memory across the loops being emitted, by tensor."""
        self.staged: dict[str, fold.StagedPartial] = {}
        """The partials a folded combine being emitted reads from its shared copies, by tensor."""
        self.synced_at = -1
        """The number of lines printed when the last block barrier was (:meth:`barrier`)."""
        self.refills: tuple[stream.StreamPlan, Loop] | None = None
        """The loop being printed whose tiles are refilled after their last readers, with its plan
        (:func:`~polyfuse.emit_cpp.stream.refill`, after each statement's closing barrier)."""
        self.published: str | None = None
        """The first statement of an iteration whose tiles were copied ahead and published at its top
        (:func:`~polyfuse.emit_cpp.stream.top`): its dot needs no barrier of its own for them."""
        self.group: groups.WarpGroups | None = None
        """The warp groups running the loop being printed (:mod:`~polyfuse.emit_cpp.groups`): its barriers are
        theirs and its shared memory one copy per group."""
        self.presplit = plan.presplit
        self.fast_exp = plan.fast_exp and self.fast_exp_function is not None
        """f32 ``exp`` is ``fast_exp_function`` (the plan's ``fast_exp``; this backend may have none)."""

    # ------------------------------------------------------------ table of differences
    def kernel_qualifiers(self, threads: int, min_blocks: int | None = None) -> str:
        bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
        return f'extern "C" __global__ void __launch_bounds__({bounds})'

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

    @contextlib.contextmanager
    def threads_as(self, index: str, count: int) -> Iterator[None]:
        """Print code that spreads work over ``count`` threads numbered ``index`` (a warp of the block, by
        ``pf_lane``) instead of the block's: ``pf_tid`` and :attr:`threads` stand for them inside."""
        outer = self.threads
        self.open("")
        self.line(f"const int pf_part_tid = {index};  // (the threads that do this part)")
        self.open("")
        self.line("const int pf_tid = pf_part_tid;")
        self.threads = count
        try:
            yield
        finally:
            self.threads = outer
            self.close()
            self.close()

    @contextlib.contextmanager
    def in_groups(self, g: groups.WarpGroups) -> Iterator[None]:
        """Print a loop's body run by warp groups ``g``: ``pf_tid`` the thread of its group, :meth:`barrier` the
        group's, the shared memory it takes one copy per group (``g.stride`` bytes apart, from ``pf_group``'s)."""
        if self.group is not None:
            raise InternalError(f"warp groups of loop {g.var} inside those of loop {self.group.var}")
        mark, peak = self.scratch, self.peak
        self.peak = mark
        with self.threads_as(f"pf_tid % {g.threads}", g.threads):
            self.group = g
            try:
                yield
            finally:
                self.group = None
        if self.peak - mark > g.stride:
            raise InternalError(f"loop {g.var}: a warp group's shared memory is planned as {g.stride} bytes, the "
                                f"printed body takes {self.peak - mark}")
        self.scratch, self.peak = mark, max(peak, mark + g.groups * g.stride)

    @property
    def block_threads(self) -> int:
        """The threads of the block of the kernel being printed."""
        assert self.kernel_plan is not None
        return self.kernel_plan.threads

    def element_loop(self, header: str) -> None:
        """A loop over the elements a thread handles; unrolled (the options' ``element_unroll``) so their loads
        are in flight together."""
        self.line(f"#pragma unroll {self.options.element_unroll}")
        self.open(header)

    def divisor_inverse(self, e: BinOp, d: DType) -> str | None:
        """``fl(1/c)`` for an f32 division by a constant ``c`` where the options' ``reciprocal_constants`` allow
        (:func:`~polyfuse.emit_cpp.reciprocal.reciprocal_constant`); the register holding ``rcp_rz`` of a
        divisor a row kernel's plan divides by its reciprocal (:func:`~polyfuse.emit_cpp.onchip.emit`)."""
        if e.op != "/" or e.dtype != dt.f32:
            return None
        divisor = e.b.tile if isinstance(e.b, Broadcast) else e.b
        if divisor in self.inverses:
            return self.inverses[divisor]
        if not self.options.reciprocal_constants or not isinstance(e.b, Const):
            return None
        inverse = reciprocal_constant(float(e.b.value))
        return None if inverse is None else self.literal(inverse, d)

    def barrier(self) -> None:
        """A block barrier (the warp group's, inside a loop run by warp groups); none right after another at the
        same place (nothing between them to order)."""
        if self.synced_at == len(self.lines):
            return
        self.line("__syncthreads();" if self.group is None else self.group.barrier)
        self.synced_at = len(self.lines)

    def warp_barrier(self) -> None:
        self.line("pf::syncwarp();")

    def stmt(self, s: Stmt) -> None:
        """A sequence's runs of row statements are emitted as the plan's row groups (:mod:`~polyfuse.emit_cpp.rows`)."""
        if not isinstance(s, Seq):
            super().stmt(s)
            return
        assert self.kernel_plan is not None
        for part in self.kernel_plan.seqs[id(s)]:
            if isinstance(part, rows.RowGroup):
                rows.emit(self, part)
            else:
                self.stmt(part)

    def loop(self, s: Loop) -> None:
        """A loop of a block, with what its plan keeps across iterations: rolling accumulators in registers
        (:mod:`~polyfuse.emit_cpp.registers`), small temporaries in shared memory
        (:mod:`~polyfuse.emit_cpp.resident`), operand tiles (:mod:`~polyfuse.emit_cpp.stream`)."""
        assert self.kernel_plan is not None
        lp: LoopPlan = self.kernel_plan.loops[id(s)]
        if lp.group is not None:
            groups.emit(self, lp.group, lambda: self.stmt(s.body))
            return
        if lp.fragments is not None:
            kept = tuple((t.buffer, t.nbytes) for t in lp.streams.kept) if lp.streams is not None else ()
            mark = self.scratch
            fragment_emit.emit(self, s, lp.fragments, lp.offsets, kept)
            self.scratch = mark
            return
        for acc in lp.accumulators.values():
            registers.load(self, acc)
        kept_at = self.scratch
        resident.load(self, list(lp.resident), lp.offsets)
        outer_kept, added = dict(self.resident), {r.tensor for r in lp.resident} - self.shared_names
        self.resident.update((r.tensor, r) for r in lp.resident)
        self.shared_names |= added  # no vector paths of global memory for them
        for tile in lp.streams.kept if lp.streams is not None else ():
            self.shared_array("uint16_t", tile.buffer, tile.nbytes, lp.offsets[tile.buffer])
        mark = self.scratch
        if lp.streams is not None and (lp.streams.ahead or lp.streams.refill):
            stream.prologue(self, lp.streams, s)
            outer = self.open_loop(s, lp.stagger)
            self.allocate(s)
            stream.top(self, lp.streams, s)
            outer_refills, self.refills = self.refills, (lp.streams, s) if lp.streams.refill else None
            self.stmt(s.body)
            self.refills = outer_refills
            self.close_loop(lp.stagger, outer)
        else:
            outer = self.open_loop(s, lp.stagger)
            self.allocate(s)
            self.stmt(s.body)
            self.close_loop(lp.stagger, outer)
        if lp.streams is not None:
            stream.drain(self)
        self.scratch = mark
        self.resident = outer_kept
        self.shared_names -= added
        resident.store(self, list(lp.resident))
        self.scratch = kept_at
        for block in lp.stored:
            registers.store(self, lp.accumulators[block])
        if lp.stored:
            self.barrier()

    def open_loop(self, s: Loop, st: stagger.Stagger | None) -> dict[Expr, str]:
        """Open ``s``'s loop; a staggered one (:mod:`~polyfuse.emit_cpp.stagger`) counts its iterations in a counter
        of its own, its variable the step the counter stands for, and the folds' first-iteration tests read the
        counter (returned: the overrides they replaced, for :meth:`close_loop`)."""
        if st is None:
            self.open(self.loop_header(s))
            return {}
        t, n = self.widths.loop, self.scalar(s.extent, {})
        self.open(f"for ({t} {st.counter} = 0; {st.counter} < {n}; ++{st.counter})")
        # (a loop whose tiles are copied ahead reads the step only in the copies' scopes)
        self.line(f"[[maybe_unused]] const {t} {st.var} = {st.step(st.counter, n, t)};  // this block's step")
        outer = {e: self.overrides[e] for e in st.first if e in self.overrides}
        self.overrides.update({e: f"({st.counter} == 0)" for e in st.first})
        return outer

    def close_loop(self, st: stagger.Stagger | None, outer: dict[Expr, str]) -> None:
        for e in st.first if st is not None else ():
            del self.overrides[e]
        self.overrides.update(outer)
        self.close()

    def access(self, tensor, index, env: dict[str, str]) -> str:
        """An access; to the shared copy where the loop being emitted keeps the tensor
        (:mod:`~polyfuse.emit_cpp.resident`) or a folded combine staged its partials (:mod:`~polyfuse.emit_cpp.fold`)."""
        kept = self.resident.get(tensor.name)
        if kept is not None:
            return f"{kept.name}[{kept.at(env, index)}]"
        staged = self.staged.get(tensor.name)
        if staged is not None:
            return fold.staged_access(staged, self.indices(index[len(staged.row):], env))
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
    def take(self, nbytes: int, align: int = 16) -> int:
        """Byte offset of ``nbytes`` of per-statement scratch (``align``-byte aligned)."""
        offset = -(-self.scratch // align) * align
        self.scratch = offset + align16(nbytes)
        self.peak = max(self.peak, self.scratch)
        return offset

    def shared_array(self, ctype: str, name: str, nbytes: int, planned: int | None = None, align: int = 16,
                     per_group: groups.WarpGroups | None = None) -> None:
        """Declare ``name``: the next ``nbytes`` of shared memory (``align``-byte aligned; at byte ``planned``,
        where the plan placed it); inside a loop run by warp groups, its group's copy; ``per_group``: a temporary
        of such a loop declared at the top of the kernel, one copy per group."""
        offset = self.take(nbytes if per_group is None else groups.copy_bytes(nbytes, per_group), align)
        if planned is not None and planned != offset:
            raise InternalError(f"shared array {name}: planned at byte {planned}, printed at {offset}")
        if per_group is not None:
            address = groups.copy_address(offset, nbytes, per_group)
        elif self.group is not None:
            address = f"pf_smem + {offset} + pf_group * {self.group.stride}"
        else:
            address = f"pf_smem + {offset}"
        self.line(f"{ctype}* {name} = reinterpret_cast<{ctype}*>({address});")

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

    def store_elements(self, s: TileStore, axes: tuple[str, ...], flat: str, step: str, total: int) -> None:
        """The loop storing ``total`` elements of ``s``: ``flat`` is the first, ``step`` the stride."""
        self.block = s.block
        inner = axes[-1]
        exprs = [s.value] + ([s.mask] if s.mask is not None else [])
        vec, loads = self.lane_plan(exprs, inner)
        itemsize = SIZEOF.get(self.stype(s.tensor.dtype), 1)
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
            ctype, n = chunks(SIZEOF[st], vec)
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
        return serial_dot(self, e, env, self.fresh("dot"))

    # ------------------------------------------------------------ CTA statements
    def store(self, s: TileStore) -> None:
        self.block = s.block
        assert self.kernel_plan is not None
        plan = self.kernel_plan.stmts[id(s)]
        if self.scratch != plan.at:
            raise InternalError(f"block {s.block}: its scratch is planned at byte {plan.at} of shared memory, "
                                f"the printer is at {self.scratch}")
        self.sizes = axis_sizes(s)
        self.materialized = {}
        self.stmt_plan = plan
        mark = self.scratch
        self.line(f"// {s.block}")
        self.open("")
        axes = tuple(i.axis for i in s.index if isinstance(i, Slice))
        for e in plan.materialize:
            self.materialize(e)
        if plan.in_place:
            self.dot_in_place(s, plan)
        elif axes:
            total = math.prod(self.sizes[a] for a in axes)
            self.store_elements(s, axes, f"{self.widths.tile} pf_e = pf_tid", str(self.threads), total)
        else:
            self.open("if (pf_tid == 0)")
            self.assign(s, {})
            self.close()
        self.close()
        self.barrier()
        if self.refills is not None:
            stream.refill(self, *self.refills, s.block)
        self.scratch = mark
        self.materialized = {}
        self.stmt_plan = None

    def dot_in_place(self, s: TileStore, plan: StmtPlan) -> None:
        """A statement computed in the epilogue of its tensor-core dot, written in place.

        The value holds one dot over exactly the statement's axes, under elementwise operations only (a
        select against masked rows, a scale): each thread evaluates the value for the result elements it
        holds in registers and stores it, so neither the dot's result array nor a second pass over it
        exists.  The store's own reads happen in the thread that writes the element, after the operands are
        staged, so this is safe unless the value reads the temporary at other elements (the plan checked).
        In registers (its loop's accumulator) the element is the thread's register.
        """
        self.block = s.block
        assert plan.dot is not None and self.kernel_plan is not None
        e = next(n for n in walk_tile_expr(s.value) if isinstance(n, Dot))
        own = {n for n in walk_tile_expr(s.value) if isinstance(n, TileLoad) and n.tensor.name == s.tensor.name}
        target = f"{plan.register}[pf_nb][pf_q]" if plan.register is not None else None

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

        def per_row(env: dict[str, str]) -> None:
            for x in plan.row_values:
                name = self.fresh("row")
                self.line(f"const {self.ctype(x.dtype)} {name} = {self.scalar(x, env)};")
                self.overrides[x] = name

        outer = {x: self.overrides[x] for x in plan.row_values if x in self.overrides}
        try:
            emit_dot_into(self, plan.dot, e, write, per_row)
        finally:
            for x in plan.row_values:
                self.overrides.pop(x, None)
            self.overrides.update(outer)

    def materialize(self, e: Expr) -> None:
        axes = axes_of(e)
        size = math.prod(self.sizes[a] for a in axes)
        name = self.fresh()
        ct = self.ctype(e.dtype)  # an "or" reduction is stored as bool (its accumulator is an int)
        pitch = None
        if isinstance(e, Dot):
            assert self.stmt_plan is not None
            dot = self.stmt_plan.dots[e]
            pitch = dot.pitch
            rows_ = size // self.sizes[axes[-1]] if pitch else 1
            self.shared_array(ct, name, (rows_ * pitch if pitch else size) * SIZEOF[ct])
            emit_dot(self, dot, e, name, axes)
        else:
            self.shared_array(ct, name, size * SIZEOF[ct])
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
        if first == "0" and -(-length // vec) <= self.options.unroll_reduce:
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


    def block_reduce(self, e: Reduce, name: str, axes: tuple[str, ...]) -> None:
        """``name[o] = op_r e.tile[o, r]`` for every output ``o``, by the whole block."""
        outputs = math.prod(self.sizes[a] for a in axes)
        length = self.sizes[e.axis]
        ct = self.reduce_type(e)
        lanes = reduce_lanes(self.threads, outputs, length)
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
        self.shared_array(ct, partial, warps * SIZEOF[ct])
        # One output: a scope, not a loop, so that its closing barrier is the statement's (one barrier, not two).
        o = "0" if outputs == 1 else "pf_o"
        self.open(f"for (int pf_o = 0; pf_o < {outputs}; ++pf_o)" if outputs > 1 else "")
        env = self.decode(axes, o)
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
        self.line(f"{name}[{o}] = {self.reduce_result(e, 'pf_w')};")
        self.close()
        if outputs > 1:
            self.barrier()  # the partials are written again by the next output
        self.close()
        self.barrier()

    # ------------------------------------------------------------ kernels
    def nest_kernel(self, plan: KernelPlan) -> Launch:
        """One kernel, as ``plan`` says."""
        nest, name = plan.nest, plan.name
        self.kernel_plan = plan
        self.scratch, self.peak = 0, 0
        self.threads = plan.threads
        comment = f"  // {plan.peak} bytes of shared memory, {plan.threads} threads" if nest.kind != MAP else ""
        if plan.replanned:
            self.line(f"// {name}: planned with {plan.replanned}")
        self.line(f"{self.kernel_qualifiers(plan.threads, plan.min_blocks)} {name}({self.parameters()}){comment}")
        self.line("{")
        self.depth += 1
        if nest.kind == MAP:
            assert isinstance(nest.body, TileStore)
            blocks = self.map_body(nest.body)
            self.depth -= 1
            self.line("}")
            self.line("")
            return Launch(name, blocks, self.threads, 0)
        # One alignment for every kernel of the source (nvcc warns where declarations of pf_smem differ): the
        # swizzled panels' where any kernel has them (MLA decode's partial kernel beside its combine).
        swizzled = any(lp.fragments is not None and lp.fragments.warpgroups
                       for k in self.plan.kernels for lp in k.loops.values())
        self.line(f"extern __shared__ __align__({SWIZZLE_ALIGN if swizzled else 16}) unsigned char pf_smem[];")
        self.line("const int pf_tid = static_cast<int>(threadIdx.x);")
        self.line("(void)pf_tid;")
        blocks: Expr = Const(1, dt.i64)
        if nest.chain:
            # Block index to grid loop values, the last loop fastest; the plan's heavy_first loop slowest and
            # from its last value (any order is the program's: the grid loops' iterations are independent).
            self.line("int64_t pf_bid = blockIdx.x;")
            heavy = [lp for lp in nest.chain if lp.var.name == plan.heavy_first]
            for lp in [*reversed([lp for lp in nest.chain if lp not in heavy]), *heavy]:
                ext = self.scalar(lp.extent, {})
                t = self.widths.loop
                value = f"({ext} - 1) - pf_bid % {ext}" if lp in heavy else f"pf_bid % {ext}"
                # (a loop that runs once may have been simplified out of every index)
                unused = "[[maybe_unused]] " if unit_loop(lp) else ""
                self.line(f"{unused}const {t} {lp.var.name} = static_cast<{t}>({value});")
                self.line(f"pf_bid /= {ext};")
            for lp in nest.chain:
                blocks = lp.extent if blocks == Const(1, dt.i64) else BinOp("*", blocks, lp.extent)
        self.nest_part(plan, scoped=plan.fold is not None)
        if plan.fold is not None:
            assert plan.folded is not None
            fold.emit(self, plan.fold, plan.folded)
        self.depth -= 1
        self.line("}")
        self.line("")
        if self.peak != plan.peak:
            raise InternalError(f"kernel {name}: the plan gives {plan.peak} bytes of shared memory, the printed "
                                f"kernel takes {self.peak}; the planner and the printer disagree")
        self.kernel_plan = None
        return Launch(name, blocks, self.threads, self.peak)

    def nest_part(self, plan: KernelPlan, scoped: bool = False) -> None:
        """The body of ``plan``'s nest with its shared temporaries (zeroed), from the current scratch offset; in a
        scope of its own where a folded combine follows it in the same kernel."""
        self.kernel_plan = plan
        if scoped:
            self.open("")
        for t in plan.shared:
            if t.pitch is not None:
                assert t.padded is not None
                self.pitches[t.name] = (t.padded, t.pitch)
            self.shared_array(t.ctype, t.name, t.nbytes, t.offset, per_group=t.groups)
        words = self.scratch // 4
        if words:
            self.line(f"for (int pf_z = pf_tid; pf_z < {words}; pf_z += {self.threads}) "
                      f"reinterpret_cast<uint32_t*>(pf_smem)[pf_z] = 0u;")
            self.barrier()
        if isinstance(plan.rows, onchip.RowsOnChip):
            onchip.emit(self, plan.rows)
        else:
            self.stmt(plan.nest.body)
        if scoped:
            self.close()

    def map_body(self, s: TileStore) -> Expr:
        self.block = s.block
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
        tickets = [k.fold.counter for k in self.plan.kernels if k.fold is not None]
        fault = [Tensor(GATHER_FAULT, (Const(3, dt.i32),), dt.i64, TEMP)] if has_gathers(p) else []
        return (inputs + outputs + scratch + tickets + [part for split in self.presplit.values() for part in split]
                + fault)

    def tensor_maps(self) -> tuple[TensorMapArg, ...]:
        """The tensor maps the kernels' bulk copies read (:mod:`~polyfuse.emit_cpp.tma`), every kernel's first
        parameters: decided by the plan, before any kernel is printed."""
        return tma.kernel_maps(box for k in self.plan.kernels for lp in k.loops.values() if lp.fragments is not None
                               for box in lp.fragments.boxes.values())

    def parameters(self) -> str:
        parts = [f"const __grid_constant__ CUtensorMap {m.name}" for m in self.tensor_maps()]
        for t in self.arguments():
            const = "const " if t.role == INPUT else ""
            parts.append(f"{const}{self.stype(t.dtype)}* {self.restrict} {t.name}")
        parts += [f"const int64_t {v.name}" for v in self.program.params]
        return ", ".join(parts)

    def kernel(self, entry: str) -> KernelSource:
        p = self.program
        maps = self.tensor_maps()
        if maps:
            self.line("#include <cuda.h>  // CUtensorMap")
        self.line(f'#include "{self.header}"')
        self.line("")
        self.line(f"// {p.name}: generated by polyfuse for {self.target.backend} ({self.target.arch}); "
                  f"{len(self.presplit) + len(self.plan.kernels)} kernel(s), launched in order")
        self.line(f"// device: {self.plan.device.describe()}")
        self.line(f"// options: {self.options.describe()}")
        launches = presplit.emit_kernels(self, entry)
        launches += tuple(self.nest_kernel(k) for k in self.plan.kernels)
        args = self.arguments()
        signature = tuple(arg_of(t) for t in args)
        zeroed = tuple(k.fold.counter.name for k in self.plan.kernels if k.fold is not None)
        return KernelSource("\n".join(self.lines) + "\n", entry, signature, tuple(v.name for v in p.params),
                            self.target, launches, tuple(self.gather_sites), self.widths.size_limit, zeroed,
                            maps)
