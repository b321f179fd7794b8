import math

import pytest

from jaxspeech.metrics.perf import (
    PEAK_TFLOPS,
    Goodput,
    format_duration,
    mfu,
    peak_flops_per_device,
    progress_line,
)

# --------------------------------------------------------------------------- peak table


@pytest.mark.parametrize(
    "device_kind, dtype, tflops",
    [
        # Real device_kind strings as JAX reports them.
        ("TPU v4", "bfloat16", 275.0),
        ("TPU v5 lite", "bfloat16", 197.0),  # v5e: must not fall through to "tpu v5" (v5p)
        ("TPU v5", "bfloat16", 459.0),  # v5p
        ("TPU v5p", "bf16", 459.0),
        ("TPU v6 lite", "bfloat16", 918.0),
        ("TPU v3", "bfloat16", 61.5),  # 123 per chip, 2 devices per chip
        ("TPU7x", "bfloat16", 1153.5),  # 2307 per chip, 2 devices per chip
        ("TPU v4", "float32", 275.0),  # f32 dots at DEFAULT precision are one bf16 pass
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),
        ("NVIDIA H100 80GB HBM3", "float32", 494.7),  # dense TF32
        ("NVIDIA H100 PCIe", "bfloat16", 756.5),
        ("NVIDIA H100 NVL", "float32", 417.5),
        ("NVIDIA H200", "bfloat16", 989.4),
        ("NVIDIA H200 NVL", "bfloat16", 835.5),
        ("NVIDIA GH200 480GB", "bfloat16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("NVIDIA A100-PCIE-40GB", "float32", 156.0),
        ("NVIDIA A10G", "bfloat16", 70.0),
        ("NVIDIA A10", "bfloat16", 125.0),
        ("NVIDIA L4", "bfloat16", 121.0),
        ("NVIDIA L40S", "bfloat16", 362.05),  # "l4" must not match "l40s"
        ("Tesla V100-SXM2-16GB", "bfloat16", 15.7),  # no bf16 tensor cores
        ("Tesla V100-PCIE-32GB", "float32", 14.0),
        ("NVIDIA B200", "bfloat16", 2250.0),
        ("NVIDIA GB200", "bfloat16", 2500.0),
    ],
)
def test_peak_lookup(device_kind, dtype, tflops):
    assert peak_flops_per_device(device_kind, dtype) == pytest.approx(tflops * 1e12)


def test_peak_unknown_kind_is_none_and_override_wins():
    assert peak_flops_per_device("cpu", "float32") is None
    assert peak_flops_per_device("TFRT_CPU_0", "bfloat16") is None
    assert peak_flops_per_device("cpu", "float32", override_tflops=1.5) == pytest.approx(1.5e12)
    assert peak_flops_per_device("TPU v4", "bfloat16", override_tflops=100.0) == 100e12


def test_peak_rejects_untabulated_dtype():
    with pytest.raises(ValueError, match="float16"):
        peak_flops_per_device("NVIDIA H100 80GB HBM3", "float16")


def test_peak_table_is_dense_and_ordered():
    for key, peaks in PEAK_TFLOPS.items():
        assert key == key.lower()
        assert set(peaks) == {"bfloat16", "float32"}
        # f32 never beats bf16 (TF32 is half of BF16 on tensor cores; TPUs are equal).
        assert 0 < peaks["float32"] <= peaks["bfloat16"], key


# --------------------------------------------------------------------------- mfu


def test_mfu_arithmetic():
    # 8 devices x 100 TFLOP/s = 800 TFLOP/s peak; 400 TFLOP in 2 s = 200 TFLOP/s -> 25%.
    assert mfu(400e12, 2.0, 8, 100e12) == pytest.approx(0.25)
    assert mfu(1e12, 1.0, 1, None) is None
    assert mfu(1e12, 0.0, 1, 1e12) is None
    assert mfu(1e12, 1.0, 0, 1e12) is None


def test_mfu_from_table():
    peak = peak_flops_per_device("NVIDIA A100-SXM4-40GB", "bfloat16")
    # 312 TFLOP/s x 4 GPUs x 0.5 s at 40% utilization.
    flops = 0.4 * 312e12 * 4 * 0.5
    assert mfu(flops, 0.5, 4, peak) == pytest.approx(0.4)


