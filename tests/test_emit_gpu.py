"""CUDA and HIP code generation, without a GPU: structure, compile-only builds, launch checks.

Every fused catalog operator (both attention modes) is emitted for CUDA and compiled with
``nvcc -arch=sm_90a`` and for HIP and compiled with ``hipcc --offload-arch=gfx90a`` (each
skipped where the compiler is missing).  The sources are compiled in parallel once per session.
The runtime's argument checks and launch sequence are exercised through a loader that records
launches instead of running them.
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from polyfuse import ops
from polyfuse.emit_cpp import CUDA, HIP, emit, gpu_plan
from polyfuse.tiling.grid import CTA, partition
from polyfuse.emit_cpp.dotplan import Frame, exact_low, k_groups
from polyfuse.emit_cpp.options import CodegenOptions
from polyfuse.errors import BackendUnavailable, LaunchError, NoRepairFound, UnsupportedPattern
from polyfuse.ir import dtypes as dt
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import default_schedule, has_default_schedule
from polyfuse.runtime.compiler import HEADERS_DIR, CompileOptions
from polyfuse.runtime.gpu import GpuKernel
from polyfuse.runtime.gpu_compiler import compile_gpu
from polyfuse.runtime.loaders import Loader, PyCuda
from polyfuse.tiling import to_tiles

FUSED = [(n, m) for n in ops.names() for m in ops.get(n).modes if has_default_schedule(n, m) and n != "quant_gemm_fp8"]
ATTENTION = [(n, m) for n, m in FUSED if n.startswith("attn")]
WERROR = CompileOptions(werror=True)
"""Compile tests treat warnings as errors (nvcc ``-Werror all-warnings``, hipcc ``-Werror``)."""
SHARED_PATH = CUDA.with_options(fragment_loops=False)
"""CUDA with attention's key loop printed statement by statement through shared memory (the path every loop
that does not run in warp fragments takes): the tests of that path's staging, epilogues and row groups."""
ROLLING = CUDA.with_options(rows_on_chip=False)
"""CUDA with rows rolled over chunks even where they fit on chip (the path of rows too long for registers)."""
OLD_TILE = GpuTuning(prefill_tile=(32, 64), prefill_min_rows=16, prefill_wgmma_keys=64, prefill_wgmma_rows=())
"""Prefill tiles of at most 32 query rows (8 warps share each tile: the shared-memory path's measured best)."""


def _tiles(name: str, mode: str, target: str = "cuda", tuning: GpuTuning | None = None,
           options: CodegenOptions | None = None, **sizes: int):
    op = ops.get(name)
    sizes = {**op.sizes(mode), **sizes}
    return to_tiles(default_schedule(name, mode, op.program(mode, **sizes), target=target, tuning=tuning,
                                     options=options).program)


@pytest.fixture(scope="session")
def sources():
    """CUDA and HIP sources of every fused operator at its test sizes."""
    out = {}
    for name, mode in FUSED:
        out[("cuda", name, mode)] = emit(_tiles(name, mode, "cuda"), CUDA)
        out[("hip", name, mode)] = emit(_tiles(name, mode, "hip"), HIP)
    return out


def _compile_all(sources, backend: str) -> dict:
    def one(key):
        source = sources[key]
        try:
            compile_gpu(source.text, f"{key[1]}_{key[2]}", backend, source.target.arch, options=WERROR,
                        compile_only=True)
            return key, None
        except Exception as err:  # noqa: BLE001 - reported per operator by the test below
            return key, err

    keys = [k for k in sources if k[0] == backend]
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, keys))


@pytest.fixture(scope="session")
def nvcc_results(sources):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    return _compile_all(sources, "cuda")


@pytest.fixture(scope="session")
def hipcc_results(sources):
    if shutil.which("hipcc") is None and not os.path.exists("/opt/rocm/bin/hipcc"):
        pytest.skip("needs hipcc (Debian package hipcc, or ROCm)")
    return _compile_all(sources, "hip")


@pytest.mark.nvcc
@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_cuda_source_compiles_for_sm90a(nvcc_results, name, mode):
    err = nvcc_results[("cuda", name, mode)]
    assert err is None, str(err)


@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_hip_source_compiles_for_gfx90a(hipcc_results, name, mode):
    err = hipcc_results[("hip", name, mode)]
    assert err is None, str(err)


@pytest.mark.parametrize(("name", "mode"), ATTENTION)
def test_attention_dots_use_tensor_cores(sources, name, mode):
    cuda, hip = sources[("cuda", name, mode)].text, sources[("hip", name, mode)].text
    assert "pf::mma_f16" in cuda and "pf::ldmatrix_x4" in cuda
    assert "pf::mma_" not in hip and "ldmatrix" not in hip  # HIP uses the portable FMA path


@pytest.mark.parametrize(("name", "mode"), FUSED)
def test_fast_exp_only_where_every_output_is_16_bit(sources, name, mode):
    """CUDA's ``pf::exp_fast`` (option fast_exp) where the outputs are f16/bf16 (attention's tolerance has its
    term); f32 outputs keep the 2-ulp ``exp`` their tolerances assume, and HIP always does."""
    program = _tiles(name, mode)
    fast = all(t.dtype.is_float and t.dtype.bits == 16 for t in program.outputs)
    for backend in ("cuda", "hip"):
        text = sources[(backend, name, mode)].text
        plain = re.search(r"(?<![\w.])exp\(", text) is not None
        expected = (True, False) if fast and backend == "cuda" else (False, plain)
        assert ("pf::exp_fast(" in text, plain) == expected, (backend, name, mode)
    assert fast == name.startswith("attn"), name


PREFILL = [n for n in ops.names() if "prefill" in ops.get(n).modes and has_default_schedule(n, "prefill")]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", PREFILL)
def test_hopper_prefill_kernels_compile_at_the_bench_sizes(name):
    # The kernels the H100 runs: warpgroup products, the producer warpgroup, setmaxnreg, mbarriers (sm_90a).
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    source = emit(_tiles(name, "prefill", **ops.get(name).presets["prefill"]), CUDA)
    assert "pf::setmaxnreg_inc<" in source.text and re.search(r"pf::wgmma_m64n(64|128)k16_f16_rs<1, 0>", source.text)
    assert source.maps and all(f"const __grid_constant__ CUtensorMap {m.name}" in source.text for m in source.maps)
    compile_gpu(source.text, f"hopper_{name}", "cuda", source.target.arch, options=WERROR, compile_only=True)


@pytest.mark.nvcc
@pytest.mark.parametrize("width", [16, 64])
@pytest.mark.parametrize("options", [
    {"prefetch": False}, {"prefetch": False, "keep_invariant": False}, {"prefetch": False, "async_staging": False},
    {"async_staging": False}, {"round_operands": False}])
