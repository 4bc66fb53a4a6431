"""GPU benchmark of the operator catalog: polyfuse's CUDA kernels against PyTorch, in one process.

:mod:`~polyfuse.bench.cases` picks the sizes (presets, test sizes, sweeps), :mod:`~polyfuse.bench.baselines` is
what a user would run instead (eager, SDPA, FlexAttention, built-ins), :mod:`~polyfuse.bench.measure` runs one
case, :mod:`~polyfuse.bench.runner` a whole run, :mod:`~polyfuse.bench.report` and :mod:`~polyfuse.bench.plot`
write its table, JSON and PNGs. ``polyfuse bench OP`` and ``benchmarks/gpu_bench.py`` are its front ends.
PyTorch, tqdm and matplotlib (the ``bench`` extra) are imported only when a run starts.
"""
