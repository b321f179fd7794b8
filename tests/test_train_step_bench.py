"""benchmarks/train_step.py and its library: the batch maker (lib/synthetic_batch.py), peak
selection and rates (lib/mfu.py), config overrides (lib/config_overrides.py), the run
settings, the goal line, and the driver's batch halving (with fake workers: nothing is
compiled or timed)."""

import argparse
import importlib.util
import json
import os

import numpy as np
import pytest

from benchmarks.lib import config_overrides, mfu, synthetic_batch
from jaxspeech.training import batch as batch_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "train_step_benchmark", os.path.join(ROOT, "benchmarks", "train_step.py")
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

H100 = "NVIDIA H100 80GB HBM3"


def test_make_batch_shapes_and_label_ranges():
    width = synthetic_batch.label_width(8.0, 10.0)
    assert width == 80
    b = synthetic_batch.make_batch(16, 8.0, label_width=width)
    assert b["audio"].shape == (16, 8 * 16000) and b["audio"].dtype == np.float32
    assert (b["audio_len"] == 8 * 16000).all() and b["audio_len"].dtype == np.int32
    assert b["labels"].shape == (16, 80) and b["labels"].dtype == np.int32
    assert b["label_len"].dtype == np.int32
    # 3-5 tokens per second of audio, 4 on average.
    assert (b["label_len"] >= 24).all() and (b["label_len"] <= 40).all()
    assert 28 <= b["label_len"].mean() <= 36
    valid = np.arange(80)[None, :] < b["label_len"][:, None]
    assert (b["labels"][valid] >= 1).all() and (b["labels"][valid] < synthetic_batch.VOCAB).all()
    assert (b["labels"][~valid] == 0).all()
    assert (b["weight"] == 1).all() and (b["label_overflow"] == 0).all()
    assert set(b) == set(batch_lib.BATCH_RANKS)
    # Seeded: the same batch twice.
    np.testing.assert_array_equal(
        b["labels"], synthetic_batch.make_batch(16, 8.0, label_width=80)["labels"]
    )


def test_label_width_matches_the_pipeline_bucket_padding():
    from jaxspeech.data.pipeline import make_bucket_spec

    for seconds, rate in ((4.0, 10.0), (16.0, 10.0), (2.25, 30.0), (8.0, 10.0)):
        spec = make_bucket_spec((seconds,), 64.0, rate, 16000)
        assert synthetic_batch.label_width(seconds, rate) == spec.max_labels[0]
    assert synthetic_batch.label_width(16.0, 10.0) == 160


def test_settings_defaults_quick_and_overrides():
    cpu = bench.settings(accelerator=False, quick=False)
    assert cpu == {
        "runs": [("S", "float32"), ("M", "float32")],
        "batch": 8,
        "seconds": 8.0,
        "repeats": 5,
    }
    acc = bench.settings(accelerator=True, quick=False)
    assert acc["runs"] == [("S", "bfloat16"), ("M", "bfloat16"), ("L", "bfloat16")]
    assert (acc["batch"], acc["seconds"]) == (64, 16.0)
    # L is added in bfloat16 whatever --dtype says; an explicit --models adds nothing.
    f32 = bench.settings(accelerator=True, quick=False, dtype="float32")
    assert f32["runs"] == [("S", "float32"), ("M", "float32"), ("L", "bfloat16")]
    assert bench.settings(True, False, models="s,m")["runs"] == [
        ("S", "bfloat16"),
        ("M", "bfloat16"),
    ]
    for acc_flag in (False, True):
        quick = bench.settings(accelerator=acc_flag, quick=True)
        assert [m for m, _ in quick["runs"]] == ["S"]
        assert (quick["batch"], quick["seconds"], quick["repeats"]) == (2, 4.0, 2)
    mine = bench.settings(False, True, batch=4, seconds=3, repeats=7)
    assert (mine["batch"], mine["seconds"], mine["repeats"]) == (4, 3.0, 7)


