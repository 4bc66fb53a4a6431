"""The device description: presets, what the drivers report, and the GPU schedules that read it.

No GPU is needed: the drivers are fakes that answer the queries :meth:`Loader.device_spec` makes (cuda-python
as a module, pycuda and hip-python as the objects a loader holds), so that a spec is checked field by field
against what the fake device reports, and the preset's numbers where it reports nothing.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from polyfuse import ops
from polyfuse.device import PRESETS, for_backend, preset
from polyfuse.errors import BackendUnavailable, PolyfuseError
from polyfuse.ir.stmt import Loop, Seq
from polyfuse.ops.gpu_tuning import GpuTuning
from polyfuse.ops.schedules import DecodeTiling, default_schedule, gpu_decode_tiling, gpu_performer_tiling
from polyfuse.runtime.loaders import CudaPython, HipPython, PyCuda
from polyfuse.transforms.tree import loops_of

# ------------------------------------------------------------------ presets


def test_presets_are_named_by_their_architecture_and_vendor():
    for arch, spec in PRESETS.items():
        assert spec.arch == arch and spec.source == "preset"
        assert (spec.vendor, spec.warp_size, spec.mfma) == (("amd", 64, True) if arch.startswith("gfx")
                                                           else ("nvidia", 32, False))
        assert spec.shared_per_block <= spec.shared_per_sm
    assert PRESETS["sm_90a"].features == ("mma_sync", "cp_async", "tma", "wgmma")
    assert (for_backend("cuda"), for_backend("hip")) == (PRESETS["sm_90a"], PRESETS["gfx90a"])
    assert PRESETS["sm_90a"].describe().startswith("sm_90a (nvidia, preset): 132 SMs, warp 32")


def test_sm_90_is_read_as_sm_90a_and_a_newer_sm_takes_the_nearest_lower_preset():
    assert preset("sm_90") is PRESETS["sm_90a"]
    sm_86 = preset("sm_86")
    assert sm_86 == dataclasses.replace(PRESETS["sm_80"], arch="sm_86", source="preset sm_80")
    sm_100 = preset("sm_100")  # no preset: sm_90a's numbers, without the instructions it may lack
    assert (sm_100.sms, sm_100.tma, sm_100.wgmma, sm_100.mma_sync) == (132, False, False, True)


@pytest.mark.parametrize("arch", ["sm_75", "gfx1100", "ampere"])
def test_an_architecture_without_a_preset_is_refused_by_name(arch):
    with pytest.raises(PolyfuseError, match=rf"no device preset for architecture '{arch}'; presets are sm_80, "):
        preset(arch)


def test_a_backend_without_a_gpu_has_no_device():
    with pytest.raises(PolyfuseError, match="backend 'cpp' has no GPU device; GPU backends are cuda, hip"):
        for_backend("cpp")


def test_blocks_per_sm_counts_the_reserve_of_each_block():
    # sm_90a: 228 KB per SM, 1 KB reserved per block; gfx90a: 64 KB per CU, nothing reserved.
    assert PRESETS["sm_90a"].blocks_per_sm(39168) == 233472 // (39168 + 1024) == 5
    assert PRESETS["sm_90a"].blocks_per_sm(116 * 1024) == 1  # 2 × (116 + 1) KB > 228 KB
    assert PRESETS["gfx90a"].blocks_per_sm(32 * 1024) == 2
    assert PRESETS["gfx90a"].blocks_per_sm(65536 + 1) == 0


# ------------------------------------------------------------------ what the drivers report

H100_PCIE = {"MULTIPROCESSOR_COUNT": 114, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472,
             "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024,
             "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536, "WARP_SIZE": 32, "MAX_THREADS_PER_BLOCK": 1024,
             "COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0}


def fake_cuda_python(attributes: dict[str, int], name: bytes, failing: tuple[str, ...] = ()) -> types.ModuleType:
    """A ``cuda.bindings.driver`` whose device 0 reports ``attributes`` (``failing`` ones return an error)."""
    driver = types.ModuleType("cuda.bindings.driver")
    driver.CUdevice_attribute = types.SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{k}": k for k in attributes})
    driver.queries = []
    driver.cuInit = lambda flags: (0,)
    driver.cuDeviceGetCount = lambda: (0, 1)
    driver.cuDeviceGet = lambda ordinal: (0, ordinal)
    driver.cuDevicePrimaryCtxRetain = lambda device: (0, "context")
    driver.cuCtxSetCurrent = lambda context: (0,)
    driver.cuGetErrorString = lambda err: (0, b"invalid value")

    def get_attribute(attr, device):
        driver.queries.append(attr)
        return (1, 0) if attr in failing else (0, attributes[attr])

    driver.cuDeviceGetAttribute = get_attribute
    driver.cuDeviceGetName = lambda length, device: (0, name.ljust(length, b"\0"))
    return driver


@pytest.fixture()
def cuda_python(monkeypatch):
    """Install a fake cuda-python driver; returns a function that makes a CudaPython loader over one."""
    def install(attributes: dict[str, int], name: bytes = b"NVIDIA H100 PCIe", failing: tuple[str, ...] = ()):
        driver = fake_cuda_python(attributes, name, failing)
        bindings = types.ModuleType("cuda.bindings")
        bindings.driver = driver
        package = types.ModuleType("cuda")
        package.bindings = bindings
        for module_name, module in (("cuda", package), ("cuda.bindings", bindings), ("cuda.bindings.driver", driver)):
            monkeypatch.setitem(sys.modules, module_name, module)
        return CudaPython(), driver
    return install


def test_cuda_python_device_spec_is_the_preset_with_the_reported_numbers(cuda_python):
    loader, driver = cuda_python(H100_PCIE)
    spec = loader.device_spec()
    assert spec == dataclasses.replace(PRESETS["sm_90a"], sms=114, source="device 0: NVIDIA H100 PCIe")
    queries = len(driver.queries)
    assert loader.device_spec() is spec and len(driver.queries) == queries  # asked once per loader


def test_cuda_python_attributes_that_are_missing_or_fail_keep_the_preset(cuda_python):
    # An L4 (sm_89) whose binding lacks the reserve attribute and whose driver fails the register query.
    reported = {**H100_PCIE, "MULTIPROCESSOR_COUNT": 58, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 102400,
                "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 101376, "COMPUTE_CAPABILITY_MINOR": 9,
                "COMPUTE_CAPABILITY_MAJOR": 8}
    del reported["RESERVED_SHARED_MEMORY_PER_BLOCK"]
    loader, _ = cuda_python(reported, b"NVIDIA L4", failing=("MAX_REGISTERS_PER_MULTIPROCESSOR",))
    spec = loader.device_spec()
    assert spec == dataclasses.replace(PRESETS["sm_89"], sms=58, source="device 0: NVIDIA L4")
    assert (spec.shared_reserved, spec.registers_per_sm) == (1024, 65536)  # the preset's


def test_a_device_of_an_architecture_without_a_preset_is_refused_by_name(cuda_python):
    loader, _ = cuda_python({**H100_PCIE, "COMPUTE_CAPABILITY_MAJOR": 7, "COMPUTE_CAPABILITY_MINOR": 5})
    with pytest.raises(BackendUnavailable, match=r"device 0 \(NVIDIA H100 PCIe\) is sm_75, an architecture polyfuse "
                                                 r"has no preset for \(presets are sm_80, "):
        loader.device_spec()


def test_pycuda_device_spec():
    class Device:
        def compute_capability(self):
            return (8, 0)

        def get_attribute(self, attr):
            return {"MULTIPROCESSOR_COUNT": 56, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 166912, "WARP_SIZE": 32}[attr]

        def name(self):
            return "NVIDIA A30"

    loader = PyCuda.__new__(PyCuda)  # the loader's state without opening a device
    reported = ("MULTIPROCESSOR_COUNT", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "WARP_SIZE")  # this pycuda knows no more
    loader.drv = types.SimpleNamespace(Error=RuntimeError,
                                       device_attribute=types.SimpleNamespace(**{a: a for a in reported}))
    loader.device = Device()
    assert loader.device_spec() == dataclasses.replace(PRESETS["sm_80"], sms=56, source="device 0: NVIDIA A30")


def test_hip_python_device_spec():
    class Props:
        multiProcessorCount = 110
        maxSharedMemoryPerMultiProcessor = 65536
        sharedMemPerBlock = 65536
        regsPerMultiprocessor = 0  # not filled in by this runtime: the preset's number stays
        warpSize = 64
        maxThreadsPerBlock = 1024
        name = b"AMD Instinct MI250X\0\0\0"
        gcnArchName = b"gfx90a:sramecc+:xnack-"

    loader = HipPython.__new__(HipPython)
    loader.hip = types.SimpleNamespace(hipDeviceProp_t=Props, hipGetDeviceProperties=lambda props, device: (0,))
    spec = loader.device_spec()
    assert spec == dataclasses.replace(PRESETS["gfx90a"], sms=110, source="device 0: AMD Instinct MI250X")
    assert spec.registers_per_sm == PRESETS["gfx90a"].registers_per_sm


# ------------------------------------------------------------------ schedules for a device, with a tuning


def test_hip_decode_schedule_uses_the_gfx90a_numbers():
    # gfx90a: 104 CUs, 64 KB per CU, nothing reserved.  GQA decode's block (a 128-key tile and 16 query rows of
    # 128 + 8 halves, 39 KB) fits once per CU: 2 waves of 104 blocks over 8 head groups ask for 26 splits, lowered
    # to 16 (a divisor of the 256 tiles), whose 128 blocks fill 62% of their second wave; 32 splits fill 82% of
    # their third, and the wave rule takes them.  On sm_90a five such blocks fit per SM, and 1056 blocks ask for 32.
    gfx90a = PRESETS["gfx90a"]
    assert gfx90a.blocks_per_sm((128 + 16) * (128 + 8) * 2) == 1
    assert gpu_decode_tiling(1, 64, 8, 32768, 128, device=gfx90a) == DecodeTiling(8, 128, 1024, warps=4)
    assert gpu_decode_tiling(1, 64, 8, 32768, 128, device=gfx90a,
                             tuning=GpuTuning(decode_wave_gain=100)) == DecodeTiling(8, 128, 2048, warps=4)
    assert gpu_decode_tiling(1, 64, 8, 32768, 128) == DecodeTiling(8, 128, 1024, warps=4)
    op = ops.get("attn_gqa")
    program = op.program("decode", **op.presets["decode"])
    # The default schedule's kernel with 128-key tiles, planned for gfx90a, takes more than its 64 KB per block
    # (67 KB with the partial results and staging): the schedule halves the tiles (GpuTuning.smaller), and with
    # 64-key tiles the split rule asks for 32 splits of 16 steps.
    for target, splits, steps, tile in (("hip", 32, 16, 64), ("cuda", 32, 8, 128)):
        loops = {lp.var.name: int(lp.extent.value) for lp in loops_of(default_schedule(
            "attn_gqa", "decode", program, target=target).program, "qk")}  # type: ignore[attr-defined]
        assert (loops["j_0"], loops["j_1"], loops["j_2"]) == (splits, steps, tile), target
    # MLA: a 64-key tile and 16 query rows of 584 halves (91 KB) exceed a gfx90a block's 64 KB: 32 keys per tile.
    assert gpu_decode_tiling(1, 128, 1, 32768, 576, device=gfx90a).tile == 32
    assert gpu_decode_tiling(1, 128, 1, 32768, 576).tile == 64


def test_performer_split_aims_at_the_device_sms():
    # One block per SM over 8 heads: 17 splits on sm_90a's 132 SMs and 38 on gfx942's 304, both capped at 16 by
    # the 256 keys a split must have; 4 on a part of 32 SMs, and 8 when two blocks per SM are asked for.
    assert gpu_performer_tiling(1, 8, 4096).splits(4096) == 16
    assert gpu_performer_tiling(1, 8, 4096, device=PRESETS["gfx942"]).splits(4096) == 16
    few = dataclasses.replace(PRESETS["sm_80"], sms=32)
    assert gpu_performer_tiling(1, 8, 4096, device=few).splits(4096) == 4
    assert gpu_performer_tiling(1, 8, 4096, device=few, tuning=GpuTuning(performer_blocks_per_sm=2)).splits(4096) == 8


@pytest.mark.parametrize(("name", "mode", "sizes", "kernels"), [
    ("attn_gqa", "decode", {"Hq": 8, "Hkv": 2, "Skv": 80}, 2),  # split-k: the partial and the combine kernel
    ("softmax", "default", {}, 1),
    ("performer", "default", {"L": 100}, 3),                    # key side split-k, then the query tiles
])
def test_warps_of_the_tuning_annotate_every_kernel(name, mode, sizes, kernels):
    from polyfuse.tiling import to_tiles
    from polyfuse.tiling.grid import partition

    op = ops.get(name)
    program = op.program(mode, **{**op.sizes(mode), **sizes})
    tuning = GpuTuning(warps=4, decode_min_split=16, performer_min_split=16)
    sch = default_schedule(name, mode, program, target="cuda", tuning=tuning)
    body = sch.program.body
    top = body.stmts if isinstance(body, Seq) else (body,)
    assert all(("warps", 4) in s.annotations for s in top if isinstance(s, Loop))
    assert "sch.warps(" in sch.trace.python()
    nests = partition(to_tiles(sch.program))[1]
    assert [n.warps for n in nests] == [4] * kernels
    plain = default_schedule(name, mode, program, target="cuda", tuning=dataclasses.replace(tuning, warps=None))
    # Without the tuning's warps only decode asks for some: its own (GpuTuning.decode_warps).
    assert ("sch.warps(" in plain.trace.python()) == (mode == "decode")


@pytest.mark.parametrize(("changes", "message"), [
    ({"decode_heads": 0}, r"GpuTuning.decode_heads = 0: must be a positive integer \(default 16\)"),
    ({"gemm_tile": (64, 128)}, r"GpuTuning.gemm_tile = \(64, 128\): must be a tuple of 3 positive integers"),
    ({"warps": 2.5}, r"GpuTuning.warps = 2.5: must be a positive integer"),
])
def test_a_tuning_with_a_bad_knob_is_refused_by_name(changes, message):
    with pytest.raises(PolyfuseError, match=message):
        GpuTuning(**changes)

