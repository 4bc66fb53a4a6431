"""polyfuse kernels as PyTorch operators, for ``torch.compile`` and CUDA graphs.

``custom_op(kernel)`` registers a built kernel (:func:`polyfuse.pipeline.build`) with ``torch.library.custom_op``
as ``polyfuse::NAME``: one Tensor argument per kernel input, one Tensor result per output, and a fake (meta)
implementation that gives the outputs' shapes from the program's shape expressions (sizes bound at build time,
else read off the inputs' shapes, symbolic under dynamic shapes) and their dtypes. ``torch.compile`` therefore
traces a call as one opaque node, without a graph break, also with ``fullgraph=True``::

    softmax = polyfuse.torch.custom_op(polyfuse.build(schedule, "cuda"))
    y = torch.compile(lambda x: softmax(x * 2), fullgraph=True)(x)

- a GPU kernel launches on its inputs' device and that device's current PyTorch stream
  (``torch.cuda.current_stream``), so a CUDA graph captures it like any other kernel. It launches through
  cuda-python (pycuda launches only on streams it made). A kernel with scratch buffers (decode's split, a presplit
  operand) allocates them at its first call with given sizes: call it once before capturing, as PyTorch's own
  warm-up before ``torch.cuda.graph`` does;
- a host kernel takes CPU tensors and returns CPU tensors;
- forward only: an input that requires grad (with grad mode on) raises :class:`~polyfuse.errors.LaunchError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from polyfuse.emit_cpp.target import Arg
from polyfuse.errors import LaunchError
from polyfuse.runtime.gpu import TORCH_DTYPES, GpuKernel
from polyfuse.runtime.kernel import KernelBase
from polyfuse.runtime.loaders import loader

_INTEGER_OF_WIDTH = {1: torch.uint8, 2: torch.int16}
"""A tensor of a float type NumPy lacks (bf16, fp8) is handed to a host kernel as these bits."""
_REGISTERED: dict[str, tuple[str, PolyfuseOp]] = {}
"""Operators registered in this process by qualified name, with the digest of what they run (torch.library
registers a name once per process)."""


class PolyfuseOp:
    """A kernel as a PyTorch operator: ``op(*inputs)`` returns the output (several: a tuple) as fresh tensors on the
    inputs' device. ``op.custom_op`` is the ``torch.library`` operator itself (``op.custom_op._opoverload`` the
    overload a traced graph calls)."""

    def __init__(self, kernel: KernelBase, qualname: str, sizes: Mapping[str, int]):
        self.kernel = kernel
        self.qualname = qualname
        self.sizes = dict(sizes)
        _require_shapes_known(kernel, self.sizes)
        self.custom_op = torch.library.custom_op(qualname, self._run, mutates_args=(), schema=_schema(kernel))
        self.custom_op.register_fake(self._fake)

    def __repr__(self) -> str:
        return f"PolyfuseOp({self.qualname}: {self.kernel.signature})"

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if len(inputs) != len(self.kernel.inputs):
            names = ", ".join(a.name for a in self.kernel.inputs)
            raise LaunchError(f"{self.qualname} takes {len(self.kernel.inputs)} tensor(s) ({names}); "
                              f"got {len(inputs)}")
        if torch.is_grad_enabled():
            for spec, t in zip(self.kernel.inputs, inputs, strict=True):
                if t.requires_grad:
                    raise LaunchError(f"{self.qualname} is forward only: input {spec.name!r} requires grad, and "
                                      f"polyfuse kernels have no backward; call it under torch.no_grad() or pass "
                                      f"{spec.name}.detach()")
        return self.custom_op(*inputs)

    # ------------------------------------------------------------------ implementations
    def _fake(self, *inputs: torch.Tensor) -> Any:
        for spec, t in zip(self.kernel.inputs, inputs, strict=True):
            _check_dtype(self.qualname, spec, t)
        outs = [inputs[0].new_empty(shape, dtype=_torch_dtype(spec))
                for spec, shape in zip(self.kernel.outputs, output_shapes(self.kernel, self.sizes, inputs),
                                       strict=True)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run(self, *inputs: torch.Tensor) -> Any:
        device = inputs[0].device
        for spec, t in zip(self.kernel.inputs, inputs, strict=True):
            if t.device != device:
                raise LaunchError(f"{self.qualname}: input {spec.name!r} is on {t.device}, the first on {device}")
        inputs = tuple(t.contiguous() for t in inputs)
        outs = [torch.empty(shape, dtype=_torch_dtype(spec), device=device)
                for spec, shape in zip(self.kernel.outputs, output_shapes(self.kernel, self.sizes, inputs),
                                       strict=True)]
        if isinstance(self.kernel, GpuKernel):
            if device.type != "cuda":
                raise LaunchError(f"{self.qualname} is a GPU kernel; its inputs are on {device}, not a CUDA device")
            with torch.cuda.device(device):
                stream = torch.cuda.current_stream(device).cuda_stream
                self.kernel.launch((*inputs, *outs), self.sizes, stream=stream)
        else:
            if device.type != "cpu":
                raise LaunchError(f"{self.qualname} is a host kernel; its inputs are on {device}, not the CPU")
            specs = (*self.kernel.inputs, *self.kernel.outputs)
            self.kernel.launch(tuple(_host_array(self.qualname, spec, t)
                                     for spec, t in zip(specs, (*inputs, *outs), strict=True)), self.sizes)
        return outs[0] if len(outs) == 1 else tuple(outs)


def custom_op(kernel: KernelBase, *, name: str | None = None, sizes: Mapping[str, int] | None = None) -> PolyfuseOp:
    """``kernel`` as the PyTorch operator ``polyfuse::NAME`` (default: the kernel's entry point and a digest of its
    source and sizes). ``sizes`` fix size parameters that neither the build bound nor the inputs' shapes give.
    The same kernel (source and sizes) asked for twice gives the same operator."""
    if isinstance(kernel, GpuKernel) and not kernel.loader.foreign_streams:
        kernel = GpuKernel(kernel.kernel_source, kernel.image, loader(kernel.loader.backend, "cuda-python"),
                           kernel.bound_sizes, kernel.options)
    sizes = {**kernel.bound_sizes, **(sizes or {})}
    digest = hashlib.sha256(repr((kernel.kernel_source.text, type(kernel).__name__, sorted(sizes.items())))
                            .encode()).hexdigest()[:12]
    qualname = f"polyfuse::{name or f'{kernel.name}_{digest}'}"
    if qualname in _REGISTERED:
        known, op = _REGISTERED[qualname]
        if known != digest:
            raise LaunchError(f"the PyTorch operator {qualname} is registered already, for another kernel or sizes; "
                              f"give this one another name")
        return op
    op = PolyfuseOp(kernel, qualname, sizes)
    _REGISTERED[qualname] = (digest, op)
    return op


def output_shapes(kernel: KernelBase, sizes: Mapping[str, int], inputs: Sequence[torch.Tensor]) -> list[tuple]:
    """The outputs' shapes: size parameters from ``sizes``, else from the first input dimension they name (a
    SymInt under dynamic shapes)."""
    values: dict[str, Any] = dict(sizes)
    for spec, t in zip(kernel.inputs, inputs, strict=True):
        if len(spec.shape) != t.dim():
            raise LaunchError(f"input {spec.name!r} has {t.dim()} dimension(s); expected {len(spec.shape)} "
                              f"{tuple(spec.shape)}")
        for d, got in zip(spec.shape, t.shape, strict=True):
            if isinstance(d, str):
                values.setdefault(d, got)
    return [tuple(d if isinstance(d, int) else values[d] for d in spec.shape) for spec in kernel.outputs]


def _require_shapes_known(kernel: KernelBase, sizes: Mapping[str, int]) -> None:
    named = set(sizes) | {d for spec in kernel.inputs for d in spec.shape if isinstance(d, str)}
    unknown = sorted({d for spec in kernel.outputs for d in spec.shape if isinstance(d, str)} - named)
    if unknown:
        raise LaunchError(f"kernel {kernel.name}: the outputs' size(s) {', '.join(unknown)} are neither bound nor "
                          f"an input's dimension; pass sizes={{{', '.join(f'{u!r}: ...' for u in unknown)}}}")


def _schema(kernel: KernelBase) -> str:
    args = ", ".join(f"Tensor {spec.name}" for spec in kernel.inputs)
    results = "Tensor" if len(kernel.outputs) == 1 else "(" + ", ".join(["Tensor"] * len(kernel.outputs)) + ")"
    return f"({args}) -> {results}"


def _torch_dtype(spec: Arg) -> torch.dtype:
    return getattr(torch, TORCH_DTYPES[spec.dtype.name])


def _check_dtype(qualname: str, spec: Arg, t: torch.Tensor) -> None:
    if t.dtype != _torch_dtype(spec):
        raise LaunchError(f"{qualname}: input {spec.name!r} has dtype {t.dtype}; expected {_torch_dtype(spec)} "
                          f"({spec.dtype})")


def _host_array(qualname: str, spec: Arg, t: torch.Tensor) -> Any:
    """A CPU tensor as the NumPy array the host kernel reads or writes in place (bf16 and fp8 through their bits)."""
    _check_dtype(qualname, spec, t)
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return t.view(_INTEGER_OF_WIDTH[t.element_size()]).numpy().view(spec.dtype.numpy)
    return t.numpy()
