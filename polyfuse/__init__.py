"""polyfuse: a polyhedral compiler for fused GPU kernels."""

from polyfuse.errors import PolyfuseError

__version__ = "0.1.0"  # the one version source: pyproject.toml reads it (tool.setuptools.dynamic)
__all__ = ["PolyfuseError", "__version__", "build"]


def build(program_or_schedule, target="cpp", **options):
    """Compile a Program or Schedule into a runnable Kernel (see :func:`polyfuse.pipeline.build`)."""
    from polyfuse.pipeline import build as _build

    return _build(program_or_schedule, target, **options)
