"""polyfuse: a polyhedral compiler for fused GPU kernels."""

from polyfuse.errors import PolyfuseError

__version__ = "0.1.0"
__all__ = ["PolyfuseError", "__version__"]
