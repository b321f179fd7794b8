"""jaxspeech.metrics.perf against independent references: the peak table against the
figures the vendors publish (written here with their sources, converted by hand to one
JAX device's dense rate), MFU and goodput against values worked out by hand (goodput driven
by a fake clock, with times that add up exactly in binary floating point), and the progress
line against whole strings with hand-computed ETAs."""

import math

import pytest

from jaxspeech.metrics import perf
from jaxspeech.metrics.perf import (
    PEAK_TFLOPS,
    Goodput,
    format_duration,
    mfu,
    peak_flops_per_device,
    progress_line,
)

# --------------------------------------------------------------------------- peak table

# (device_kind as JAX reports it, dtype, TFLOP/s as the vendor prints it, divisor to one
# JAX device's dense rate). Divisors: 2 for NVIDIA figures printed only "with sparsity"
# (marked *, twice the dense rate); 2 for TPU chips whose two TensorCores are two JAX
# devices (v2, v3, TPU7x); 1 otherwise. float32 is what XLA runs f32 dots at under
# DEFAULT precision: TPU = the bf16 MXU rate, NVIDIA Ampere and newer = TF32 tensor cores,
# Volta/Turing = plain FP32 (no bf16 or TF32 tensor cores).
PUBLISHED = [
    # Google Cloud TPU documentation (cloud.google.com/tpu/docs/system-architecture-tpu-vm
    # and the per-version pages), "peak compute per chip", bf16.
    ("TPU v2", "bfloat16", 45.0, 2),
    ("TPU v3", "bfloat16", 123.0, 2),
    ("TPU v4", "bfloat16", 275.0, 1),  # megacore: one device per chip
    ("TPU v4", "float32", 275.0, 1),
    ("TPU v5 lite", "bfloat16", 197.0, 1),  # v5e, as JAX names it
    ("TPU v5e", "bf16", 197.0, 1),
    ("TPU v5", "bfloat16", 459.0, 1),  # v5p, as JAX names it (megacore)
    ("TPU v5p", "f32", 459.0, 1),
    ("TPU v6 lite", "bfloat16", 918.0, 1),  # v6e (Trillium), as JAX names it
    ("TPU v6e", "bfloat16", 918.0, 1),
    ("TPU7x", "bfloat16", 2307.0, 2),  # Ironwood
    # Jouppi et al., "Ten Lessons From Three Generations Shaped Google's TPUv4i", ISCA 2021.
    ("TPU v4 lite", "bfloat16", 138.0, 1),
    # NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: BF16 989.4 (dense),
    # TF32 494.7 (dense).
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4, 1),
    ("NVIDIA H100 80GB HBM3", "float32", 494.7, 1),
    # NVIDIA H100 datasheet: PCIe BF16 1,513*, TF32 756*; NVL BF16 1,671*, TF32 835*.
    ("NVIDIA H100 PCIe", "bfloat16", 1513.0, 2),
    ("NVIDIA H100 PCIe", "tf32", 756.0, 2),
    ("NVIDIA H100 NVL", "bfloat16", 1671.0, 2),
    ("NVIDIA H100 NVL", "float32", 835.0, 2),
    # NVIDIA H200 datasheet: SXM BF16 1,979*, TF32 989*; NVL BF16 1,671*, TF32 835*.
    ("NVIDIA H200", "bfloat16", 1979.0, 2),
    ("NVIDIA H200", "float32", 989.0, 2),
    ("NVIDIA H200 NVL", "bfloat16", 1671.0, 2),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: BF16 1,979*, TF32 989* (an H100 SXM).
    ("NVIDIA GH200 480GB", "bfloat16", 1979.0, 2),
    ("NVIDIA GH200 480GB", "float32", 989.0, 2),
    # NVIDIA Blackwell datasheet, per GPU: HGX B200 BF16 4.5 PF*, TF32 2.2 PF*;
    # GB200 NVL72 BF16 5 PF*, TF32 2.5 PF*.
    ("NVIDIA B200", "bfloat16", 4500.0, 2),
    ("NVIDIA B200", "float32", 2200.0, 2),
    ("NVIDIA GB200", "bfloat16", 5000.0, 2),
    ("NVIDIA GB200", "float32", 2500.0, 2),
    # NVIDIA A100 datasheet (SXM4 and PCIe, 40 and 80 GB): BF16 312 | 624*, TF32 156 | 312*.
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0, 1),
    ("NVIDIA A100-SXM4-40GB", "float32", 156.0, 1),
    ("NVIDIA A100-PCIE-40GB", "fp32", 156.0, 1),
    # NVIDIA A10 datasheet: BF16 125 | 250*, TF32 62.5 | 125*.
    ("NVIDIA A10", "bfloat16", 125.0, 1),
    ("NVIDIA A10", "float32", 62.5, 1),
    # A10G: NVIDIA publishes no datasheet (AWS G5 only); commonly cited dense figures
    # (not a vendor's): BF16 70, TF32 35. What matters most: it is not the A10's 125.
    ("NVIDIA A10G", "bfloat16", 70.0, 1),
    ("NVIDIA A10G", "float32", 35.0, 1),
    # NVIDIA L4 datasheet: BF16 242*, TF32 120*.
    ("NVIDIA L4", "bfloat16", 242.0, 2),
    ("NVIDIA L4", "float32", 120.0, 2),
    # NVIDIA L40 datasheet: BF16 181.05 | 362.1*, TF32 90.5 | 181*.
    ("NVIDIA L40", "bfloat16", 181.05, 1),
    ("NVIDIA L40", "float32", 90.5, 1),
    # NVIDIA L40S datasheet: BF16 362.05 | 733*, TF32 183 | 366*.
    ("NVIDIA L40S", "bfloat16", 362.05, 1),
    ("NVIDIA L40S", "float32", 183.0, 1),
    # Tesla V100 datasheet: FP32 15.7 (SXM2), 14 (PCIe); V100S PCIe datasheet: FP32 16.4.
    # (Their FP16 tensor-core rates, 125 / 112 / 130, are not what a bf16 run gets.)
    ("Tesla V100-SXM2-16GB", "bfloat16", 15.7, 1),
    ("Tesla V100-SXM2-32GB", "float32", 15.7, 1),
    ("Tesla V100-PCIE-32GB", "bfloat16", 14.0, 1),
    ("Tesla V100S-PCIE-32GB", "float32", 16.4, 1),
    # Tesla T4 datasheet: FP32 8.1 (its FP16 tensor rate, 65, is not what bf16 gets).
    ("Tesla T4", "bfloat16", 8.1, 1),
]