def test_select_peak_table_override_measured_unknown():
    calls = []

    def measure():
        calls.append(1)
        return 1.0e11

    peak, src = mfu.select_peak(H100, "gpu", "bfloat16", 0.0, measure)
    assert (peak, src) == (989.4e12, "table") and not calls
    peak, src = mfu.select_peak(H100, "gpu", "float32")
    assert (peak, src) == (494.7e12, "table")
    peak, src = mfu.select_peak(H100, "gpu", "bfloat16", 500.0, measure)
    assert (peak, src) == (500e12, "override") and not calls
    peak, src = mfu.select_peak("cpu", "cpu", "float32", 0.0, measure)
    assert (peak, src) == (1.0e11, "measured_matmul") and calls == [1]
    assert mfu.select_peak("cpu", "cpu", "bfloat16", 0.0, 2.5e10) == (2.5e10, "measured_matmul")
    assert mfu.select_peak("cpu", "cpu", "float32", 0.3) == (0.3e12, "override")
    # An accelerator the table does not know: no MFU rather than a CPU-style measurement.
    assert mfu.select_peak("Fancy NPU 9", "gpu", "bfloat16", 0.0, measure) == (None, "unknown")


def test_rates_and_mfu():
    r = mfu.rates(2e12, 0.5, 64, 16.0, 2, 1e12)
    assert r["audio_s_per_s"] == pytest.approx(64 * 16 / 0.5)
    assert r["achieved_tflops"] == pytest.approx(4.0)
    assert r["peak_tflops"] == pytest.approx(2.0)  # all devices together
    assert r["mfu"] == pytest.approx(2.0)  # 4 achieved / 2 peak (fake numbers)
    none = mfu.rates(2e12, 0.5, 64, 16.0, 2, None)
    assert none["mfu"] is None and none["peak_tflops"] is None


def test_smaller_batch():
    assert bench.smaller_batch(64, 1) == 32
    assert bench.smaller_batch(64, 8) == 32
    assert bench.smaller_batch(24, 8) == 8
    assert bench.smaller_batch(12, 8) is None
    assert bench.smaller_batch(1, 1) is None


def test_goal_line():
    row = {"model": "L", "dtype": "bfloat16", "device": H100, "mfu": 0.45}
    assert "applies to accelerators" in bench.goal_line([row], accelerator=False)
    assert "PASS (45.0%)" in bench.goal_line([row], accelerator=True)
    assert "FAIL (30.0%)" in bench.goal_line([row | {"mfu": 0.3}], accelerator=True)
    assert "--peak_tflops" in bench.goal_line([row | {"mfu": None}], accelerator=True)
    assert "not measured in this run" in bench.goal_line([], accelerator=True)
    skipped = [{"model": "L", "dtype": "bfloat16", "does_not_fit": True}]
    assert "fit in device memory" in bench.goal_line([], True, skipped)


def _fake_row(size, dtype, batch, seconds, repeats):
    return {
        "model": size,
        "device": H100,
        "dtype": dtype,
        "num_devices": 1,
        "params_m": 116.6,
        "batch": batch,
        "seconds": seconds,
        "label_width": 160,
        "repeats": repeats,
        "step_ms": 100.0,
        "model_gflop_per_step": 49474.8,  # 0.4 x 989.4 TFLOP/s x 0.1 s + a bit
        "compile_s": 1.0,
        "loss_first": 60.0,
        "loss_last": 59.0,
        "xla_argument_mib": 1400.0,
        "xla_temp_mib": 40000.0,
        "peak_bytes_in_use_mib": 45000.0,
    }


