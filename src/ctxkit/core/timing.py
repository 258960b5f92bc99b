"""Timing work on a GPU (or a CPU) the way every ctxkit benchmark does: one timer.

``ctxkit bench`` and ``benchmarks/harness.py`` both time with :func:`seconds_per_call`:
warm-up calls first (compilation, autotuning, CUDA-graph capture), then CUDA events around
the timed calls, so what is measured is the device's time for the calls as queued by the
host (host launch overhead included, as a user's loop sees it), read once at the end.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["measured_peak_tflops", "median_latency_ms", "seconds_per_call"]


def seconds_per_call(fn: Callable[[], object], warmup: int = 3, reps: int = 20, device=None) -> float:
    """Mean seconds per call of ``fn()`` over ``reps`` calls after ``warmup`` calls.

    On CUDA (``device`` a CUDA device, or None with CUDA available) the time is taken with
    CUDA events on the current stream; elsewhere with ``time.perf_counter``.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    if not cuda:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / reps


def median_latency_ms(fn: Callable[[], object], reps: int = 100, warmup: int = 0) -> float:
    """Median wall time of one call of ``fn()`` followed by a device synchronisation, in ms:
    what one client waits (host launch and copies included), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    mid = len(times) // 2
    return 1e3 * (times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2)


def measured_peak_tflops(n: int = 8192, reps: int = 20) -> float:
    """The bf16 matrix-product rate this GPU reaches on an ``n x n x n`` product (TFLOP/s):
    the peak an MFU figure is measured against (the datasheet's is not reached)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / seconds_per_call(lambda: a @ b, warmup=3, reps=reps, device="cuda") / 1e12
