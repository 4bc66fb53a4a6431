"""The one pipeline entry: program or schedule → tile program → source → compiled kernel.

Each stage has a name and a text form (``STAGE_ORDER``); :func:`stages` returns them all, for
``polyfuse show --stage`` and for debugging, and :func:`build` runs them to a :class:`Kernel`.
For a GPU target, ``tile`` is the program the GPU emitter lowers (after the GPU tile passes and the
cut into kernels, :mod:`polyfuse.tiling.gpu`) and ``plan`` is its kernel plan
(:mod:`polyfuse.emit_cpp.plan`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from polyfuse.deps.bounds import require_in_bounds
from polyfuse.emit_cpp import CodegenOptions, KernelSource, ProgramPlan, Target, emit, emit_planned, gpu_plan
from polyfuse.errors import BackendUnavailable, PolyfuseError
from polyfuse.ir.stmt import Program
from polyfuse.tiling import to_tiles
from polyfuse.tiling.gpu import GpuProgram
from polyfuse.tiling.htile import TileProgram
from polyfuse.tiling.skip import skip_masked_tiles

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


def build(program_or_schedule: object, target: Target | str = "cpp", *,
          sizes: Mapping[str, int] | None = None, fp_contract: bool = False, werror: bool = False,
          loader: str | None = None, codegen: CodegenOptions | None = None):
    """Compile ``program_or_schedule`` (a Program, or a Schedule's program) into a callable kernel.

    ``target`` is ``cpp`` (a :class:`~polyfuse.runtime.Kernel`), ``cuda`` or ``hip`` (a
    :class:`~polyfuse.runtime.gpu.GpuKernel`, built for device 0 as its driver describes it,
    :meth:`~polyfuse.runtime.loaders.Loader.device_spec`, where ``target`` is a backend name; ``loader``
    picks ``pycuda`` or ``cuda-python``).  ``sizes`` binds size parameters once (a call may still
    override them).  ``fp_contract`` lets the compiler fuse multiply-adds (one rounding fewer each;
    off by default, so that the kernel rounds where the interpreters do), ``werror`` makes compiler
    warnings errors (see :class:`~polyfuse.runtime.compiler.CompileOptions`).  ``codegen`` sets the GPU code
    generator's options (:class:`~polyfuse.emit_cpp.options.CodegenOptions`; default: the target's).
    """
    from polyfuse.runtime.compiler import CompileOptions

    options = CompileOptions(fp_contract=fp_contract, werror=werror)
    backend = target.backend if isinstance(target, Target) else target
    if backend == "cpp":
        from polyfuse.runtime import Kernel, compile_host

        built = stages(program_or_schedule, target)
        library = compile_host(built.source.text, built.source.entry, options=options)
        return Kernel(built.source, library, sizes, options)
    if backend in ("cuda", "hip"):
        from polyfuse.runtime.gpu import GpuKernel
        from polyfuse.runtime.gpu_compiler import compile_gpu
        from polyfuse.runtime.loaders import loader as get_loader

        driver = get_loader(backend, loader)
        if not isinstance(target, Target):
            target = Target(backend, driver.device_spec())
        if codegen is not None:
            target = dataclasses.replace(target, options=codegen)
        built = stages(program_or_schedule, target)
        image = compile_gpu(built.source.text, built.source.entry, backend, target.arch, options=options)
        assert image is not None
        return GpuKernel(built.source, image, driver, sizes, options)
    raise BackendUnavailable(f"no runtime for backend {backend!r}; backends are cpp, cuda, hip")
