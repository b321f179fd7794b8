"""jaxspeech.training.monitor: sample rows of one shape, lifecycle events, data-order logs."""

import jax

from jaxspeech.metrics import perf
from jaxspeech.runs import events as run_events
from jaxspeech.training import monitor


def test_peek_rows_has_one_shape_whatever_the_bucket():
    import numpy as np

    local = {
        "audio": np.ones((3, 50), np.float32),
        "audio_len": np.array([50, 40, 30], np.int32),
        "labels": np.arange(12, dtype=np.int32).reshape(3, 4),
        "label_len": np.array([4, 3, 2], np.int32),
        "weight": np.array([1, 1, 0], np.float32),
    }
    out = monitor.peek_rows(local, 4, 80)  # more rows than the batch has, longer audio
    assert out["audio"].shape == (4, 80) and out["audio"][:3, :50].all()
    assert not out["audio"][:, 50:].any() and not out["audio"][3].any()
    np.testing.assert_array_equal(out["audio_len"], [50, 40, 30, 80])
    np.testing.assert_array_equal(out["weight"], [1, 1, 0, 0])
    np.testing.assert_array_equal(out["labels"][:3], local["labels"])
    cut = monitor.peek_rows(local, 2, 20)  # shorter: cut, lengths capped
    assert cut["audio"].shape == (2, 20)
    np.testing.assert_array_equal(cut["audio_len"], [20, 20])


def test_event_log_appends_across_restarts_and_drops_a_cut_line(tmp_path):
    first = run_events.EventLog(str(tmp_path))
    first.write("started", step=0, stop=8)
    first.write("checkpoint_saved", step=4, reason="every 4 steps")
    first.close()
    with open(tmp_path / run_events.EVENTS, "a") as f:
        f.write('{"event": "checkpoint_comm')  # a kill in the middle of a line
    again = run_events.EventLog(str(tmp_path))
    again.write("resumed", step=4, seconds=1.5)
    again.close()
    events = run_events.read_events(str(tmp_path))
    # The cut record is not an event, and it does not spoil the one written after it.
    names = [e["event"] for e in events]
    assert names == ["started", "checkpoint_saved", "resumed"]
    assert events[1]["reason"] == "every 4 steps" and events[0]["stop"] == 8
    assert all(isinstance(e["time"], float) for e in events)
    assert run_events.read_events(str(tmp_path / "nowhere")) == []


def _window(steps):
    base = {
        "loss": 2.0,
        "utt_loss": 50.0,
        "grad_norm": 1.0,
        "param_norm": 10.0,
        "loss_ctc": 2.0,
        "audio_seconds": 30.0,
        "skipped_infeasible": 1.0,
        "skipped_label_overflow": 0.0,
        "skipped_corrupt": 0.0,
        "nonfinite": 0.0,
        "read_retries": 0,
    }
    return [base | {"loss": 2.0 + i} for i in range(steps)]


def test_window_summary_against_hand_computed_figures():
    fetched = _window(4)
    fetched[3] = fetched[3] | {"nonfinite": 1.0, "loss": float("nan")}
    fetched[1] = fetched[1] | {"skipped_corrupt": 2.0, "read_retries": 3}
    times = {"wall": 8.0, "compute": 4.0, "data": 2.0, "compile": 0.0}
    scalars, f = monitor.window_summary(
        fetched, times, flops=4e12, lr=1e-3, peak_flops=1e12, goodput=0.5
    )
    assert f["loss"] == 3.0  # mean of 2, 3, 4: the skipped step's NaN is left out
    assert f["nonfinite"] == 1.0 and f["skipped_infeasible"] == 4.0
    assert f["audio_per_s"] == 120.0 / 8.0  # 4 steps x 30 s of audio in 8 s
    assert f["steps_per_s"] == 0.5 and f["step_ms"] == 1000.0 and f["wait_ms"] == 500.0
    # 4e12 FLOPs in 4 s on the 8 test devices of 1e12 FLOP/s peak each: MFU 12.5%.
    assert jax.device_count() == 8
    assert abs(f["mfu"] - 0.125) < 1e-12 and scalars["perf/mfu"] == f["mfu"]
    assert scalars["train/audio_hours_per_s"] == 15.0 / 3600
    assert scalars["perf/seconds_compute"] == 4.0 and "perf/seconds_wall" not in scalars
    line = monitor.progress_line(4, 8, f)
    assert "loss 3.000 (utt 50.0)" in line and "1 non-finite steps skipped" in line
    assert "skipped 4 infeasible, 0 too long, 2 unreadable" in line and "MFU 12.5%" in line
    assert scalars["train/skipped_corrupt_records"] == 2.0
    assert scalars["train/read_retries"] == 3.0


