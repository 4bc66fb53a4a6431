"""The one pipeline entry: program or schedule → tile program → source → compiled kernel.

Each stage has a name and a text form (``STAGE_ORDER``); :func:`stages` returns them all, for
``polyfuse show --stage`` and for debugging, and :func:`build` runs them to a :class:`Kernel`.
For a GPU target, ``tile`` is the program the GPU emitter lowers (after the GPU tile passes and the
cut into kernels, :mod:`polyfuse.tiling.gpu`) and ``plan`` is its kernel plan
(:mod:`polyfuse.emit_cpp.plan`).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polyfuse.deps.bounds import require_in_bounds
from polyfuse.emit_cpp import CodegenOptions, KernelSource, ProgramPlan, Target, emit, emit_planned, gpu_plan
from polyfuse.errors import BackendUnavailable, PolyfuseError
from polyfuse.ir.stmt import Program
from polyfuse.tiling import to_tiles
from polyfuse.tiling.gpu import GpuProgram
from polyfuse.tiling.htile import TileProgram
from polyfuse.tiling.skip import skip_masked_tiles

if TYPE_CHECKING:
    from polyfuse.runtime.compiler import CompileOptions
    from polyfuse.runtime.kernel import KernelBase
    from polyfuse.runtime.loaders import Loader

STAGE_ORDER = ("program", "tile", "plan", "source", "kernel")


@dataclass(frozen=True)
class Stages:
    """Every stage of one build: the loop program, its tile program, for a GPU target the program cut into
    kernels and their plan, and the generated source."""

    program: Program
    tile: TileProgram
    source: KernelSource
    gpu: GpuProgram | None = None
    plan: ProgramPlan | None = None

    def dump(self, stage: str) -> str:
        if stage == "program":
            return str(self.program)
        if stage == "tile":
            return str(self.gpu if self.gpu is not None else self.tile)
        if stage == "plan":
            if self.plan is None:
                raise PolyfuseError(f"the {self.source.target.backend} backend has no kernel plan; "
                                    f"plans are made for GPU targets (cuda, hip)")
            return str(self.plan)
        if stage == "source":
            return self.source.text
        raise PolyfuseError(f"no stage {stage!r}; stages are {', '.join(STAGE_ORDER[:-1])}")


def _program(program_or_schedule: object) -> Program:
    if isinstance(program_or_schedule, Program):
        return program_or_schedule
    program = getattr(program_or_schedule, "program", None)
    if isinstance(program, Program):
        return program
    raise PolyfuseError(f"build needs a Program or a Schedule, got {type(program_or_schedule).__name__}")


def stages(program_or_schedule: object, target: Target | str = "cpp") -> Stages:
    """Run the pipeline up to the source text.

    The program compiled, after every schedule step, is proven in bounds first: kernels index
    without checks, so an access a transform (or a hand-written program) moved outside its tensor
    is refused here with a witness instead of reading or writing past a buffer.
    """
    program = require_in_bounds(_program(program_or_schedule))
    tile = skip_masked_tiles(to_tiles(program))
    backend = target.backend if isinstance(target, Target) else target
    if backend not in ("cuda", "hip"):
        return Stages(program, tile, emit(tile, target))
    gpu_target = target if isinstance(target, Target) else Target(backend)
    gpu, plan = gpu_plan(tile, gpu_target)
    return Stages(program, tile, emit_planned(gpu, plan, gpu_target), gpu, plan)


@dataclass(frozen=True)
class BuildKey:
    """Everything a kernel object depends on: the program's printed text (the printer round-trips, so equal text
    is an equal program), the resolved target (device and code generator options), the compile options, the
    bound sizes, the loader and the compiler.  :func:`build` returns the kernel it built before for an equal
    key instead of running the pipeline again."""

    program: str
    target: Target | str
    options: CompileOptions
    sizes: tuple[tuple[str, int], ...]
    loader: str | None
    compiler: str


_KERNELS: OrderedDict[BuildKey, KernelBase] = OrderedDict()
KERNELS_KEPT = 64
"""How many kernels :func:`build` keeps in this process (least recently built dropped first)."""


def build(program_or_schedule: object, target: Target | str = "cpp", *,
          sizes: Mapping[str, int] | None = None, fp_contract: bool = False, werror: bool = False,
          loader: str | None = None, codegen: CodegenOptions | None = None) -> KernelBase:
    """Compile ``program_or_schedule`` (a Program, or a Schedule's program) into a callable kernel.

    ``target`` is ``cpp`` (a :class:`~polyfuse.runtime.Kernel`), ``cuda`` or ``hip`` (a
    :class:`~polyfuse.runtime.gpu.GpuKernel`, built for device 0 as its driver describes it,
    :meth:`~polyfuse.runtime.loaders.Loader.device_spec`, where ``target`` is a backend name; ``loader``
    picks ``pycuda`` or ``cuda-python``).  ``sizes`` binds size parameters once (a call may still
    override them).  ``fp_contract`` lets the compiler fuse multiply-adds (one rounding fewer each;
    off by default, so that the kernel rounds where the interpreters do), ``werror`` makes compiler
    warnings errors (see :class:`~polyfuse.runtime.compiler.CompileOptions`).  ``codegen`` sets the GPU code
    generator's options (:class:`~polyfuse.emit_cpp.options.CodegenOptions`; default: the target's).

    An equal program built again for the same target and options in this process returns the same kernel
    object (:class:`BuildKey`); across processes the compiled code comes from the on-disk cache
    (:mod:`polyfuse.runtime.cache`).
    """
    from polyfuse.runtime.compiler import CompileOptions

    options = CompileOptions(fp_contract=fp_contract, werror=werror)
    backend = target.backend if isinstance(target, Target) else target
    if backend == "cpp":
        from polyfuse.runtime.compiler import compiler

        key = _key(program_or_schedule, target, options, sizes, loader, compiler())
        return _cached(key, lambda: _build_host(program_or_schedule, target, options, sizes))
    if backend in ("cuda", "hip"):
        from polyfuse.runtime.gpu_compiler import hipcc, nvcc
        from polyfuse.runtime.loaders import loader as get_loader

        driver = get_loader(backend, loader)
        if not isinstance(target, Target):
            target = Target(backend, driver.device_spec())
        if codegen is not None:
            target = dataclasses.replace(target, options=codegen)
        key = _key(program_or_schedule, target, options, sizes, loader, nvcc() if backend == "cuda" else hipcc())
        return _cached(key, lambda: _build_gpu(program_or_schedule, target, options, sizes, driver))
    raise BackendUnavailable(f"no runtime for backend {backend!r}; backends are cpp, cuda, hip")


def _key(program_or_schedule: object, target: Target | str, options: CompileOptions, sizes: Mapping[str, int] | None,
         loader: str | None, compiler: str) -> BuildKey:
    return BuildKey(str(_program(program_or_schedule)), target, options, tuple(sorted((sizes or {}).items())),
                    loader, compiler)


def _cached(key: BuildKey, make: Callable[[], KernelBase]) -> KernelBase:
    """The kernel built before for ``key``, else ``make()`` remembered (the oldest beyond KERNELS_KEPT dropped)."""
    if key in _KERNELS:
        _KERNELS.move_to_end(key)
        return _KERNELS[key]
    kernel = _KERNELS[key] = make()
    while len(_KERNELS) > KERNELS_KEPT:
        _KERNELS.popitem(last=False)
    return kernel


def _build_host(program_or_schedule: object, target: Target | str, options: CompileOptions,
                sizes: Mapping[str, int] | None) -> KernelBase:
    from polyfuse.runtime import Kernel, compile_host
    from polyfuse.runtime.cache import load_rebuilding

    built = stages(program_or_schedule, target)
    return load_rebuilding(lambda: compile_host(built.source.text, built.source.entry, options=options),
                           lambda library: Kernel(built.source, library, sizes, options))


def _build_gpu(program_or_schedule: object, target: Target, options: CompileOptions,
               sizes: Mapping[str, int] | None, driver: Loader) -> KernelBase:
    from polyfuse.runtime.gpu import GpuKernel
    from polyfuse.runtime.gpu_compiler import compile_gpu

    built = stages(program_or_schedule, target)
    image = compile_gpu(built.source.text, built.source.entry, target.backend, target.arch, options=options)
    assert image is not None
    return GpuKernel(built.source, image, driver, sizes, options)
