"""What a GPU can do, in one object: the facts that code generation and default schedules read.

A :class:`DeviceSpec` holds the numbers that decide tile sizes, splits, shared-memory layouts and which
instruction families exist (warp size, SMs, shared memory per SM and per block, registers, cp.async /
TMA / wgmma / mma.sync / MFMA).  They come from the device where one is present
(:meth:`polyfuse.runtime.loaders.Loader.device_spec` reads the driver's attributes over the preset of the
device's architecture) and from :data:`PRESETS` otherwise, so that sources emitted on a machine without a
GPU are those the GPU machine would build for the same architecture.  Nothing else in polyfuse holds a
hardware number: schedules and emitters take a ``DeviceSpec``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from polyfuse.errors import PolyfuseError


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU architecture (or one device of it): the facts code generation depends on.

    ``shared_per_block`` is the most dynamic shared memory one block may opt into, ``shared_reserved``
    what the runtime reserves per resident block besides (1 KB on NVIDIA since sm_80), so that
    ``shared_per_sm // (bytes + shared_reserved)`` blocks of ``bytes`` fit on one SM.  ``source`` says
    where the numbers come from (a preset, or the device that was queried).
    """

    arch: str
    vendor: str
    warp_size: int
    sms: int
    shared_per_sm: int
    shared_per_block: int
    shared_reserved: int
    registers_per_sm: int
    max_threads_per_block: int = 1024
    threads_per_sm: int = 2048
    """Most threads resident on one SM (2048 on sm_80/sm_90 and on CDNA's 32 wavefronts of 64)."""
    mma_sync: bool = False
    cp_async: bool = False
    tma: bool = False
    wgmma: bool = False
    mfma: bool = False
    default_warps: int = 8
    """Warps of a block kernel unless a schedule (``warps`` annotation) or the options say otherwise."""
    l2_bytes: int = 0
    """The L2 cache (per die where a device has several L2s); 0: unknown."""
    source: str = "preset"

    def blocks_per_sm(self, shared_bytes: int) -> int:
        """How many blocks of ``shared_bytes`` of shared memory fit on one SM (by shared memory alone)."""
        return self.shared_per_sm // max(1, shared_bytes + self.shared_reserved)  # (none at all: no bound)

    def resident_blocks(self, shared_bytes: int, threads: int) -> int:
        """How many blocks of ``threads`` threads and ``shared_bytes`` of shared memory reside on one SM at once
        (by shared memory and threads; at least 1)."""
        return max(1, min(self.blocks_per_sm(shared_bytes), self.threads_per_sm // max(1, threads)))

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(f for f in ("mma_sync", "cp_async", "tma", "wgmma", "mfma") if getattr(self, f))

    def describe(self) -> str:
        """One line: the architecture, its numbers and its instruction families."""
        return (f"{self.arch} ({self.vendor}, {self.source}): {self.sms} SMs, warp {self.warp_size}, "
                f"shared {self.shared_per_block} B per block / {self.shared_per_sm} B per SM "
                f"(+{self.shared_reserved} B reserved per block), {self.registers_per_sm} registers per SM, "
                + (f"{self.l2_bytes // 2**20} MB of L2, " if self.l2_bytes else "") +
                f"{self.default_warps} warps per block by default; "
                f"{', '.join(_SHOWN[f] for f in self.features) or 'no tensor-core or async-copy instructions'}")


_SHOWN = {"mma_sync": "mma.sync", "cp_async": "cp.async", "tma": "TMA", "wgmma": "wgmma", "mfma": "MFMA"}


_NVIDIA = dict(vendor="nvidia", warp_size=32, shared_reserved=1024, registers_per_sm=65536, mma_sync=True,
               cp_async=True, default_warps=8)
_AMD = dict(vendor="amd", warp_size=64, shared_reserved=0, registers_per_sm=131072, mfma=True, default_warps=4)

PRESETS: dict[str, DeviceSpec] = {
    # A100 (SXM): 108 SMs, 164 KB of shared memory per SM, 163 KB per block.
    "sm_80": DeviceSpec("sm_80", sms=108, shared_per_sm=167936, shared_per_block=166912, l2_bytes=40 << 20,
                        **_NVIDIA),
    # L40 / RTX 4090 class: 100 KB per SM, 99 KB per block, 72 MB of L2 (the 4090's; the L40's 96).
    "sm_89": DeviceSpec("sm_89", sms=142, shared_per_sm=102400, shared_per_block=101376, l2_bytes=72 << 20,
                        **_NVIDIA),
    # H100 / H200 (SXM): 132 SMs, 228 KB per SM, 227 KB per block, 50 MB of L2; TMA and wgmma (sm_90a).
    "sm_90a": DeviceSpec("sm_90a", sms=132, shared_per_sm=233472, shared_per_block=232448, l2_bytes=50 << 20,
                         tma=True, wgmma=True, **_NVIDIA),
    # MI210 / one MI250X die: 104 CUs, 64 KB of LDS per CU and per workgroup, wavefronts of 64, 8 MB of L2.
    "gfx90a": DeviceSpec("gfx90a", sms=104, shared_per_sm=65536, shared_per_block=65536, l2_bytes=8 << 20, **_AMD),
    # MI300X: 304 CUs; 4 MB of L2 per XCD (eight of them, before the Infinity Cache).
    "gfx942": DeviceSpec("gfx942", sms=304, shared_per_sm=65536, shared_per_block=65536, l2_bytes=4 << 20, **_AMD),
}
DEFAULT_ARCH = {"cuda": "sm_90a", "hip": "gfx90a"}
"""The architecture a backend's sources are emitted for where no device says otherwise."""


def preset(arch: str) -> DeviceSpec:
    """The preset of ``arch`` (``sm_90`` is read as ``sm_90a``; an unknown ``sm_XY`` takes the nearest lower
    NVIDIA preset's numbers, without the instruction families it may lack)."""
    if arch in PRESETS:
        return PRESETS[arch]
    if arch == "sm_90":
        return PRESETS["sm_90a"]
    version = _sm_version(arch)
    if version is not None and version >= 80:
        versions = {k: v for k in PRESETS if (v := _sm_version(k)) is not None and v <= version}
        base = PRESETS[max(versions, key=versions.__getitem__)]
        return dataclasses.replace(base, arch=arch, tma=False, wgmma=False, source=f"preset {base.arch}")
    raise PolyfuseError(f"no device preset for architecture {arch!r}; presets are {', '.join(PRESETS)}. "
                        f"Build on the device itself (its attributes are read) or pass a DeviceSpec")


def _sm_version(arch: str) -> int | None:
    """The compute capability of an NVIDIA architecture as one number (``sm_86``: 86, ``sm_100a``: 100)."""
    match = re.fullmatch(r"sm_(\d+)[af]?", arch)
    return int(match.group(1)) if match else None


def for_backend(backend: str) -> DeviceSpec:
    """The default device of a GPU backend (``cuda``: sm_90a, ``hip``: gfx90a)."""
    if backend not in DEFAULT_ARCH:
        raise PolyfuseError(f"backend {backend!r} has no GPU device; GPU backends are {', '.join(DEFAULT_ARCH)}")
    return PRESETS[DEFAULT_ARCH[backend]]