def test_driver_halves_a_default_batch_that_does_not_fit(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_worker(what):
        calls.append(what)
        if what[0] == "probe":
            return {"platform": "gpu", "device_kind": H100, "device_count": 1, "jax": "x"}
        size, dtype = what[0].split(":")
        batch, seconds, repeats = int(what[1]), float(what[2]), int(what[3])
        if size == "L" and batch > 32:
            return bench.does_not_fit(size, batch, 90 * 2**30, 79 * 2**30)
        return _fake_row(size, dtype, batch, seconds, repeats)

    monkeypatch.setattr(bench, "run_worker", fake_worker)
    out = tmp_path / "train_step.json"
    args = argparse.Namespace(
        quick=False,
        models=None,
        dtype=None,
        batch=None,
        seconds=None,
        repeats=None,
        peak_tflops=0.0,
        device_hour_price=2.0,
        set=["model.head=ctc"],
        peer=False,
        peer_python=None,
        out=str(out),
    )
    result = bench.run(args)
    # --set reaches every model's worker and the JSON.
    assert all(c[4:] == ["model.head=ctc"] for c in calls[1:])
    assert result["overrides"] == ["model.head=ctc"]
    assert [c[:2] for c in calls[1:]] == [
        ["S:bfloat16", "64"],
        ["M:bfloat16", "64"],
        ["L:bfloat16", "64"],
        ["L:bfloat16", "32"],
    ]
    saved = json.loads(out.read_text())
    assert saved["rows"] == result["rows"] and len(saved["rows"]) == 3
    large = saved["rows"][2]
    assert (large["batch"], large["batch_reduced_from"]) == (32, 64)
    assert large["peak_source"] == "table" and large["peak_tflops"] == pytest.approx(989.4)
    assert large["mfu"] == pytest.approx(0.5, rel=0.01)
    assert large["audio_s_per_s"] == pytest.approx(32 * 16 / 0.1)
    assert saved["does_not_fit"][0]["batch"] == 64
    # 1 device at 2.0 an hour trains 5120 audio hours an hour (step time only).
    assert large["price_per_audio_hour"] == pytest.approx(2.0 / 5120)
    printed = capsys.readouterr().out
    assert "L bfloat16: 0.0003906 per audio hour trained at 2 per device hour x 1" in printed
    assert "PASS" in printed and "does not fit" in printed
    assert printed.count("| L |") == 1

    # An explicit --batch is never reduced: L is reported as not fitting and skipped.
    calls.clear()
    result = bench.run(argparse.Namespace(**(vars(args) | {"batch": 64})))
    assert [r["model"] for r in result["rows"]] == ["S", "M"]
    assert "fit in device memory" in result["goal"]


def test_set_overrides_change_existing_entries_and_reject_unknown_ones():
    from configs import conformer

    config = conformer.get_config("S")
    config_overrides.apply_overrides(
        config, ["model.head=ctc", "model.conformer.dropout=0.0", "train.num_steps=7"]
    )
    assert config.model.head == "ctc"  # not a Python literal: kept as a string
    assert config.model.conformer.dropout == 0.0 and config.train.num_steps == 7
    for bad, says in [
        ("model.conformer.no_such_key=1", "no entry"),
        ("model.nothing.dropout=1", "no entry"),
        ("model.head", "KEY=VALUE"),
        ("train.num_steps='many'", "train.num_steps"),  # ConfigDict's type check
    ]:
        with pytest.raises(SystemExit, match=says):
            config_overrides.apply_overrides(config, [bad])


def _load_kernel_profile():
    spec = importlib.util.spec_from_file_location(
        "kernel_profile", os.path.join(ROOT, "benchmarks", "kernel_profile.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_profile_sums_one_modules_device_kernels_per_step(tmp_path):
    import gzip

    kp = _load_kernel_profile()
    meta = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}},
    ]

    def kernel(name, ts, dur, pid=1, module="jit_train_step"):
        return {"ph": "X", "pid": pid, "tid": 1, "name": name, "ts": ts, "dur": dur,
                "args": {"hlo_module": module}}  # fmt: skip

    events = meta + [
        kernel("gemm_fusion_dot_3", 0.0, 100.0),
        kernel("loop_add_fusion_1", 100.0, 2.0),
        kernel("loop_add_fusion_22", 110.0, 4.0),
        kernel("nvjet_sm90_tst_128x160", 120.0, 50.0),
        kernel("copy.1", 180.0, 20.0),  # ends at 200 us: the span
        kernel("gemm_fusion_dot_3", 0.0, 999.0, pid=7),  # a host event: not device time
        kernel("gemm_fusion_dot_3", 0.0, 999.0, module="jit_other"),  # another program
    ]
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    out = tmp_path / "summary.json"
    s = kp.main([str(path), "--steps", "2", "--top", "3", "--out", str(out)])
    assert json.loads(out.read_text())["busy_ms"] == s["busy_ms"]
    # Per step of 2: busy (100 + 2 + 4 + 50 + 20) / 2 us, span 200 / 2 us.
    assert s["busy_ms"] == pytest.approx(0.088) and s["span_ms"] == pytest.approx(0.1)
    assert s["kernels_per_step"] == 2.5 and s["short_kernels_per_step"] == 1.0
    assert s["short_kernel_ms"] == pytest.approx(0.003)
    assert s["matmul_ms"] == pytest.approx(0.075)
    assert s["matmul_share_of_busy"] == pytest.approx(150 / 176)
    assert [r["kernel"] for r in s["top"]] == ["gemm_fusion_dot", "nvjet_sm90_tst_128x160", "copy"]
    assert s["top"][0]["calls"] == 0.5
    # A trace without that module's device kernels (e.g. a CPU trace) is an error.
    with pytest.raises(SystemExit, match="no device kernels"):
        kp.main([str(path), "--module", "jit_missing"])
