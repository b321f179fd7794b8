"""Timing a call: the median wall time of repeated calls after a warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping

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


def interleaved_times(
    calls: Mapping[Hashable, Callable[[], object]], rounds: int
) -> dict[Hashable, list[float]]:
    """{name: wall times in seconds of `rounds` calls}, each round calling every function
    once in turn (after one untimed call each): on a machine whose speed drifts (a shared
    VM) the drift reaches every function alike, where timing one after the other would put
    it between them. Each function waits for its own result."""
    for fn in calls.values():
        fn()
    times: dict[Hashable, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times
