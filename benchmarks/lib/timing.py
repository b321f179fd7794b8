"""Timing a call: the median wall time of repeated calls after a warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn()` in seconds over `repeats` calls, after one warm-up (or
    compiling) call. `fn` waits for its own result (e.g. `jax.block_until_ready`)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