def test_window_summary_without_a_peak_has_no_mfu():
    times = {"wall": 1.0, "compute": 1.0, "data": 0.0}
    scalars, f = monitor.window_summary(
        _window(1), times, flops=1.0, lr=0.0, peak_flops=None, goodput=1.0
    )
    assert f["mfu"] is None and "perf/mfu" not in scalars
    assert "MFU" not in monitor.progress_line(1, 1, f)


def test_price_per_audio_hour_counts_every_device_and_the_lost_time():
    # The window: 4 steps x 30 s of audio in 4 s of step compute (30 audio s/s while
    # stepping), on 8 devices at 2.5 a device hour. With goodput 0.5 the run trains 15 s
    # of audio per wall second: 15 audio hours per wall hour for 8 x 2.5 = 20 an hour.
    times = {"wall": 8.0, "compute": 4.0, "data": 2.0, "compile": 0.0}
    kwargs = dict(flops=4e12, lr=1e-3, peak_flops=None, goodput=0.5)
    scalars, f = monitor.window_summary(_window(4), times, device_hour_price=2.5, **kwargs)
    assert abs(f["price_per_audio_hour"] - 20.0 / 15.0) < 1e-12
    assert scalars["perf/price_per_audio_hour"] == f["price_per_audio_hour"]
    assert "| 1.33 per audio hour" in monitor.progress_line(4, 8, f)
    # The README's epoch prices: one H100 at 3.00 an hour, 3,156 audio s/s, goodput 90%.
    per_hour = perf.price_per_audio_hour(3.0, 1, 3156.0, 1.0, 0.9)
    assert abs(per_hour - 3.0 / (3156 * 0.9)) < 1e-15
    assert (round(1e5 * per_hour), round(1e6 * per_hour)) == (106, 1056)
    # Off (price 0) or nothing measured yet (the window only compiled): not reported.
    scalars, f = monitor.window_summary(_window(4), times, **kwargs)
    assert f["price_per_audio_hour"] is None and "perf/price_per_audio_hour" not in scalars
    assert "per audio hour" not in monitor.progress_line(4, 8, f)
    assert perf.price_per_audio_hour(3.0, 1, 30.0, 0.0, 0.5) is None


def test_batch_id_log_replayed_step_keeps_its_last_line_and_survives_a_cut(tmp_path):
    log = run_events.BatchIdLog(str(tmp_path))
    log.write(1, ["a", "b"])
    log.write(2, ["c"])
    log._f.write('{"step": 3, "ids": ["d"')  # killed mid-line
    log._f.close()
    again = run_events.BatchIdLog(str(tmp_path))  # the restart replays step 2 onwards
    again.write(2, ["c2"])
    again.write(3, ["d"])
    again._f.close()
    assert run_events.read_batch_ids(str(tmp_path)) == {1: ["a", "b"], 2: ["c2"], 3: ["d"]}


def test_describe_compiled_with_and_without_a_flop_count():
    class Plan:  # what `Compiled.memory_analysis()` reports, in bytes
        argument_size_in_bytes, temp_size_in_bytes = 3 * 2**20, 2**19

    class Compiled:
        def memory_analysis(self):
            return Plan()

    shapes = {"audio": jax.ShapeDtypeStruct((4, 32000), jax.numpy.float32)}
    counted = monitor.describe_compiled(Compiled(), shapes, 2.5e9, 16000)
    assert counted == (
        "compiled the step for batch 4 x 2.00 s: 2.5 GFLOP; "
        "per device: arguments 3.0 MiB, temporaries 0.5 MiB"
    )
    assert monitor.describe_compiled(Compiled(), shapes, None, 16000).startswith(
        "compiled the step for batch 4 x 2.00 s: FLOPs not counted; per device"
    )
