"""Timing a call: the median wall time of repeated calls after a warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn()` in seconds over `repeats` calls, after one warm-up (or
    compiling) call. `fn` waits for its own result (e.g. `jax.block_until_ready`)."""
    return float(np.median(call_times(fn, repeats)))


def call_times(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall times in seconds of `repeats` calls of `fn()`, after `warmup` untimed ones.
    `fn` waits for its own result. Imports only numpy: the PyTorch peer uses it too."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times
