"""Performance accounting: peak FLOP/s per device, MFU, goodput phases, a progress line.

Pure Python (no jaxspeech imports, no jax calls): the training loop passes in
`jax.devices()[0].device_kind`, its model FLOPs per step and its timings, and
logs what comes out. Everything here is testable with numbers and a fake clock.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator

# ---------------------------------------------------------------------------
# Peak dense TFLOP/s per JAX device.
# ---------------------------------------------------------------------------
# Keys are lowercase substrings of `jax.Device.device_kind`; a key matches only
# at word boundaries (so "l4" does not match "l40s", "h200" does not match
# "gh200", "tpu v5" does not match "tpu v5e"), and the longest matching key wins
# ("tpu v5 lite" before "tpu v5", "h100 pcie" before "h100").
#
# Values are *dense* figures (NVIDIA datasheets print "with sparsity" numbers,
# marked *, that are 2x the dense ones; we halve them) for one JAX device.
#
# "float32" is the rate XLA actually runs f32 matmuls at under JAX's DEFAULT
# precision, because that is what an MFU of an f32 run should be measured
# against (see jax.lax.Precision):
#   - TPU: DEFAULT precision does f32 dots as one bf16 MXU pass, so the f32 peak
#     is the bf16 peak. (With precision=HIGHEST, 6 bf16 passes, divide by ~6.)
#   - NVIDIA Ampere and newer: DEFAULT precision uses TF32 tensor cores, so the
#     f32 peak is the dense TF32 tensor-core figure.
#   - Volta/Turing (V100, T4): no TF32 and no bf16 tensor cores; XLA runs f32
#     dots on CUDA cores and computes bf16 dots in f32, so both entries are the
#     plain FP32 rate. (Their FP16 tensor-core rates are not used by bf16 runs.)
#
# TPU devices: v4 and v5p run in "megacore" mode (one device = one chip with two
# TensorCores); v2, v3 and TPU7x expose each TensorCore as its own device, so
# their per-chip figures are halved here; v4i, v5e and v6e have one TensorCore
# per chip. A v5p slice started without megacore also has two devices per chip:
# pass an override in that case.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # --- Google Cloud TPU (cloud.google.com/tpu/docs/<version>, "Peak compute per chip") ---
    # TPU v2: 45 TFLOPs bf16 per chip, 2 TensorCores = 2 devices.
    "tpu v2": {"bfloat16": 22.5, "float32": 22.5},
    # TPU v3: 123 TFLOPs bf16 per chip, 2 TensorCores = 2 devices.
    "tpu v3": {"bfloat16": 61.5, "float32": 61.5},
    # TPU v4: 275 TFLOPs bf16 per chip, megacore = 1 device.
    "tpu v4": {"bfloat16": 275.0, "float32": 275.0},
    # TPU v4i ("TPU v4 lite"): 138 TFLOPs bf16, 1 TensorCore (Jouppi et al., ISCA 2021,
    # "Ten Lessons From Three Generations Shaped Google's TPUv4i"). Listed so that
    # "tpu v4 lite" does not fall through to the v4 entry.
    "tpu v4 lite": {"bfloat16": 138.0, "float32": 138.0},
    # TPU v5e: 197 TFLOPs bf16 per chip, 1 TensorCore. device_kind is "TPU v5 lite".
    "tpu v5 lite": {"bfloat16": 197.0, "float32": 197.0},
    "tpu v5e": {"bfloat16": 197.0, "float32": 197.0},
    # TPU v5p: 459 TFLOPs bf16 per chip, megacore = 1 device. device_kind is "TPU v5"
    # (jax's own test_util checks `device_kind.endswith("v5")` for v5p).
    "tpu v5": {"bfloat16": 459.0, "float32": 459.0},
    "tpu v5p": {"bfloat16": 459.0, "float32": 459.0},
    # TPU v6e (Trillium): 918 TFLOPs bf16 per chip, 1 TensorCore. device_kind "TPU v6 lite".
    "tpu v6 lite": {"bfloat16": 918.0, "float32": 918.0},
    "tpu v6e": {"bfloat16": 918.0, "float32": 918.0},
    # TPU7x (Ironwood): 2307 TFLOPs bf16 per chip, 2 TensorCores = 2 devices.
    "tpu7x": {"bfloat16": 1153.5, "float32": 1153.5},
    # --- NVIDIA (bf16 = dense BF16 tensor core; float32 = dense TF32 tensor core) ---
    # Tesla V100 datasheet (SXM2): FP32 15.7 TFLOPS; PCIe: 14 TFLOPS. No bf16/TF32 units.
    "v100": {"bfloat16": 15.7, "float32": 15.7},
    "v100-pcie": {"bfloat16": 14.0, "float32": 14.0},
    # Tesla V100S PCIe datasheet: FP32 16.4 TFLOPS.
    "v100s": {"bfloat16": 16.4, "float32": 16.4},
    # Tesla T4 datasheet: FP32 8.1 TFLOPS. No bf16/TF32 units.
    "t4": {"bfloat16": 8.1, "float32": 8.1},
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe, 40/80 GB): BF16 312, TF32 156.
    "a100": {"bfloat16": 312.0, "float32": 156.0},
    # NVIDIA A10 datasheet: BF16 125, TF32 62.5.
    "a10": {"bfloat16": 125.0, "float32": 62.5},
    # A10G (AWS G5 only) has no NVIDIA datasheet; the commonly cited dense figures
    # (e.g. Baseten's "NVIDIA A10 vs A10G" comparison) are BF16 70, TF32 35. Lower
    # confidence than the rest of the table: pass override_tflops if you know better.
    "a10g": {"bfloat16": 70.0, "float32": 35.0},
    # NVIDIA L4 datasheet: BF16 242*, TF32 120* (with sparsity).
    "l4": {"bfloat16": 121.0, "float32": 60.0},
    # NVIDIA L40 datasheet: BF16 181.05 | 362.1*, TF32 90.5 | 181*.
    "l40": {"bfloat16": 181.05, "float32": 90.5},
    # NVIDIA L40S datasheet: BF16 362.05 | 733*, TF32 183 | 366*.
    "l40s": {"bfloat16": 362.05, "float32": 183.0},
    # NVIDIA H100 Tensor Core GPU datasheet / Hopper whitepaper.
    # H100 SXM (device_kind "NVIDIA H100 80GB HBM3"): BF16 1979*, TF32 989*.
    "h100": {"bfloat16": 989.4, "float32": 494.7},
    # H100 PCIe: BF16 1513*, TF32 756*.
    "h100 pcie": {"bfloat16": 756.5, "float32": 378.0},
    # H100 NVL (per GPU): BF16 1671*, TF32 835*.
    "h100 nvl": {"bfloat16": 835.5, "float32": 417.5},
    # NVIDIA H200 datasheet: H200 SXM same as H100 SXM; H200 NVL BF16 1671*, TF32 835*.
    "h200": {"bfloat16": 989.4, "float32": 494.7},
    "h200 nvl": {"bfloat16": 835.5, "float32": 417.5},
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the GPU is an H100 SXM (BF16 1979*).
    "gh200": {"bfloat16": 989.4, "float32": 494.7},
    # NVIDIA Blackwell datasheet, HGX B200 (1000 W) per GPU: FP16/BF16 4.5 PF*, TF32 2.2 PF*.
    "b200": {"bfloat16": 2250.0, "float32": 1100.0},
    # Same datasheet, GB200 NVL72 per GPU (1200 W): FP16/BF16 5 PF*, TF32 2.5 PF*.
    "gb200": {"bfloat16": 2500.0, "float32": 1250.0},
}

# Spellings of the two compute dtypes the table knows. Anything else (float16,
# fp8) has different peaks and is refused rather than silently mis-measured.
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "f32": "float32",
    "fp32": "float32",
    "tf32": "float32",
}


def _normalize_dtype(dtype: str) -> str:
    name = str(dtype).strip().lower()
    if name not in _DTYPE_ALIASES:
        raise ValueError(
            f"peak FLOP/s are tabulated for bfloat16 and float32 compute, not {dtype!r}; "
            "pass override_tflops for other dtypes"
        )
    return _DTYPE_ALIASES[name]


def _matching_key(device_kind: str) -> str | None:
    """Longest table key found in device_kind at word boundaries, or None."""
    kind = " ".join(device_kind.lower().split())
    best = None
    for key in PEAK_TFLOPS:
        # Boundaries are "not a letter or digit" so that "-" and " " separate
        # words ("a100-sxm4-80gb") but "l4" stays out of "l40s".
        if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])", kind):
            if best is None or len(key) > len(best):
                best = key
    return best


def peak_flops_per_device(
    device_kind: str, dtype: str, override_tflops: float = 0.0
) -> float | None:
    """Dense peak FLOP/s (not TFLOP/s) of one JAX device computing in `dtype`.

    `override_tflops` > 0 wins (for hardware not in `PEAK_TFLOPS`, or a clock
    you know better); otherwise the most specific `PEAK_TFLOPS` key found in
    `device_kind`. Unknown kinds (e.g. "cpu") give None: no MFU is reported.
    """
    if override_tflops and override_tflops > 0:
        return float(override_tflops) * 1e12
    key = _matching_key(device_kind)
    if key is None:
        return None
    return PEAK_TFLOPS[key][_normalize_dtype(dtype)] * 1e12


def mfu(
    flops_per_step: float, step_seconds: float, num_devices: int, peak_per_device: float | None
) -> float | None:
    """Model FLOPs utilization: achieved FLOP/s over the peak of all devices.

    flops_per_step: global model FLOPs of one step (all devices together).
    peak_per_device: FLOP/s from `peak_flops_per_device`; None -> None (unknown hardware).
    """
    if peak_per_device is None or peak_per_device <= 0:
        return None
    if step_seconds <= 0 or num_devices <= 0:
        return None
    return flops_per_step / step_seconds / (num_devices * peak_per_device)


def price_per_audio_hour(
    device_hour_price: float, devices: int, audio_s: float, compute_s: float, goodput: float
) -> float | None:
    """What an hour of audio costs to train: devices x price of a device hour / audio
    hours trained per wall hour. The rate is the steps' own (`audio_s` of audio in
    `compute_s` of step compute) times `goodput` (the share of wall time spent in such
    steps: compilation, data waits, evaluation and checkpoints cost too). None when
    off (price 0) or not measured (no step compute yet)."""
    if device_hour_price <= 0 or compute_s <= 0 or goodput <= 0 or audio_s <= 0:
        return None
    return devices * device_hour_price / (audio_s / compute_s * goodput)


# ---------------------------------------------------------------------------
# Goodput: where the wall time went.
# ---------------------------------------------------------------------------
PHASES = ("data", "compute", "compile", "checkpoint", "eval")


class Goodput:
    """Wall time split into named phases, per logging window and since start.

    Phases (anything outside them is "other", derived from wall time):
      data        waiting for the input pipeline
      compute     device steps, timed up to the point their outputs are ready
                  (block on a step output inside the phase, or async dispatch
                  hides the device time in the next phase)
      compile     steps that triggered a compilation (the caller knows: first
                  step of each bucket shape)
      checkpoint  saving / restoring
      eval        in-training evaluation

    Phases may nest; time is charged to the innermost open phase only, so the
    phases never double count (a compile inside an eval counts as compile).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._start = clock()
        self._window_start = self._start
        self._total = dict.fromkeys(PHASES, 0.0)
        self._window = dict.fromkeys(PHASES, 0.0)
        self._open: list[str] = []  # stack of open phases, innermost last
        self._mark = self._start  # when the innermost open phase was last charged

    def _charge(self, now: float) -> None:
        """Charge time since the last mark to the innermost open phase."""
        if self._open:
            dt = now - self._mark
            self._total[self._open[-1]] += dt
            self._window[self._open[-1]] += dt
        self._mark = now

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown goodput phase {name!r}; expected one of {PHASES}")
        self._charge(self._clock())
        self._open.append(name)
        try:
            yield
        finally:
            self._charge(self._clock())
            self._open.pop()

    @staticmethod
    def _with_other(phases: dict[str, float], wall: float) -> dict[str, float]:
        out = dict(phases)
        # max(0, ...) guards float round-off when phases cover the whole window.
        out["other"] = max(0.0, wall - sum(phases.values()))
        out["wall"] = wall
        return out

    def window(self) -> dict[str, float]:
        """Seconds per phase (plus "other" and "wall") since the last call; resets the window."""
        now = self._clock()
        self._charge(now)
        out = self._with_other(self._window, now - self._window_start)
        self._window = dict.fromkeys(PHASES, 0.0)
        self._window_start = now
        return out

    def totals(self) -> dict[str, float]:
        """Seconds per phase (plus "other" and "wall") since construction."""
        now = self._clock()
        self._charge(now)
        return self._with_other(self._total, now - self._start)

    def goodput(self) -> float:
        """Productive fraction of wall time since start: non-compiling step compute / wall."""
        totals = self.totals()
        return totals["compute"] / totals["wall"] if totals["wall"] > 0 else 0.0


# ---------------------------------------------------------------------------
# Progress line for the console log.
# ---------------------------------------------------------------------------
def format_duration(seconds: float) -> str:
    """4m46s, 1h02m03s, 9s (rounded to the nearest second)."""
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def progress_line(done: int, total: int, steps_per_s: float, width: int = 20) -> str:
    """`[########............]  40% 400/1000 | 2.10 steps/s | ETA 4m46s`.

    The bar and percentage round down (99.9% never shows as 100%); with no
    rate yet (steps_per_s <= 0 or not finite) the ETA is "?".
    """
    frac = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
    filled = int(frac * width)
    bar = "#" * filled + "." * (width - filled)
    pct = int(frac * 100)
    if math.isfinite(steps_per_s) and steps_per_s > 0:
        eta = format_duration(max(total - done, 0) / steps_per_s)
        rate = f"{steps_per_s:.2f}" if steps_per_s >= 0.1 else f"{steps_per_s:.4f}"
    else:
        eta, rate = "?", "-"
    return f"[{bar}] {pct:3d}% {done}/{total} | {rate} steps/s | ETA {eta}"
