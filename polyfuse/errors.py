"""The exception hierarchy of polyfuse.

User errors derive from :class:`PolyfuseError`; every message names the block,
loop, tensor, dependence, shape or dtype involved.  :class:`InternalError` is a
bug in polyfuse itself and deliberately does *not* derive from it.
"""

from __future__ import annotations


class PolyfuseError(Exception):
    """Base class of every error a user can cause."""


class IRError(PolyfuseError):
    """A program is malformed (bad shape, dtype, name, structure)."""


class NonAffineIndex(IRError):
    """An index or loop binding is not (quasi-)affine in loop variables and sizes."""


class OutOfBounds(IRError):
    """Some instance of a block reads or writes a tensor outside its shape (for some values of the sizes)."""


class GatherOutOfBounds(PolyfuseError):
    """A gather index (``x[i, target[i]]``) read a value outside the gathered dimension when the program ran."""


class UnboundSize(IRError):
    """A size parameter has no value where one is needed."""


class IllegalTransform(PolyfuseError):
    """A schedule step would change the program's meaning."""


class NoRepairFound(PolyfuseError):
    """The repair solver could not derive a correction term."""


class UntileableNest(PolyfuseError):
    """A loop nest cannot be expressed as a tile program."""


class LaunchError(PolyfuseError):
    """A compiled kernel was called with arguments that do not fit it."""


class BackendUnavailable(PolyfuseError):
    """A backend (compiler, loader or device) is missing on this machine."""


class CacheCorrupt(PolyfuseError):
    """A cached kernel cannot be loaded even after it was removed and built again (the message names the file)."""


class CompilerWarning(UserWarning):
    """A compiler warned on generated code (it is still built): a polyfuse bug, or a report such as register spills."""


class UnsupportedPattern(PolyfuseError):
    """A program the code generator refuses for a target (a resource limit or a pattern it cannot lower)."""


class InternalError(Exception):
    """A bug in polyfuse: an invariant that should hold did not."""