def test_fragment_loop_variants_compile(options, width):
    # The loop in warp fragments under each option that changes how it stages its operands or rounds P:
    # copies at the top of each iteration (one wait per product), the query tile staged per iteration,
    # staging through registers, P split hi + lo.  (The GPU tests run them against the default.)  With heads
    # 64 wide, as warpgroup products on sm_90a (P split hi + lo: mma.sync).
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    source = emit(_tiles("attn_causal", "prefill", Sq=128, Skv=128, D=width, Dv=width), CUDA.with_options(**options))
    assert "in warp fragments" in source.text
    assert ("pf::wgmma_fence" in source.text) == (width == 64 and "round_operands" not in options)
    assert ("pf::cp_async_wait<1>" in source.text) == (options.get("prefetch") is False
                                                       and options.get("async_staging") is not False)
    compile_gpu(source.text, f"fragments_{width}_" + "_".join(options), "cuda", source.target.arch, options=WERROR,
                compile_only=True)


def test_pv_product_rounds_p_once_by_default_and_splits_it_on_request():
    """P (f32, computed in registers) meets V's f16 tensor cores rounded once by default, split hi + lo with
    ``round_operands`` off; either way straight from the score registers (the loop runs in warp fragments)."""
    tiles = _tiles("attn_causal", "prefill")
    once = emit(tiles, CUDA).text
    assert "in warp fragments" in once and "pf::pack_f16(" in once and "pf_fa_lo" not in once
    split = emit(tiles, CUDA.with_options(round_operands=False)).text
    assert "in warp fragments" in split and "pf_fa_lo" in split and "pf::split_rest(" in split


@pytest.mark.parametrize("name", ["softmax", "rmsnorm_amax", "layernorm_stats", "variance"])
def test_row_kernels_use_128_bit_accesses(name):
    text = emit(_tiles(name, "default", M=256) if "M" in ops.get(name).sizes() else
                _tiles(name, "default", L=256), CUDA).text
    assert "uint4" in text


def test_decode_splits_into_partial_and_combine_kernels():
    # At the test size (Skv = 40) the split rule keeps all keys in one split: one kernel, no combine.
    assert [(n.kind, len(n.chain)) for n in partition(_tiles("attn_causal", "decode"))[1]] == [(CTA, 3)]
    any_split = GpuTuning(decode_min_split=1)  # three splits of 16 keys
    program, nests = partition(_tiles("attn_causal", "decode", tuning=any_split))
    kinds = [(n.kind, len(n.chain)) for n in nests]
    assert kinds == [(CTA, 4), (CTA, 3)]  # (b, i, h, split) partials; (b, i, h) combine with out
    promoted = {t.name: t for t in program.tensors}["row_max_rf"]
    assert len(promoted.shape) == 7  # b, h, i prepended to the compacted per-split shape


def test_prefill_is_one_kernel_per_query_tile():
    source = emit(_tiles("attn_causal", "prefill", Sq=256, Skv=256), CUDA)
    (launch,) = source.launches
    assert launch.threads == 256 and 0 < launch.shared <= 227 * 1024
    # the rolling loop over key tiles (128 query rows, 128 keys on sm_90a), up to the last one the causal mask
    # leaves visible (tiling/skip.py), in warp fragments (8 warps of 16 rows)
    assert "for (int j_0 = 0; j_0 < (i_0 + (1)); ++j_0)" in source.text
    assert "in warp fragments" in source.text


def test_exact_low_sees_through_casts_and_masks():
    from polyfuse.ir.expr import Cast, Const, Select, Var
    from polyfuse.ir.stmt import Tensor
    from polyfuse.tiling.htile import Slice, TileLoad

    t = Tensor("x", (Const(16, dt.i32),), dt.f16)
    load = TileLoad(t, (Slice(Const(0, dt.i32), 16, "a"),))
    assert exact_low(Cast(dt.f32, load)) == dt.f16
    assert exact_low(Select(Var("c", dt.bool_), Cast(dt.f32, load), Const(0.0, dt.f32))) == dt.f16
    assert exact_low(Cast(dt.f32, load)) == dt.f16
    assert exact_low(Cast(dt.f32, Cast(dt.f32, load))) is None  # an f32 value is not known to be 16-bit
    assert exact_low(Select(Var("c", dt.bool_), Cast(dt.f32, load), Const(1.0, dt.f32))) is None


def test_shared_memory_limit_is_a_clear_error():
    with pytest.raises(UnsupportedPattern, match=r"polyfuse_attn_global_k0 needs \d+ bytes of shared memory"):
        emit(_tiles("attn_global", "prefill", D=4096, Dv=4096), CUDA)


def test_refused_fusion_stays_refused_on_gpus():
    with pytest.raises(NoRepairFound):
        _tiles("quant_gemm_fp8", "default")


# ------------------------------------------------------------------ runtime without a GPU

class RecordingLoader(Loader):
    """A loader that allocates host memory and records launches instead of running them."""

    name = "recording"

    def __init__(self):
        self.launches = []
        self.buffers = []

    def arch(self):
        return "sm_90a"

    def load(self, image):
        return image

    def function(self, module, name, shared):
        return name

    def launch(self, fn, blocks, threads, shared, pointers, sizes, stream=0, maps=()):
        self.launches.append((fn, blocks, threads, shared, len(pointers), tuple(sizes), stream))

    def alloc(self, nbytes):
        buf = np.zeros(max(1, nbytes), np.uint8)
        self.buffers.append(buf)
        return buf.ctypes.data, buf

    def to_device(self, pointer, host, nbytes):
        pass

    def to_host(self, host, pointer, nbytes):
        pass

    def synchronize(self):
        pass


@pytest.fixture()
def decode_kernel(tmp_path):
    # Any split length (Skv = 40: three splits of 16 keys), so that the partial kernel, its
    # global scratch and the combine kernel are all launched.
    source = emit(_tiles("attn_causal", "decode", tuning=GpuTuning(decode_min_split=1)), CUDA)
    image = tmp_path / "k.cubin"
    image.write_bytes(b"")
    loader = RecordingLoader()
    return GpuKernel(source, image, loader), loader


def test_launches_every_kernel_in_order_with_scratch(decode_kernel):
    kernel, loader = decode_kernel
    op = ops.get("attn_causal")
    inputs = op.inputs(0, "decode", op.sizes("decode"), 1.0)
    out = kernel.run(inputs)
    assert set(out) == {"out"} and out["out"].dtype == np.float16
    names = [x[0] for x in loader.launches]
    assert names == [launch.kernel for launch in kernel.kernel_source.launches]
    n_args = len(kernel.kernel_source.args)
    assert all(x[4] == n_args for x in loader.launches)  # inputs, outputs and global scratch
    assert loader.launches[0][1] == 2 * 2 * 1 * 3  # one block per (b, h, i, split)


def test_a_launch_goes_to_the_stream_it_is_given(decode_kernel):
    kernel, loader = decode_kernel
    op = ops.get("attn_causal")
    inputs = op.inputs(0, "decode", op.sizes("decode"), 1.0)
    kernel(*inputs.values())
    kernel.launch(tuple(inputs.values()), {}, stream=1234)
    count = len(kernel.kernel_source.launches)
    assert [x[6] for x in loader.launches] == [0] * count + [1234] * count