# --------------------------------------------------------------------------- goodput


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def test_goodput_phases_window_and_totals():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("compile"):
        clock.advance(10.0)
    for _ in range(3):
        with g.phase("data"):
            clock.advance(0.5)
        with g.phase("compute"):
            clock.advance(2.0)
        clock.advance(0.1)  # logging, python overhead: "other"
    w = g.window()
    assert w["compile"] == pytest.approx(10.0)
    assert w["data"] == pytest.approx(1.5)
    assert w["compute"] == pytest.approx(6.0)
    assert w["checkpoint"] == 0.0 and w["eval"] == 0.0
    assert w["other"] == pytest.approx(0.3)
    assert w["wall"] == pytest.approx(17.8)

    with g.phase("checkpoint"):
        clock.advance(4.0)
    with g.phase("compute"):
        clock.advance(2.0)
    w2 = g.window()  # only what happened since the previous window()
    assert w2["compute"] == pytest.approx(2.0)
    assert w2["checkpoint"] == pytest.approx(4.0)
    assert w2["compile"] == 0.0
    assert w2["wall"] == pytest.approx(6.0)
    assert w2["other"] == pytest.approx(0.0)

    t = g.totals()
    assert t["compute"] == pytest.approx(8.0)
    assert t["compile"] == pytest.approx(10.0)
    assert t["wall"] == pytest.approx(23.8)
    assert sum(v for k, v in t.items() if k != "wall") == pytest.approx(t["wall"])
    # Only non-compiling compute is productive.
    assert g.goodput() == pytest.approx(8.0 / 23.8)


def test_goodput_nested_phases_charge_innermost_only():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("eval"):
        clock.advance(1.0)
        with g.phase("compile"):
            clock.advance(3.0)
        clock.advance(1.0)
    t = g.totals()
    assert t["eval"] == pytest.approx(2.0)
    assert t["compile"] == pytest.approx(3.0)
    assert t["wall"] == pytest.approx(5.0)
    assert t["other"] == pytest.approx(0.0)


def test_goodput_window_inside_open_phase_splits_it():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with g.phase("compute"):
        clock.advance(1.0)
        assert g.window()["compute"] == pytest.approx(1.0)
        clock.advance(2.0)
    assert g.window()["compute"] == pytest.approx(2.0)
    assert g.totals()["compute"] == pytest.approx(3.0)


def test_goodput_phase_closes_on_exception_and_rejects_unknown_names():
    clock = FakeClock()
    g = Goodput(clock=clock)
    with pytest.raises(RuntimeError):
        with g.phase("data"):
            clock.advance(1.0)
            raise RuntimeError("input pipeline died")
    clock.advance(1.0)
    t = g.totals()
    assert t["data"] == pytest.approx(1.0)
    assert t["other"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown goodput phase"):
        with g.phase("training"):
            pass


def test_goodput_zero_wall():
    assert Goodput(clock=FakeClock()).goodput() == 0.0


# --------------------------------------------------------------------------- progress line


def test_progress_line_example():
    assert (
        progress_line(400, 1000, 2.10)
        == "[########............]  40% 400/1000 | 2.10 steps/s | ETA 4m46s"
    )


def test_progress_line_edges():
    assert progress_line(0, 1000, 0.0) == "[....................]   0% 0/1000 | - steps/s | ETA ?"
    assert progress_line(5, 10, math.nan).endswith("ETA ?")
    # Rounds down: 999/1000 is not yet 100% nor a full bar.
    line = progress_line(999, 1000, 1.0)
    assert line.startswith("[###################.]  99% 999/1000")
    assert line.endswith("ETA 1s")
    assert progress_line(1000, 1000, 3.0) == (
        "[####################] 100% 1000/1000 | 3.00 steps/s | ETA 0s"
    )
    assert progress_line(1, 4, 0.5, width=4) == "[#...]  25% 1/4 | 0.50 steps/s | ETA 6s"
    assert "0.0500 steps/s" in progress_line(1, 100_000, 0.05)


def test_format_duration():
    assert format_duration(0) == "0s"
    assert format_duration(59.4) == "59s"
    assert format_duration(286) == "4m46s"
    assert format_duration(3600 + 2 * 60 + 3) == "1h02m03s"
    assert format_duration(100 * 3600) == "100h00m00s"