@pytest.mark.parametrize("device_kind, dtype, printed, divisor", PUBLISHED)
def test_peak_matches_published_figure(device_kind, dtype, printed, divisor):
    # rel 1e-3: datasheets round to whole TFLOP/s (1,979* / 2 = 989.5 vs 989.4 dense).
    want = printed / divisor * 1e12
    assert peak_flops_per_device(device_kind, dtype) == pytest.approx(want, rel=1e-3)


def test_every_table_entry_has_a_published_figure_above():
    """Each key of the table is the one some device_kind of PUBLISHED resolves to, so none
    escapes the comparison with a published figure (a new entry needs one here)."""
    matched = {perf._matching_key(kind) for kind, *_ in PUBLISHED}
    assert set(PEAK_TFLOPS) <= matched, set(PEAK_TFLOPS) - matched


def test_float32_peak_relates_to_bfloat16_as_documented():
    """Independent of the figures: TPUs run f32 dots at DEFAULT precision as one bf16 pass
    (equal peaks); Volta/Turing have neither bf16 nor TF32 tensor cores (both are the FP32
    rate); on Ampere and newer, dense TF32 is half of dense BF16 (datasheets: within 3%)."""
    for key, peaks in PEAK_TFLOPS.items():
        bf16, f32 = peaks["bfloat16"], peaks["float32"]
        if key.startswith("tpu") or key.startswith(("v100", "t4")):
            assert f32 == bf16, key
        else:
            assert f32 == pytest.approx(bf16 / 2, rel=0.03), key


@pytest.mark.parametrize(
    "device_kind",
    [
        "cpu",
        "TFRT_CPU_0",
        "Tesla P100-PCIE-16GB",
        "NVIDIA GeForce RTX 4090",
        # Untabulated GPUs whose names hold a key inside a longer word ("t4", "a100").
        "NVIDIA T400 4GB",
        "NVIDIA RTX A1000",
    ],
)
def test_peak_unknown_kind_is_none(device_kind):
    assert peak_flops_per_device(device_kind, "float32") is None


def test_peak_override_wins():
    assert peak_flops_per_device("cpu", "float32", override_tflops=1.5) == pytest.approx(1.5e12)
    assert peak_flops_per_device("TPU v4", "bfloat16", override_tflops=100.0) == 100e12


def test_peak_rejects_untabulated_dtype():
    with pytest.raises(ValueError, match="float16"):
        peak_flops_per_device("NVIDIA H100 80GB HBM3", "float16")


# --------------------------------------------------------------------------- mfu


def test_mfu_arithmetic():
    # 8 devices x 100 TFLOP/s = 800 TFLOP/s peak; 400 TFLOP in 2 s = 200 TFLOP/s -> 25%.
    assert mfu(400e12, 2.0, 8, 100e12) == pytest.approx(0.25)
    assert mfu(1e12, 1.0, 1, None) is None
    assert mfu(1e12, 1.0, 1, 0.0) is None
    assert mfu(1e12, 0.0, 1, 1e12) is None
    assert mfu(1e12, 1.0, 0, 1e12) is None


def test_mfu_with_table_peaks():
    # 4 TPU v4 chips: 4 x 275 = 1100 TFLOP/s; 1.65e15 FLOP in 3 s = 550 TFLOP/s -> 1/2.
    assert mfu(1.65e15, 3.0, 4, peak_flops_per_device("TPU v4", "bfloat16")) == pytest.approx(0.5)
    # 8 A100s in bf16: 8 x 312 = 2496 TFLOP/s; 6e14 FLOP in 1 s -> 600 / 2496 = 25 / 104.
    peak = peak_flops_per_device("NVIDIA A100-SXM4-40GB", "bfloat16")
    assert mfu(6e14, 1.0, 8, peak) == pytest.approx(25 / 104)


