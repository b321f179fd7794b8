"""Where a benchmark ran, as its result records it: machine, device, jax, date, load."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any


def machine() -> str:
    """The processor's name, or the machine type where the platform gives none."""
    return platform.processor() or platform.machine()


def utc_date() -> str:
    """Now, in UTC, to the second (ISO 8601)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def load_avg_1m() -> float:
    """The 1-minute load average (other processes' load skews CPU timings)."""
    return round(os.getloadavg()[0], 2)


def device_label(device: Any) -> str:
    """A JAX device as `platform:device_kind`, e.g. `cpu:cpu`, `gpu:NVIDIA H100 80GB HBM3`."""
    return f"{device.platform}:{device.device_kind}"


def jax_host() -> dict:
    """{device (JAX's first device), cpu_count, machine, jax (version)}."""
    import jax

    return {
        "device": device_label(jax.devices()[0]),
        "cpu_count": os.cpu_count(),
        "machine": machine(),
        "jax": jax.__version__,
    }
