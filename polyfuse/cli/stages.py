"""What the command can do with a catalog operator: print it at a stage, run it on a backend.

Each stage is one entry of :data:`STAGES` (``Subject -> source text``) and each backend one
entry of :data:`BACKENDS` (``Subject, inputs -> outputs``).  A name listed in
:data:`STAGE_NAMES` or :data:`BACKEND_NAMES` without an entry is reported as not available
yet (exit 4); later pipeline stages become available by adding their entry here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from polyfuse import ops
from polyfuse.device import DeviceSpec
from polyfuse.errors import PolyfuseError
from polyfuse.ir import interpret
from polyfuse.ir.stmt import Program
from polyfuse.ops.base import Arrays, Comparison, Operator, Sizes
from polyfuse.ops.schedules import default_schedule
from polyfuse.transforms.schedule import Schedule

STAGE_NAMES = ("plain", "fused", "tile", "plan", "cpp", "cuda", "hip")
BACKEND_NAMES = ("interp", "fused", "tile", "cpp", "cuda", "hip")


class NotAvailable(PolyfuseError):
    """A stage, backend or command that this version of polyfuse does not provide yet."""


@dataclass(frozen=True)
class Subject:
    """A catalog operator at one mode and one set of sizes: what every stage and backend works on."""

    op: Operator
    mode: str
    sizes: Sizes

    @classmethod
    def of(cls, name: str, mode: str | None, overrides: Mapping[str, int]) -> Subject:
        op = ops.get(name)
        resolved = op.mode_or_default(mode)
        return cls(op, resolved, op.sizes(resolved, overrides))

    def program(self) -> Program:
        return self.op.program(self.mode, **self.sizes)

    def schedule(self, target: str = "cpp", device: DeviceSpec | None = None) -> Schedule:
        """The operator's default fused schedule for ``target`` (NoRepairFound / IllegalTransform if it cannot fuse),
        for ``device`` on a GPU target (default: the backend's preset)."""
        return _scheduled(self.op.name, self.mode, tuple(sorted(self.sizes.items())), target, device)

    def host_schedule(self) -> Schedule:
        """The default host schedule of the operator's generic program (:meth:`Operator.generic_program`): its
        ``symbolic`` sizes are size parameters, so the kernel compiled from it serves every value of them."""
        return self.generic_schedule("cpp")

    def generic_schedule(self, target: str, device: DeviceSpec | None = None) -> Schedule:
        """The default schedule for ``target`` (and ``device``, on a GPU) of the operator's generic program for
        ``target`` (:meth:`Operator.generic_program`): the kernel compiled from it serves every value of the sizes
        it takes as parameters (``symbolic`` on the host, ``gpu_symbolic`` on a GPU)."""
        static = self.op.static_sizes(self.mode, self.sizes, target)
        return _generic(self.op.name, self.mode, tuple(sorted(static.items())), target, device)

    def symbolic_sizes(self, target: str = "cpp") -> Sizes:
        """The values of the sizes that ``target``'s kernel takes as parameters."""
        names = self.op.symbolic_sizes(self.mode, target)
        return {k: v for k, v in self.sizes.items() if k in names}

    def __str__(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.sizes.items())
        return f"{self.op.name} mode={self.mode} {sizes}"


@functools.lru_cache(maxsize=16)
def _scheduled(name: str, mode: str, sizes: tuple[tuple[str, int], ...], target: str = "cpp",
               device: DeviceSpec | None = None) -> Schedule:
    op = ops.get(name)
    return default_schedule(name, mode, op.program(mode, **dict(sizes)), target=target, device=device)


@functools.lru_cache(maxsize=16)
def _generic(name: str, mode: str, static: tuple[tuple[str, int], ...], target: str = "cpp",
             device: DeviceSpec | None = None) -> Schedule:
    op = ops.get(name)
    return default_schedule(name, mode, op.generic_program(mode, target, **dict(static)), target=target, device=device)


def _plain_source(subject: Subject) -> str:
    return str(subject.program())


def _fused_source(subject: Subject) -> str:
    sch = subject.schedule()
    steps = "\n".join(f"#   {line}" for line in sch.trace.python().splitlines())
    return f"# {subject}: the plain program after its default schedule\n{steps}\n{sch.program}"


def _interpret_fused(subject: Subject, inputs: Arrays) -> Arrays:
    return interpret(subject.schedule().program, inputs)


def _interpret_plain(subject: Subject, inputs: Arrays) -> Arrays:
    program = subject.program()
    sizes = {p.name: subject.sizes[p.name] for p in program.params if p.name in subject.sizes}
    return interpret(program, inputs, sizes)


def _tile_source(subject: Subject) -> str:
    from polyfuse.tiling import to_tiles
    from polyfuse.tiling.skip import skip_masked_tiles

    return f"# {subject}: the fused program as tiles\n{skip_masked_tiles(to_tiles(subject.schedule().program))}"


def gpu_stage(subject: Subject, stage: str, backend: str) -> str:
    """A GPU build's ``tile`` stage (the program cut into kernels, as the emitter lowers it) or ``plan`` stage
    (the kernel plan), for ``backend``'s default device."""
    from polyfuse.pipeline import stages

    built = stages(subject.generic_schedule(backend), backend)
    what = "the program the GPU emitter lowers" if stage == "tile" else "the kernel plan"
    return f"# {subject}: {what} ({backend}, {built.source.target.arch})\n{built.dump(stage)}"


def _interpret_tiles(subject: Subject, inputs: Arrays) -> Arrays:
    from polyfuse import tiling
    from polyfuse.tiling.skip import skip_masked_tiles

    return tiling.interpret(skip_masked_tiles(tiling.to_tiles(subject.schedule().program)), inputs)


def _cpp_source(subject: Subject) -> str:
    from polyfuse.pipeline import stages

    symbolic = ", ".join(subject.op.symbolic) or "none"
    return (f"// {subject}: generated host C++ (size parameters: {symbolic})\n"
            f"{stages(subject.host_schedule(), 'cpp').source.text}")


def _run_cpp(subject: Subject, inputs: Arrays) -> Arrays:
    from polyfuse.pipeline import build

    return build(subject.host_schedule(), "cpp").run(inputs, **subject.symbolic_sizes())


def _gpu_source(backend: str) -> Callable[[Subject], str]:
    def render(subject: Subject) -> str:
        from polyfuse.pipeline import stages

        source = stages(subject.generic_schedule(backend), backend).source
        launches = "\n".join(f"//   {x.kernel}: {x.blocks} blocks x {x.threads} threads, {x.shared} bytes shared"
                              for x in source.launches)
        symbolic = ", ".join(subject.op.symbolic_sizes(subject.mode, backend)) or "none"
        return (f"// {subject}: generated {backend.upper()} ({source.target.arch}, size parameters: {symbolic})\n"
                f"{launches}\n{source.text}")
    return render


def _run_gpu(backend: str) -> Callable[[Subject, Arrays], Arrays]:
    def run(subject: Subject, inputs: Arrays) -> Arrays:
        from polyfuse.pipeline import build
        from polyfuse.cli.devices import require_gpu
        from polyfuse.runtime.loaders import loader

        require_gpu(backend)
        # Scheduled for the device it runs on (its SMs and shared memory), which build() compiles for too.
        device = loader(backend).device_spec()
        # Contracted multiply-adds (FMA) for speed, as the benchmarks run: the operators' tolerances cover them
        # (the error model in polyfuse.ops.softmax).  The kernel of the generic program: sizes that differ only
        # in the ones it takes as parameters share it (and its compiled image).
        kernel = build(subject.generic_schedule(backend, device), backend, fp_contract=True)
        return kernel.run(inputs, **subject.symbolic_sizes(backend))
    return run


STAGES: dict[str, Callable[[Subject], str]] = {
    "plain": _plain_source,
    "fused": _fused_source,
    "tile": _tile_source,
    "plan": lambda subject: gpu_stage(subject, "plan", "cuda"),
    "cpp": _cpp_source,
    "cuda": _gpu_source("cuda"),
    "hip": _gpu_source("hip"),
}

BACKENDS: dict[str, Callable[[Subject, Arrays], Arrays]] = {
    "interp": _interpret_plain,
    "fused": _interpret_fused,
    "tile": _interpret_tiles,
    "cpp": _run_cpp,
    "cuda": _run_gpu("cuda"),
    "hip": _run_gpu("hip"),
}


def require_stage(stage: str) -> Callable[[Subject], str]:
    try:
        return STAGES[stage]
    except KeyError:
        raise NotAvailable(f"stage {stage} is not available yet in this version") from None


def require_backend(backend: str) -> Callable[[Subject, Arrays], Arrays]:
    try:
        return BACKENDS[backend]
    except KeyError:
        raise NotAvailable(f"backend {backend} is not available yet in this version") from None


@dataclass(frozen=True)
class CheckResult:
    """One backend's outputs compared with the operator's float64 NumPy reference."""

    comparison: Comparison
    seconds: float


def check_backend(subject: Subject, backend: str, *, seed: int, magnitude: float,
                  variant: str = "random") -> CheckResult:
    """Run ``subject`` on ``backend`` with random inputs (rewritten by the input ``variant``, see
    :mod:`polyfuse.ops.variants`) and compare with the reference.

    ``seconds`` is the wall time of the backend alone (not inputs or reference).
    """
    run = require_backend(backend)
    inputs = subject.op.inputs(seed, subject.mode, subject.sizes, magnitude, variant)
    start = time.perf_counter()
    results = run(subject, inputs)
    seconds = time.perf_counter() - start
    reference = subject.op.reference(inputs, subject.mode, subject.sizes)
    tolerance = subject.op.tolerance(subject.mode, subject.sizes)
    return CheckResult(ops.compare(results, reference, tolerance), seconds)
