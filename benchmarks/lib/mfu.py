"""Model FLOPs utilization: the peak FLOP/s of a device and a step's rates against it.

The peak of one device is `--peak_tflops` if given ("override"), else
`jaxspeech.metrics.perf.peak_flops_per_device` for the device kind and dtype ("table");
CPUs have no table entry, so their peak is MEASURED ("measured_matmul"): the best of
MATMUL_TRIES timed MATMUL_N^3 float32 matmuls on one device. Used by
benchmarks/train_step.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from jaxspeech.metrics import perf

MATMUL_N = 2048
MATMUL_TRIES = 5


def select_peak(
    device_kind: str,
    platform_name: str,
    dtype: str,
    override_tflops: float = 0.0,
    measured_flops: float | Callable[[], float] | None = None,
) -> tuple[float | None, str]:
    """(peak FLOP/s of ONE device, peak_source).

    override ("override") > the perf table ("table") > on CPU the measured matmul rate of
    one device ("measured_matmul"; a number or a function that measures it) > (None,
    "unknown").
    """
    if override_tflops and override_tflops > 0:
        return perf.peak_flops_per_device(device_kind, dtype, override_tflops), "override"
    peak = perf.peak_flops_per_device(device_kind, dtype)
    if peak is not None:
        return peak, "table"
    if platform_name == "cpu" and measured_flops is not None:
        value = measured_flops() if callable(measured_flops) else measured_flops
        return float(value), "measured_matmul"
    return None, "unknown"


def rates(
    flops_per_step: float,
    step_s: float,
    batch: int,
    seconds: float,
    num_devices: int,
    peak_per_device: float | None,
) -> dict:
    """audio_s_per_s, achieved_tflops, peak_tflops (all devices) and mfu of one model."""
    return {
        "audio_s_per_s": batch * seconds / step_s,
        "achieved_tflops": flops_per_step / step_s / 1e12,
        "peak_tflops": None if peak_per_device is None else peak_per_device * num_devices / 1e12,
        "mfu": perf.mfu(flops_per_step, step_s, num_devices, peak_per_device),
    }


def price_columns(row: dict, device_hour_price: float) -> dict:
    """A row's price of an hour of audio trained at `device_hour_price` per device (None
    when 0), from its step time alone (goodput 1)."""
    price = perf.price_per_audio_hour(
        device_hour_price, row["num_devices"], row["audio_s_per_s"], 1.0, 1.0
    )
    return {"device_hour_price": device_hour_price or None, "price_per_audio_hour": price}


def matmul_flops_per_s(n: int = MATMUL_N, tries: int = MATMUL_TRIES) -> float:
    """Best FLOP/s of `tries` timed (n x n) @ (n x n) float32 matmuls on one device."""
    import jax
    import jax.numpy as jnp

    dev = jax.local_devices()[0]
    rng = np.random.default_rng(0)
    a, b = (jax.device_put(rng.standard_normal((n, n), np.float32), dev) for _ in range(2))
    mm = jax.jit(jnp.matmul)
    jax.block_until_ready(mm(a, b))  # compile and warm up
    best = math.inf
    for _ in range(tries):
        t0 = time.perf_counter()
        jax.block_until_ready(mm(a, b))
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def probe(measure_matmul: bool) -> dict:
    """The device this machine gives JAX, and the CPU matmul rate when asked."""
    import jax

    dev = jax.local_devices()[0]
    out = {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "jax": jax.__version__,
    }
    if measure_matmul and dev.platform == "cpu":
        out["matmul_flops_per_s"] = matmul_flops_per_s()
    return out