# --------------------------------------------------------------------------- goodput


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def _zeros(**phases):
    out = dict.fromkeys(("data", "compute", "compile", "checkpoint", "eval", "other"), 0.0)
    out.update(phases)
    return out


def test_goodput_phases_window_and_totals():
    # All times are multiples of 1/4 s: every sum below is exact in floating point.
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("compile"):
        clock.advance(10.0)
    for _ in range(3):
        with g.phase("data"):
            clock.advance(0.5)
        with g.phase("compute"):
            clock.advance(2.0)
        clock.advance(0.25)  # logging, python overhead: "other"
    assert g.window() == _zeros(compile=10.0, data=1.5, compute=6.0, other=0.75, wall=18.25)

    with g.phase("checkpoint"):
        clock.advance(4.0)
    with g.phase("compute"):
        clock.advance(2.0)
    # Only what happened since the previous window().
    assert g.window() == _zeros(checkpoint=4.0, compute=2.0, wall=6.0)

    want = _zeros(compile=10.0, data=1.5, compute=8.0, checkpoint=4.0, other=0.75, wall=24.25)
    assert g.totals() == want
    # Only non-compiling compute is productive: 8 / 24.25 = 32 / 97.
    assert g.goodput() == 32 / 97


def test_goodput_nested_phases_charge_innermost_only():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("eval"):
        clock.advance(1.0)
        with g.phase("compile"):
            clock.advance(3.0)
        clock.advance(1.0)
    assert g.totals() == _zeros(eval=2.0, compile=3.0, wall=5.0)


def test_goodput_window_inside_open_phase_splits_it():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("compute"):
        clock.advance(1.0)
        assert g.window() == _zeros(compute=1.0, wall=1.0)
        clock.advance(2.0)
    assert g.window() == _zeros(compute=2.0, wall=2.0)
    assert g.totals() == _zeros(compute=3.0, wall=3.0)


def test_goodput_phase_closes_on_exception_and_rejects_unknown_names():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with pytest.raises(RuntimeError):
        with g.phase("data"):
            clock.advance(1.0)
            raise RuntimeError("input pipeline died")
    clock.advance(1.0)
    assert g.totals() == _zeros(data=1.0, other=1.0, wall=2.0)
    with pytest.raises(ValueError, match="unknown goodput phase"):
        with g.phase("training"):
            pass


def test_goodput_zero_wall():
    assert Goodput(clock=FakeClock()).goodput() == 0.0


# --------------------------------------------------------------------------- progress line


def test_progress_line_example():
    # 600 steps left at 2.1 steps/s: 285.7 s -> 286 s = 4m46s.
    assert (
        progress_line(400, 1000, 2.10)
        == "[########............]  40% 400/1000 | 2.10 steps/s | ETA 4m46s"
    )


def test_progress_line_edges():
    assert progress_line(0, 1000, 0.0) == "[....................]   0% 0/1000 | - steps/s | ETA ?"
    assert progress_line(5, 10, math.nan) == "[##########..........]  50% 5/10 | - steps/s | ETA ?"
    assert progress_line(5, 10, math.inf) == "[##########..........]  50% 5/10 | - steps/s | ETA ?"
    # Rounds down: 999/1000 is not yet 100% nor a full bar; 1 step at 1 step/s.
    assert progress_line(999, 1000, 1.0) == (
        "[###################.]  99% 999/1000 | 1.00 steps/s | ETA 1s"
    )
    assert progress_line(1000, 1000, 3.0) == (
        "[####################] 100% 1000/1000 | 3.00 steps/s | ETA 0s"
    )
    # Past the end: a full bar, no negative ETA.
    assert progress_line(12, 10, 1.0) == "[####################] 100% 12/10 | 1.00 steps/s | ETA 0s"
    # 3 steps left at 0.5 steps/s: 6 s.
    assert progress_line(1, 4, 0.5, width=4) == "[#...]  25% 1/4 | 0.50 steps/s | ETA 6s"
    # 99990 steps left at 3 steps/s: 33330 s = 9 h 15 min 30 s.
    assert progress_line(10, 100_000, 3.0) == (
        "[....................]   0% 10/100000 | 3.00 steps/s | ETA 9h15m30s"
    )
    # Slow rates keep 4 decimals: 99999 steps at 0.05 steps/s = 1999980 s = 555h33m00s.
    assert progress_line(1, 100_000, 0.05) == (
        "[....................]   0% 1/100000 | 0.0500 steps/s | ETA 555h33m00s"
    )


def test_format_duration():
    assert format_duration(0) == "0s"
    assert format_duration(-3.0) == "0s"
    assert format_duration(59.4) == "59s"
    assert format_duration(286) == "4m46s"
    assert format_duration(3599.6) == "1h00m00s"  # rounds to 3600 s
    assert format_duration(3600 + 2 * 60 + 3) == "1h02m03s"
    assert format_duration(100 * 3600) == "100h00m00s"