class _DeviceArray:
    """An array on the device as another library hands it over (``__cuda_array_interface__``); nothing reads it."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.__cuda_array_interface__ = {"shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "version": 3}


def test_calls_with_device_arrays_are_checked_once_per_shape_and_still_refused_when_wrong(decode_kernel):
    # The checks of a call with arrays on the device are kept per combination of shapes, dtypes and sizes: a second
    # call launches the same, and a call with another shape or dtype is still refused with the argument named.
    kernel, loader = decode_kernel
    op = ops.get("attn_causal")
    inputs = {n: _DeviceArray(a) for n, a in op.inputs(0, "decode", op.sizes("decode"), 1.0).items()}
    outs = [_DeviceArray(np.empty(a.shape, a.dtype.numpy)) for a in kernel.outputs]
    args = [inputs[a.name] for a in kernel.inputs] + outs
    kernel(*args)
    kernel(*args)
    count = len(kernel.kernel_source.launches)
    assert loader.launches[:count] == loader.launches[count:] and len(kernel._calls) == 1
    wrong = _DeviceArray(np.empty((1, 2, 3), np.float16))
    with pytest.raises(LaunchError, match=f"argument '{kernel.inputs[0].name}' has shape"):
        kernel(wrong, *args[1:])
    other = _DeviceArray(args[0].array.astype(np.float32))
    with pytest.raises(LaunchError, match=f"argument '{kernel.inputs[0].name}' has dtype f32"):
        kernel(other, *args[1:])


def test_a_tensor_the_bulk_copies_cannot_map_is_refused_with_its_name(tmp_path):
    # A kernel whose producer brings k and v by bulk tensor copies encodes their maps at launch; a k whose address
    # is not 16-byte aligned (a view one element in) is refused before the driver is asked, naming k.
    source = emit(_tiles("attn_global", "prefill", Sq=256, Skv=384, D=64, Dv=64), CUDA)
    assert {m.tensor for m in source.maps} == {"k", "v"}
    image = tmp_path / "k.cubin"
    image.write_bytes(b"")
    kernel = GpuKernel(source, image, RecordingLoader())
    op = ops.get("attn_global")
    sizes = {**op.sizes("prefill"), "Sq": 256, "Skv": 384, "D": 64, "Dv": 64}
    inputs = op.inputs(0, "prefill", sizes, 1.0)
    k = np.empty(inputs["k"].size + 1, np.float16)[1:].reshape(inputs["k"].shape)
    args = [_DeviceArray(k if a.name == "k" else inputs[a.name]) for a in kernel.inputs]
    outs = [_DeviceArray(np.empty(a.shape, a.dtype.numpy)) for a in kernel.outputs]
    with pytest.raises(LaunchError, match="argument 'k' \\(its bulk tensor copies\\).*multiples of 16"):
        kernel(*args, *outs)


def test_pycuda_launches_on_the_default_stream_of_device_0_only():
    with pytest.raises(LaunchError, match="launches on the default stream only; build with loader='cuda-python'"):
        PyCuda.__new__(PyCuda).launch("fn", 1, 32, 0, [], [], stream=1234)
    with pytest.raises(BackendUnavailable, match="the pycuda loader runs on device 0 only"):
        PyCuda(1)


def test_launch_errors_name_the_argument(decode_kernel):
    kernel, _ = decode_kernel
    op = ops.get("attn_causal")
    inputs = op.inputs(0, "decode", op.sizes("decode"), 1.0)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    with pytest.raises(LaunchError, match="takes 3 input array"):
        kernel(q, k)
    with pytest.raises(LaunchError, match=r"argument 'k' has dtype f32; expected f16"):
        kernel(q, k.astype(np.float32), v)
    with pytest.raises(LaunchError, match=r"argument 'v' has shape"):
        kernel(q, k, v[:, :, :8])
    with pytest.raises(LaunchError, match="'q' is not C-contiguous"):
        kernel(np.asfortranarray(np.repeat(q, 2, axis=3)[..., ::2]), k, v)
    with pytest.raises(LaunchError, match="must be a NumPy array, a CUDA PyTorch tensor"):
        kernel([1, 2], k, v)


def test_independent_blocks_of_an_inner_loop_become_separate_tiles():
    # Rolling variance over row tiles leaves the auxiliary partial sums in one inner loop; fission
    # turns each into a tile reduction instead of a scalar loop run by one thread.
    program = _tiles("variance", "default", options=ROLLING.options, L=4096)
    assert "for j_1 in range" not in str(program)
    assert str(program).count("reduce_sum(") >= 3


def test_exact_16_bit_operands_are_staged_by_cp_async():
    # q, k and v (P is split hi+lo instead): 16 bytes a copy, with no register in between.  Without copies
    # ahead, q (it does not change with the loop) is copied once, at the first iteration, into a buffer of its
    # own; k and v are copied at every iteration; each dot commits its copies and waits for them right before
    # the barrier that publishes its operands.
    text = emit(_tiles("attn_causal", "prefill", tuning=OLD_TILE),
                SHARED_PATH.with_options(stream_ahead=False, refill_tiles=False)).text
    assert "pf_q = *reinterpret_cast<const uint4*>" not in text
    assert text.count("pf::cp_async16(") == 3
    assert re.search(r"if \(j_0 == 0\) \{\s*\{\s*int pf_o = [^;]*;\s*int pf_d = [^;]*;"
                     r"\s*const uint16_t\* pf_p = &q\[[^;]*;"
                     r"\s*#pragma unroll 4\s*for \(int pf_g = pf_tid; pf_g < 32; pf_g \+= 256\) \{"
                     r"[^}]*\{[^}]*pf_src = &pf_p\[0\]", text)
    assert re.search(r"uint16_t\* pf_ta\d+ = pf_keep\d+;", text)
    assert len(re.findall(r"pf::cp_async_commit\(\);\s*pf::cp_async_wait<0>\(\);\s*__syncthreads\(\);", text)) == 2
    assert text.count("cp_async_wait<0>") == 3  # the two dots, and the drain after the loop


def test_varying_tiles_are_copied_one_iteration_ahead():
    # With copies ahead (the default): q and the first iteration's k and v before the loop, one group; at the
    # top of each iteration a wait and a barrier publish its tiles, then the next iteration's k and v are
    # copied into the other halves of their buffers (the loop variable shadowed by the next one) while this
    # one computes.  The dots neither copy nor wait: the first (q·kᵀ) not even a barrier of its own.
    text = emit(_tiles("attn_causal", "prefill", tuning=OLD_TILE), SHARED_PATH).text
    loop = _loop_body(text, "for (int j_0 = 0;")
    before = text[:text.index("for (int j_0 = 0;")]
    assert before.count("pf::cp_async16(") == 3 and loop.count("pf::cp_async16(") == 2
    top = re.match(r"for \(int j_0 = 0; [^{]*\{\s*pf::cp_async_wait<0>\(\);[^\n]*\s*__syncthreads\(\);\s*"
                   r"if \(j_0 \+ 1 < \(i_0 \+ \(1\)\)\) \{\s*const int pf_next = j_0 \+ 1;\s*"
                   r"\{\s*const int j_0 = pf_next;", loop)
    assert top is not None
    halves = re.findall(r"pf::cp_async16\(&\(pf_keep(\d+) \+ \(j_0 & 1\) \* (\d+)\)\[pf_d\]", loop)
    assert len(halves) == 2 and len({k for k, _ in halves}) == 2
    assert loop.count("pf::cp_async_wait") == 1 and loop.count("pf::cp_async_commit") == 1
    qk = _statement(loop, "score")  # q·kᵀ inlined into the score (the ragged last tile's rows computed whole)
    assert "__syncthreads();" not in qk.split("pf::ldmatrix")[0]
    assert re.search(r"uint16_t\* pf_tb\d+ = \(pf_keep\d+ \+ \(j_0 & 1\) \* \d+\);  // copied ahead", qk)
    plan = str(gpu_plan(_tiles("attn_causal", "prefill", tuning=OLD_TILE), SHARED_PATH)[1])
    assert "two halves, the next iteration's copied during this one" in plan and "copied before the loop" in plan


@pytest.mark.parametrize(("keys", "ahead"), [(4096, True), (32768, False)])
def test_tiles_are_copied_ahead_only_where_every_block_still_fits_at_once(keys, ahead):
    # Global decode, 16 heads: at 4096 keys 64 blocks, which fit at once with the second halves of their k and v
    # tiles (2 per SM); at 32768 keys 512 blocks, which would not: the kernel refills one buffer per tile instead
    # (4 blocks per SM: all 512 fit at once), and its plan says why not ahead.
    sizes = {"B": 1, "Hq": 16, "Hkv": 16, "Skv": keys, "D": 64, "Dv": 64}
    text = str(gpu_plan(_tiles("attn_global", "decode", **sizes), CUDA)[1])
    assert ("two halves, the next iteration's copied during this one" in text) == ahead
    assert ("tiles not copied ahead: with their second halves, its 85568 bytes of shared memory would let 2 blocks "
            "per SM run at once, too few for its 512 blocks on 132 SMs" in text) == (not ahead)
    assert ("one buffer, the next iteration's copied after score (its last reader)" in text) == (not ahead)
    assert "not refilled" not in text


def test_tiles_are_refilled_only_where_as_many_blocks_fit():
    # Global decode at batch 32 (2048 blocks, 128-wide heads): one buffer per tile would halve the blocks per SM
    # (2 instead of 4) and the grid does not fit at once either way: its tiles are copied when each iteration
    # needs them, and the plan says why.
    text = str(gpu_plan(_tiles("attn_global", "decode", **ops.get("attn_global").presets["decode_b32"]), CUDA)[1])
    assert ("tiles copied when each iteration needs them, not refilled: with one buffer per tile, its 83776 bytes of "
            "shared memory would let 2 blocks per SM run at once (4 without), and not all its blocks") in text
    assert "one buffer, the next" not in text


def test_refilled_tiles_are_copied_after_their_last_reader_and_waited_for_by_count():
    # Global decode with refills: k and v (and the invariant q, with k) copied before the loop, one group each;
    # k refilled with the next iteration's tile after the score's closing barrier, v after pv's; each dot waits
    # with one group still in flight (the other tile's), then publishes; every refill commits, also at the last
    # iteration, and the loop drains after.  (The row statistics, one group, come between the two products.)
    text = emit(_tiles("attn_global", "decode", B=1, Hq=16, Hkv=16, Skv=32768, D=64, Dv=64), CUDA).text
    loop = _loop_body(text, "for (int j_1 = 0;")
    before, after = text[:text.index(loop)], text[text.index(loop) + len(loop):]
    assert before.count("pf::cp_async_commit();") == 2 and before.count("pf::cp_async16(") == 3
    assert loop.count("pf::cp_async_wait<1>();") == 2 and loop.count("pf::cp_async_commit();") == 2
    score, pv = _statement(loop, "score"), _statement(loop, "pv_rf")
    for text_, tensor in ((score, "k"), (pv, "v")):
        dot, refill = text_.split("// the next iteration's tile")
        assert re.search(r"pf::cp_async_wait<1>\(\);[^\n]*\n\s*__syncthreads\(\);", dot)
        assert "cp_async16" not in dot.split("if (j_1 + 1 < (8))")[0]  # the dot copies nothing itself
        assert re.search(r"__syncthreads\(\);\s*if \(j_1 \+ 1 < \(8\)\) \{\s*const int pf_next = j_1 \+ 1;"
                         r"\s*\{\s*const int j_1 = pf_next;\s*$", dot)
        assert f"&{tensor}[" in refill and refill.rstrip().removesuffix("}").rstrip().endswith("pf::cp_async_commit();")
    assert "pf::cp_async_wait<0>();" in after


@pytest.mark.parametrize(("name", "mode"), [("attn_global", "decode"), ("attn_causal", "decode"),
                                           ("attn_mla_decode", "decode"), ("softmax", "default"),
                                           ("layernorm_stats", "default"), ("attn_causal", "prefill")])
def test_no_barrier_follows_another(name, mode):
    # Two block barriers in a row order nothing the first has not: the printer emits one.  A block reduction
    # of one output (decode's row max and row sum over a key tile) is a scope, not a loop of one round, so its
    # closing barrier is its statement's.
    text = emit(_tiles(name, mode), CUDA).text
    assert not re.search(r"__syncthreads\(\);\s*__syncthreads\(\);", text)
    if mode == "decode" and name != "attn_mla_decode":
        assert "for (int pf_o = 0; pf_o < 1; ++pf_o)" not in text


def test_a_tile_read_by_two_dots_is_refilled_after_the_second():
    # MLA decode: v is the first columns of the kv tile (read in place by pv), so the kv tile is refilled after
    # pv, its last reader; with one refilled tile the score waits for every group.
    text = str(gpu_plan(_tiles("attn_mla_decode", "decode", **ops.get("attn_mla_decode").presets["decode"]), CUDA)[1])
    assert ("the next iteration's copied after pv_rf (its last reader), 0 later copy groups in flight at its first "
            "reader") in text


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["attn_global", "attn_mla_decode", "attn_causal"])
def test_decode_with_tiles_copied_ahead_compiles(name):
    # Decode's key loop at a bench-like size (several tiles per split, a masked last tile for MLA's 40 keys
    # at the test size) with its tiles copied ahead, under -Werror (the shadowed loop variable included).
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    sizes = {"Skv": 1000} if name != "attn_mla_decode" else {"Skv": 1000, "H": 16}
    source = emit(_tiles(name, "decode", **sizes), CUDA)
    assert "// the next iteration's tiles" in source.text
    compile_gpu(source.text, f"ahead_{name}", "cuda", source.target.arch, options=WERROR, compile_only=True)


def test_synchronous_staging_copies_through_registers_when_cp_async_is_off():
    text = emit(_tiles("attn_causal", "prefill", tuning=OLD_TILE),
                SHARED_PATH.with_options(async_staging=False, keep_invariant=False)).text
    assert "cp_async" not in text
    assert text.count("pf_q = *reinterpret_cast<const uint4*>") == 3


def test_mla_reads_its_value_tile_from_its_key_tile():
    # MLA's v is kv[..., :Dv]: the value product reads the key tile the score product copied (rows at its
    # pitch, qk dim 64 + 8), instead of copying the first Dv columns again.
    text = emit(_tiles("attn_mla_decode", "decode", Skv=64), CUDA).text
    assert text.count("// holds this operand (copied for score)") == 1
    assert text.count("pf::cp_async16(") == 3  # q and the first kv tile before the loop, the next kv tile in it
    assert re.search(r"pf::ldmatrix_x2_trans\(pf_fb, &pf_tb\d+\[\(pf_kk \+ pf_lane % 16\) \* 72 \+ pf_nt \* 8\]\)",
                     text)


def test_a_masked_tile_is_not_shared():
    # 40 keys in tiles of 16: the last tile is masked, so the value product copies its own tile.
    text = emit(_tiles("attn_mla_decode", "decode"), CUDA).text
    assert "holds this operand" not in text and text.count("pf::cp_async16(") == 5  # q, k, v; k and v ahead


def test_staging_skips_the_padding_rows_of_a_single_query_row():
    # Decode's one query row is padded to 16 rows for m16n8k16; only the real row is staged (the other
    # rows' results are dropped): q's 128 elements in 16 groups of 8, P's 32 (one row of a 32-key tile),
    # not 16 times as many.  (4 warps: GpuTuning.decode_warps.)
    text = emit(_tiles("attn_global", "decode", B=1, Skv=64, D=128, Dv=128), CUDA).text
    assert "for (int pf_g = pf_tid; pf_g < 16; pf_g += 128)" in text
    assert "for (int pf_e = pf_tid; pf_e < 32; pf_e += 128)" in text
    assert "pf_g < 256;" not in text and "pf_e < 512;" not in text


def _statement(text: str, block: str) -> str:
    """The generated code of one tile statement (from its ``// block`` comment to the next statement's or row
    group's)."""
    import re

    start = text.index(f"// {block}\n")
    end = re.compile(r"^\s*// (\w+|row group: .*)$", re.M).search(text, start + len(block) + 4)
    return text[start:end.start() if end else None]


def test_small_output_dots_are_block_reductions():
    # rmsnorm's Σx² is a 1-output dot over the row: a block reduction with vector loads, not a
    # staging of both operands for one thread's serial loop.
    text = emit(_tiles("rmsnorm_amax", "default", options=ROLLING.options, M=8192), ROLLING).text
    ssq = _statement(text, "s_ssq")
    assert "pf::shfl_xor" in ssq and "uint4" in ssq
    assert "pf_fa" not in ssq and "pf_fb" not in ssq


def test_tensor_core_results_go_in_place_into_padded_rows():
    text = emit(_tiles("attn_causal", "prefill", Sq=256, Skv=256, D=64, Dv=64, tuning=OLD_TILE), SHARED_PATH).text
    # qk and pv_rf are inlined into their readers (polyfuse.tiling.inline): score and pv are
    # computed in the epilogues of their dots and written in place, into rows 64 + 8 words
    # apart (bank-conflict free for the row reductions and the epilogues); no result array.
    code = _statement(text, "score")
    assert "pf::mma_f16" in code and "float* pf_t" not in code.split("tensor cores")[1]
    assert "score[(" in code and "* 72 + x_ax1)] = " in code
    # pv, the rolling accumulator, is updated in registers (polyfuse.emit_cpp.registers).
    assert re.search(r"pf_racc\d+\[pf_nb\]\[pf_q\] = ", _statement(text, "pv"))
    assert "// qk\n" not in text and "// pv_rf\n" not in text
    # Ragged tiles (S = 40): the last tile's rows are computed whole (polyfuse.tiling.pad), so q·kᵀ is inlined
    # into the score there too.
    ragged = emit(_tiles("attn_causal", "prefill", tuning=OLD_TILE), SHARED_PATH).text
    assert "// qk\n" not in ragged and "pf::mma_f16" in _statement(ragged, "score")


def test_rolling_accumulators_stay_in_registers_across_the_loop():
    # pv = pv·h + P·V: each thread keeps its fragment of pv in registers for the whole key loop,
    # read once before it and written back once after it; inside the loop pv is neither read
    # nor written in shared memory.
    text = emit(_tiles("attn_causal", "prefill", Sq=256, Skv=256, D=64, Dv=64, tuning=OLD_TILE), SHARED_PATH).text
    loop = text[text.index("for (int j_0"):text.index("// pv: pv from registers")]
    assert "pv[" not in loop
    assert re.search(r"float pf_racc\d+\[\d\]\[4\] = \{\};  // pv: pv in registers", text)
    after = _statement(text, "pv: pv from registers")
    assert re.search(r"pv\[.*\] = pf_racc\d+\[pf_nb\]\[pf_q\];", after)
    # The GEMM's C likewise; a split decode's partial pv, in global memory, too.
    gemm = emit(_tiles("quant_gemm", "default", M=128, K=256, N=128), CUDA).text
    assert "C_shared from registers" in gemm
    gemm_loop = gemm[gemm.index("for (int k_0"):gemm.index("C_shared from registers")]
    assert "C_shared[" not in gemm_loop


def test_rolling_update_factors_are_read_once_per_fragment_row():
    # The epilogue of a rolling update visits the thread's two fragment rows in turn and reads what the
    # value reads per row (the statistics, the repair factor) once per row into registers: no per-element
    # reads of amax, and quant_gemm's repair t·r/r' is (r/r')·t (each r its surrogate while 0), its ratio
    # computed once per fragment row instead of a division per element, and without a pass of its own
    # through shared memory before the product.
    gemm = emit(_tiles("quant_gemm", "default", M=128, K=256, N=128), CUDA).text
    update = _statement(gemm, "s_gemm")
    epilogue = _epilogue(update)
    element = epilogue[epilogue.index("for (int pf_j = 0"):]
    assert re.search(r"const float pf_row\d+ = \(\(.*amax_prev\[.*\]\) / \(.*amax\[.*\]\)\);", epilogue)
    assert "amax[" not in element and "amax_prev[" not in element and " / " not in element
    assert "pf_e] = (amax_prev[" not in update
    # Attention's running max likewise (in global memory for a split decode's partials).
    mla = _epilogue(_statement(emit(_tiles("attn_mla_decode", "decode", Skv=64), CUDA).text, "pv"))
    per_element = mla[mla.index("for (int pf_j = 0"):]
    assert "row_max[" not in per_element and "row_max[" in mla


def _epilogue(code: str) -> str:
    """The row-by-row epilogue of the tensor-core dot in ``code`` (up to the barrier after it)."""
    start = code.index("for (int pf_h = 0; pf_h < 2; ++pf_h)")
    return code[start:code.index("__syncthreads();", start)]


def test_epilogue_guards_only_padding():
    # 64 × 64 tiles of C: no row or column padding, so the epilogue has no guards; MLA's 2 × 4 query rows
    # (4 heads of a block, padded to 16 for m16n8k16) over Dv = 56 columns (7 tiles of 8) guard the rows only.
    gemm = _epilogue(_statement(emit(_tiles("quant_gemm", "default", M=128, K=256, N=128), CUDA).text, "s_gemm"))
    assert "if (pf_m < " not in gemm and "if (pf_n < " not in gemm
    mla = _epilogue(_statement(emit(_tiles("attn_mla_decode", "decode", Skv=64), CUDA).text, "pv"))
    assert "if (pf_m < 4)" in mla and "if (pf_n < " not in mla


def test_presplit_is_a_kernel_of_its_own_and_can_be_turned_off():
    # quant_gemm's W (read by every row block) is split by a first kernel; the GEMM copies both parts with
    # cp.async into the hi and lo halves of its staged tile, and converts nothing of W itself.
    source = emit(_tiles("quant_gemm", "default", M=128, K=256, N=128), CUDA)
    assert [launch.kernel for launch in source.launches] == ["polyfuse_quant_gemm_split_W", "polyfuse_quant_gemm_k0"]
    assert [a.name for a in source.args][-2:] == ["W_pf_hi", "W_pf_lo"]
    gemm = _statement(source.text, "s_gemm")
    assert re.search(r"pf::cp_async16\(&\(pf_tb\d+ \+ \d+\)\[", gemm) and "W[" not in gemm
    plain = emit(_tiles("quant_gemm", "default", M=128, K=256, N=128), CUDA.with_options(presplit=False))
    assert len(plain.launches) == 1 and "W_pf_hi" not in plain.text and "W[" in _statement(plain.text, "s_gemm")


def _eight_warps() -> Frame:
    """The frame of a CUDA block kernel of eight warps, default options."""
    return Frame({}, 256, 32, True, CodegenOptions())


def test_accumulators_other_statements_read_stay_in_memory():
    from polyfuse.emit_cpp import registers
    from polyfuse.ir.stmt import Loop, Seq
    from polyfuse.tiling.gpu import lower_for_gpu
    from polyfuse.tiling.htile import walk_tile_stmts

    gpu = lower_for_gpu(_tiles("attn_causal", "prefill", Sq=256, Skv=256, D=64, Dv=64))
    loops = [s for s in walk_tile_stmts(gpu.program.body) if isinstance(s, Loop) and s.var.name == "j_0"]
    assert loops and "pv" in registers.plan(_eight_warps(), loops[0], str)
    # A statement of the loop that also reads pv (here: pv again, as a second statement) keeps it in memory.
    body = loops[0].body
    doubled = loops[0].replace(body=Seq((*body.stmts, *(s for s in body.stmts if s.block == "pv"))))
    assert "pv" not in registers.plan(_eight_warps(), doubled, str)


def test_f32_operands_are_split_four_at_a_time():
    # moe_routing's gate product x·w, both f32: each thread reads four neighbours with one 128-bit load,
    # converts them to bf16 hi + lo and stores each part with one 8-byte store.
    text = emit(_tiles("moe_routing", "default", S=64, HD=512), CUDA).text
    gate = _statement(text, "s_gate")
    assert gate.count("float pf_v[4] = {};") == 2
    assert gate.count("reinterpret_cast<uint2*>") == 4  # hi and lo of x and of w
    assert "reinterpret_cast<const uint4*>(&x[" in gate and "reinterpret_cast<const uint4*>(&w[" in gate


def test_one_thread_per_output_reductions_over_few_steps_are_unrolled():
    # A split decode's combine gives each output one thread and sums the splits' partials: unrolled,
    # so that the partials' loads are in flight together.  Block-wide row reductions are not.
    from polyfuse.ops.schedules import DecodeTiling, _attention_decode_gpu
    from polyfuse.transforms.schedule import Schedule

    op = ops.get("attn_mla_decode")
    sch = Schedule(op.program("decode", **op.sizes("decode", {"Skv": 256})))
    _attention_decode_gpu(sch, DecodeTiling(4, 16, 32))  # 8 splits
    sch.compact_buffers()
    text = emit(to_tiles(sch.program), CUDA).text
    combine = text[text.index("// split-k combine folded in"):]
    assert re.search(r"#pragma unroll\n\s*for \(int x_j_0 = \(0\) \* \d; x_j_0 < 8;", combine)
    rows = emit(_tiles("layernorm_stats", "default", M=8192), CUDA).text
    assert not re.search(r"#pragma unroll\n\s*for \(int x_", rows)


def test_min_blocks_asks_for_registers_that_let_blocks_reside():
    # Causal prefill's block takes 62 KB of shared memory at the bench preset: 3 blocks fit on an SM, and
    # the kernel asks for registers that let 3 reside.  Global prefill's 42 KB let 5 reside: it asks nothing.
    for name, asks in (("attn_causal", True), ("attn_global", False)):
        source = emit(_tiles(name, "prefill", tuning=OLD_TILE, **ops.get(name).presets["prefill"]),
                      SHARED_PATH.with_options(stream_ahead=False, refill_tiles=False))
        (launch,) = source.launches
        resident = CUDA.device.blocks_per_sm(launch.shared)
        assert (resident <= CUDA.options.min_blocks) == asks
        assert (f"__launch_bounds__(256, {resident})" in source.text) == asks
    unasked = emit(_tiles("attn_causal", "prefill", tuning=OLD_TILE), SHARED_PATH.with_options(min_blocks=None)).text
    assert "__launch_bounds__(256, " not in unasked


def test_cheap_broadcasts_are_recomputed_not_staged():
    # The causal mask compares two index expressions: recomputed per element, not staged in
    # shared memory behind extra barriers; the costly exp(m_prev - m) is still computed once per row.
    text = emit(_tiles("attn_causal", "prefill", Sq=256, Skv=256, tuning=OLD_TILE), SHARED_PATH).text
    assert "int32_t* pf_" not in _statement(text, "score")
    assert re.search(r"(exp|exp_fast)\(", _statement(text, "pv").split("__syncthreads")[0])


def test_gpu_header_converts_16_bit_floats_with_cvt():
    header = (HEADERS_DIR / "polyfuse_gpu.h").read_text()
    assert "cvt.rn.f16.f32" in header and "cvt.f32.f16" in header and "cvt.rn.bf16.f32" in header


# Sizes without padding (multiples of every tile), where the rolling loops' statistics are row groups;
# MLA's Skv gives four splits and a combine kernel.
ROW_GROUP_CASES = [("attn_mla_decode", "decode", {"H": 16, "Skv": 4096, "Dv": 64, "Drope": 16}),
                   ("attn_causal", "prefill", {"Sq": 128, "Skv": 128}),
                   ("quant_gemm", "default", {"M": 128, "K": 192, "N": 128})]


def _loop_body(text: str, header: str) -> str:
    """The text of the first loop whose header starts with ``header`` (up to its closing brace)."""
    start = text.index(header)
    depth, at = 0, text.index("{", start)
    for k in range(at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return text[start:k + 1]
    raise AssertionError(f"unclosed loop {header!r}")


def test_rolling_statistics_are_one_row_group():
    # The split decode's rolling loop: the saved maximum, the maximum, the row sum of the tile and the
    # rolling row sum are one pass (the row sum moved ahead of the independent value product), 16 lanes per
    # head reducing by shuffles; lane 0 stores after a warp barrier.  Five block barriers per key tile (the
    # first, at its top, publishes the tiles copied ahead) instead of ten, and the product's repair factor is
    # computed per fragment row, not in a pass of its own.  (8 warps of 32 threads: 16 for each of 16 heads.)
    sizes = ROW_GROUP_CASES[0][2]
    eight = GpuTuning(decode_warps=8)
    loop = _loop_body(emit(_tiles("attn_mla_decode", "decode", tuning=eight, **sizes), CUDA).text,
                      "for (int j_1 = 0;")
    assert "// row group: row_max_rf_save, row_max_rf, row_sum_rf_rf, row_sum_rf\n" in loop
    assert loop.index("// row group:") < loop.index("// pv_rf\n")
    group = _statement(loop, "row group: row_max_rf_save, row_max_rf, row_sum_rf_rf, row_sum_rf")
    assert "const int pf_rl = pf_tid % 16, pf_rr = pf_tid / 16;" in group
    assert group.count("pf::shfl_xor(") == 2 and group.count("__syncthreads();") == 1  # the one after it
    assert group.index("pf::syncwarp();") < group.index("if (pf_rl == 0 && pf_rr < 16) {")
    assert loop.count("__syncthreads();") == 5
    assert not re.search(r"pf_t\d+\[pf_e\] = exp\(", loop)
    plain = _loop_body(emit(_tiles("attn_mla_decode", "decode", tuning=eight, **sizes),
                            CUDA.with_options(row_groups=False)).text, "for (int j_1 = 0;")
    assert "// row group" not in plain and plain.count("__syncthreads();") == 10


@pytest.mark.parametrize(("name", "sizes", "rows"), [
    ("attn_global", {"B": 1, "Skv": 4096, "D": 64, "Dv": 64}, "one row"),
    ("attn_softcap", {"Skv": 2048}, "2 rows of ax0")])
def test_few_rows_are_a_row_group_of_a_warp_each(name, sizes, rows):
    # Decode's one query row (two for softcap's pairs of heads): the statistics of a key tile in one pass, a
    # warp per row whose lanes play the block's threads (the same order as the block's reduction, no shared
    # memory): one barrier where the statement-by-statement code has eight or ten.  (The block's warps sharing
    # its tiles: at these sizes the decode rule would split the keys among its warps.)
    tiles = _tiles(name, "decode", tuning=GpuTuning(decode_warp_splits=1), **sizes)
    plan = str(gpu_plan(tiles, CUDA)[1])
    assert f"row group row_max_rf_save, row_max_rf, row_sum_rf_rf, row_sum_rf: {rows}, 32 lanes each" in plan
    loop = _loop_body(emit(tiles, CUDA).text, "for (int j_1 = 0;")
    plain = _loop_body(emit(tiles, CUDA.with_options(row_groups=False)).text, "for (int j_1 = 0;")
    assert plain.count("__syncthreads();") - loop.count("__syncthreads();") >= 7
    # A row kernel's chunk longer than the block has threads (4096 elements rolled in chunks of 2048) keeps the
    # block's reduction; a short row (40) is a group.
    rolled = CUDA.with_options(rows_on_chip=False)
    assert "row group" not in str(gpu_plan(_tiles("softmax", "default", M=4096), rolled)[1])
    assert "row group s_max: one row, 32 lanes each" in str(gpu_plan(_tiles("softmax", "default"), rolled)[1])


def test_row_group_forwards_values_in_registers():
    # Later statements of the group read what earlier ones wrote from registers: the rolling sum reads the
    # new maximum and the saved one without loading them, and each value is stored once, by lane 0.
    sizes = ROW_GROUP_CASES[0][2]
    text = emit(_tiles("attn_mla_decode", "decode", **sizes), CUDA).text
    group = _statement(text, "row group: row_max_rf_save, row_max_rf, row_sum_rf_rf, row_sum_rf")
    compute, stores = group.split("pf::syncwarp();")
    assert "row_max_rf_prev[" not in compute and "row_sum_rf_rf[" not in compute
    # (the split's statistics are read and written in their shared copies across the loop: resident.py)
    assert len(re.findall(r"\bpf_kept_row_max_rf\d+\[", compute)) == 2  # the save and the maximum read it
    for tensor in ("row_max_rf_prev", "pf_kept_row_max_rf\\d+", "row_sum_rf_rf", "pf_kept_row_sum_rf\\d+"):
        assert len(re.findall(rf"\b{tensor}\[[^;]*\] = pf_g\d+;", stores)) == 1


def test_row_groups_stop_at_reads_of_other_rows():
    # A statement that reads another row of a tensor the group writes cannot join it (the row is another
    # lane group's, stored only at the end of the pass); a statement reading its own row can.
    import dataclasses

    from polyfuse.emit_cpp import rows
    from polyfuse.ir.expr import Const
    from polyfuse.tiling.gpu import lower_for_gpu
    from polyfuse.tiling.htile import Slice, TileLoad, TileStore, walk_tile_stmts

    gpu = lower_for_gpu(_tiles("attn_causal", "prefill", **ROW_GROUP_CASES[1][2]))
    stores = {s.block: s for s in walk_tile_stmts(gpu.program.body) if isinstance(s, TileStore)}
    save, rmax = stores["row_max_save"], stores["row_max"]

    def groups(stmts):
        return [list(g.stores) if isinstance(g, rows.RowGroup) else g for g in rows.split(_eight_warps(), stmts)]

    assert groups([save, rmax]) == [[save, rmax]]
    shifted = tuple(dataclasses.replace(i, start=Const(1, i.start.dtype)) if isinstance(i, Slice) else i
                    for i in rmax.index)
    other_row = TileStore("other_row", save.tensor, save.index, TileLoad(rmax.tensor, shifted))
    same_row = TileStore("same_row", save.tensor, save.index, TileLoad(rmax.tensor, rmax.index))
    assert groups([save, rmax, other_row]) == [[save, rmax], [other_row]]
    assert groups([save, rmax, same_row]) == [[save, rmax, same_row]]


@pytest.mark.parametrize(("name", "mode", "sizes"), ROW_GROUP_CASES)
@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_row_groups_compile(name, mode, sizes, backend):
    tool = "nvcc" if backend == "cuda" else "hipcc"
    if shutil.which(tool) is None and not (backend == "hip" and os.path.exists("/opt/rocm/bin/hipcc")):
        pytest.skip(f"needs {tool}")
    source = emit(_tiles(name, mode, backend, **sizes), SHARED_PATH if backend == "cuda" else HIP)
    assert "// row group:" in source.text
    compile_gpu(source.text, f"rows_{name}_{mode}", backend, source.target.arch, options=WERROR, compile_only=True)


MLA_576 = {"H": 16, "Skv": 2048, "Dv": 512, "Drope": 64}
"""MLA decode with DeepSeek's qk dim 576 and few keys: the score's k is long enough to split among warps."""


def _steps(text: str):
    """Each raw staging loop of ``text``: (threads, inner, row stride, its step and its carry, as dicts)."""
    found = []
    pattern = (r"int pf_o = pf_tid \* 8 / (\d+), pf_i = pf_tid \* 8 % \d+;\s*int pf_d = pf_o \* (\d+) \+ pf_i;"
               r"(?:\s*const \w+\* pf_p = [^;]*\+ \(pf_o \* (\d+) \+ pf_i \* (\d+)\);)?"
               r"\s*#pragma unroll \d+\s*for \(int pf_g = pf_tid; pf_g < (\d+); pf_g \+= (\d+)\)")
    for m in re.finditer(pattern, text):
        # The loop's step line and, right after it, its carry line (absent where a row takes whole steps).
        lines = text[text.index("pf_o +=", m.end()):].split("\n", 2)
        step = dict(re.findall(r"(pf_[oidp]) \+= (-?\d+);", lines[0]))
        after = lines[1].strip()
        carry = dict(re.findall(r"(pf_[oidp]) \+= (-?\d+);", after)) if after.startswith("if (pf_i >=") else {}
        inner, stride, so, si, groups, threads = (int(x) if x else None for x in m.groups())
        found.append((inner, stride, so, si, groups, threads, step, carry))
    return found


@pytest.mark.parametrize(("name", "mode", "sizes"), [("attn_mla_decode", "decode", MLA_576),
                                                     ("attn_causal", "prefill", {"Sq": 128, "Skv": 128}),
                                                     ("attn_gqa", "decode", {"Hq": 32, "Hkv": 2, "Skv": 4096})])
def test_stepped_staging_visits_every_group(name, mode, sizes):
    # A raw staging loop steps each thread's place (outer/inner index, offset in the staged array, source
    # offset in the tensor) by constants from one group of eight values to the next: replaying the emitted
    # steps for every thread gives the places the division by the row length would.
    loops = _steps(emit(_tiles(name, mode, **sizes), CUDA).text)
    assert loops and any(so is not None for _, _, so, _, _, _, _, _ in loops)
    for inner, stride, so, si, groups, threads, step, carry in loops:
        for tid in range(threads):
            o, i = tid * 8 // inner, tid * 8 % inner
            d, p = o * stride + i, (o * so + i * si) if so is not None else None
            for g in range(tid, groups, threads):
                assert (o, i, d) == (g * 8 // inner, g * 8 % inner, g * 8 // inner * stride + g * 8 % inner)
                if p is not None:
                    assert p == o * so + i * si
                o, i, d = o + int(step.get("pf_o", 0)), i + int(step.get("pf_i", 0)), d + int(step.get("pf_d", 0))
                p = p + int(step.get("pf_p", 0)) if p is not None else None
                if i >= inner:
                    o, i = o + int(carry.get("pf_o", 0)), i + int(carry.get("pf_i", 0))
                    d += int(carry.get("pf_d", 0))
                    p = p + int(carry.get("pf_p", 0)) if p is not None else None


def test_long_k_score_splits_among_warp_groups():
    # MLA's score (16 heads x 64 keys, k = 576): each warp owns SPLIT_K_TILES 8-key tiles, the warps that
    # cover the 64 keys form a group, and the groups take turns over the k steps; groups past the first
    # leave their partial sums in shared memory, a barrier, and group 0 adds them in group order and runs
    # the epilogue.  The pv product (k = 64 keys) is not split.
    tiles_per_warp = CodegenOptions().split_k_tiles
    text = emit(_tiles("attn_mla_decode", "decode", **MLA_576), CUDA).text
    score = _statement(text, "score")
    units = 8 // tiles_per_warp  # warps covering the 8 key tiles
    groups = 8 // units  # of the 8 warps
    assert f"const int pf_kg = pf_warp / {units};" in score
    assert f"for (int pf_kk = pf_kg * 16; pf_kk < 576; pf_kk += {16 * groups})" in score
    assert f"float pf_c[{tiles_per_warp}][4] = {{}};" in score
    part = score.index("if (pf_kg > 0)")
    assert score.index("__syncthreads();", part) < score.index("if (pf_kg == 0)") < score.index("score[")
    assert "pf_kg" not in _statement(text, "pv_rf")
    assert k_groups(_eight_warps(), 1, 8, 36) == groups
    assert k_groups(_eight_warps(), 1, 8, 8) == 1  # k = 128: not split
    assert k_groups(_eight_warps(), 2, 16, 36) == 1  # enough tiles for every warp


def test_split_statistics_stay_in_shared_memory_across_the_loop():
    # A split's running max and sum (read and written at every key tile, at one index) are read into shared
    # memory once before the rolling loop, used there, and written back once after it; the combine reads them
    # from global memory as before.  Masked accesses (padded test sizes) keep global
    # memory.
    text = emit(_tiles("attn_mla_decode", "decode", **MLA_576), CUDA).text
    partial = text[:text.index("__global__", text.index("__global__") + 1)]  # (MLA's combine: a launch of its own)
    loop = _loop_body(partial, "for (int j_1 = 0;")
    for name in ("row_max_rf", "row_sum_rf"):
        assert f"// {name}: in shared memory across the loop" in partial
        assert not re.search(rf"\b{name}\[", loop) and re.search(rf"\bpf_kept_{name}\d+\[", loop)
        before, after = partial.split(loop)
        assert re.search(rf"pf_kept_{name}\d+\[pf_e\] = {name}\[", before)
        assert re.search(rf"{name}\[[^;]*\] = pf_kept_{name}\d+\[pf_e\];", after)
    padded = emit(_tiles("attn_mla_decode", "decode"), CUDA).text
    assert "in shared memory across the loop" not in padded


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_split_k_and_resident_statistics_compile(backend):
    tool = "nvcc" if backend == "cuda" else "hipcc"
    if shutil.which(tool) is None and not (backend == "hip" and os.path.exists("/opt/rocm/bin/hipcc")):
        pytest.skip(f"needs {tool}")
    source = emit(_tiles("attn_mla_decode", "decode", backend, **MLA_576), CUDA if backend == "cuda" else HIP)
    assert "in shared memory across the loop" in source.text
    assert ("pf_kg" in source.text) == (backend == "cuda")  # (HIP's dots are not tensor-core products)
    compile_gpu(source.text, f"mla576_{backend}", backend, source.target.arch, options=WERROR, compile_only=True)


@pytest.mark.parametrize("finite", [False, True])
def test_split_tensor_core_products_need_finite_inputs(finite):
    """f32 operands split into 16-bit parts make ``0·inf`` or ``inf - inf`` of an infinite input, NaN where the
    program has ±inf: the split lowering is used only where every input it reads is declared finite."""
    from polyfuse.ir import ProgramBuilder, reduce
    from polyfuse.transforms import Schedule

    p = ProgramBuilder("gemm")
    a = p.input("a", (64, 64), "f32", finite=finite)
    b = p.input("b", (64, 64), "f32", finite=finite)
    c = p.output("c", (64, 64), "f32")
    with p.nest("s", i=64, n=64, k=reduce(64)) as (i, n, k):
        c[i, n] = c[i, n] + a[i, k] * b[k, n]
    sch = Schedule(p.build())
    i, n, _ = sch.get_loops("s")
    i0, n0, _, _ = sch.tile([i, n], [32, 32])
    sch.bind(i0, "blockIdx.x")
    sch.bind(n0, "blockIdx.y")
    text = emit(to_tiles(sch.program), CUDA).text
    assert ("pf::mma_bf16" in text) == finite
