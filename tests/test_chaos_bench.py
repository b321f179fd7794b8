"""benchmarks/chaos.py's library (benchmarks/lib): progress lines and lifecycle events
(run_record), disruption planning (disruptions), the loss accounting (run_record), the
bitwise comparison (resume_check) and the trainer's command line (trainer_process); pure
helpers; the chaos run itself is tests/e2e/test_chaos.py."""

import random

import numpy as np
import pytest

from benchmarks.lib import disruptions, resume_check, run_record, trainer_process
from jaxspeech.runs import events

PROGRESS = (
    "[#####...............]  25% 4/16 | 5.18 steps/s | ETA 2s | loss 3.978 (utt 217.5) | "
    "grad 8.31 | lr 1.20e-03 | 53 audio s/s | step 180 ms + data wait 3 ms | goodput 1%\n"
)


def test_parse_progress_reads_only_the_progress_lines():
    assert run_record.parse_progress(PROGRESS) == (4, 16)
    assert run_record.parse_progress(
        "[####################] 100% 16/16 | 11.79 steps/s | ETA 0s"
    ) == (
        16,
        16,
    )
    # Lifecycle facts are not read from the console any more: RUN/events.jsonl has them.
    for other in (
        "checkpoint 12 (every 4 steps): saving in the background (0.1s)",
        "checkpoint 7 (preemption): saving in the background (2.6s)",
        "resumed from step 8 in 2.1s",
        "training steps 6 -> 16; 2 batch shapes: [(8, 48000, 90), (3, 128000, 240)]",
        "preempted: all processes stopped after step 6 and saved checkpoint 6; rerun the same "
        "command to resume",
        "WARNING: checkpoint 8 is corrupt or incomplete (x); moving it to checkpoints_corrupt/",
        "compiled the step for batch 3 x 8.00 s: 0.6 GFLOP",
        "trained steps 0 -> 16 in 0.7 min; goodput 4% (compute 2s, compile 38s)",
        "model: conformer encoder, ctc head, float32 compute, float32 parameters",
        "",
    ):
        assert run_record.parse_progress(other) is None


def _events(*rows):
    return [{"event": name, "time": t} | fields for name, t, fields in rows]


CORRUPT = (
    "WARNING: checkpoint 8 is corrupt or incomplete (ValueError: x); moving it to "
    "checkpoints_corrupt/ and restoring step 4"
)


def test_events_fill_the_run_record():
    run = run_record.new_run_record(100.0)
    for ev in _events(
        ("checkpoint_corrupt", 101.0, {"message": CORRUPT}),
        ("resumed", 102.5, {"step": 4, "seconds": 2.125}),
        ("started", 103.0, {"step": 4, "stop": 16, "num_steps": 16, "processes": 1}),
        ("checkpoint_saved", 110.25, {"step": 8, "reason": "every 4 steps"}),
        ("checkpoint_committed", 110.75, {"step": 8}),
        ("checkpoint_saved", 111.5, {"step": 9, "reason": "preemption"}),
        ("checkpoint_committed", 111.9, {"step": 9}),
        ("preempted", 112.0, {"step": 9}),
    ):
        run_record.apply_event(run, ev)
    assert (run["start_step"], run["training_t"]) == (4, 103.0)
    assert (run["resumed_step"], run["restore_s"]) == (4, 2.125)
    assert run["saves"] == [[8, 10.25], [9, 11.5]]  # seconds after the process started
    assert run["committed_reported"] == [8, 9]
    assert run["corrupt"] == [8]
    assert run["preempted"] == 9 and run["last_step"] == 9  # the step it stopped after
    assert run["finished"] is None
    # The step of a `checkpoint_corrupt` event: its own field when it has one.
    assert run_record.corrupt_step({"event": "checkpoint_corrupt", "step": 12, "message": ""}) == 12
    assert run_record.corrupt_step({"event": "checkpoint_corrupt", "message": "odd"}) is None

    fresh = run_record.new_run_record(0.0)
    for ev in _events(
        ("started", 5.0, {"step": 0, "stop": 16, "num_steps": 16, "processes": 1}),
        ("finished", 9.0, {"step": 16}),
        ("evaluated", 9.5, {"step": 16, "split": "dev", "wer": 0.5, "cer": 0.1}),  # ignored
    ):
        run_record.apply_event(fresh, ev)
    assert (fresh["start_step"], fresh["resumed_step"], fresh["restore_s"]) == (0, None, None)
    assert fresh["finished"] == 16 and fresh["last_step"] is None


def test_progress_lines_time_the_steps():
    run = run_record.new_run_record(100.0)
    for step, t in ((5, 130.0), (6, 130.2), (6, 131.0), (4, 131.2)):  # a repeated, a late line
        run_record.apply_progress(run, step, t)
    assert run["step_t"] == {5: 130.0, 6: 130.2, 4: 131.2}
    assert run["first_step_t"] == 130.0 and run["last_step"] == 6
    run_record.apply_event(run, {"event": "preempted", "time": 132.0, "step": 7})
    assert run["last_step"] == 7


def test_fires():
    assert not disruptions.fires(None, progress=5)
    assert disruptions.fires(("sigkill_step", 5), progress=5)
    assert disruptions.fires(["sigterm_step", 5], progress=5)
    assert not disruptions.fires(("sigterm_step", 5), progress=4)
    assert not disruptions.fires(("sigkill_step", 8), saved=8)  # a step kill waits for the step
    assert disruptions.fires(("sigkill_save", 8), saved=8)  # the `checkpoint_saved` event of 8
    assert not disruptions.fires(("sigkill_save", 8), progress=8)  # not the step's progress line
    assert not disruptions.fires(("sigkill_save", 8), saved=4)


def test_event_follower_reads_only_this_runs_new_events(tmp_path):

    workdir = str(tmp_path / "run")
    first = events.EventLog(workdir)  # an earlier (killed) run of the same directory
    first.write("started", step=0, stop=16, num_steps=16, processes=1)
    first.write("checkpoint_saved", step=4, reason="every 4 steps")
    first.close()
    follower = run_record.EventFollower(workdir)
    assert follower.poll() == []
    second = events.EventLog(workdir)  # the restart appends to the same file
    second.write("resumed", step=4, seconds=1.5)
    assert [e["event"] for e in follower.poll()] == ["resumed"]
    second.write("started", step=4, stop=16, num_steps=16, processes=1)
    second.write("checkpoint_saved", step=8, reason="every 4 steps")
    got = follower.poll()
    assert [(e["event"], e["step"]) for e in got] == [("started", 4), ("checkpoint_saved", 8)]
    assert follower.poll() == []
    second.close()
    assert run_record.EventFollower(str(tmp_path / "none")).poll() == []  # no file yet


def test_plan_kinds():
    assert disruptions.plan_kinds(0, 0) == []
    assert disruptions.plan_kinds(1, 5) == ["sigkill_save"]
    assert sorted(disruptions.plan_kinds(2, 5)) in (
        sorted(["sigkill_save", k]) for k in disruptions.KINDS
    )
    for seed in range(20):
        three = disruptions.plan_kinds(3, seed)
        assert sorted(three) == sorted(disruptions.KINDS)  # one of each
        eight = disruptions.plan_kinds(8, seed)
        assert len(eight) == 8 and set(eight) == set(disruptions.KINDS)
        assert eight == disruptions.plan_kinds(8, seed)  # seeded
    assert len({tuple(disruptions.plan_kinds(8, s)) for s in range(20)}) > 1


def test_windows_spread_over_the_run():
    # 40 steps, 8 disruptions: eight slices of 1..39, from run starts that did not move.
    spans = [disruptions.window(i, 8, 0, 40) for i in range(8)]
    assert spans == [(1, 4), (5, 9), (10, 14), (15, 19), (20, 24), (25, 29), (30, 34), (35, 39)]
    assert [disruptions.window(i, 3, 0, 16) for i in range(3)] == [(1, 5), (6, 10), (11, 15)]
    # A run that resumed past its slice strikes right after its start, never at S ...
    assert disruptions.window(1, 3, 12, 16) == (13, 13)
    assert disruptions.window(2, 3, 14, 16) == (15, 15)
    assert disruptions.window(2, 3, 15, 16) is None
    # ... and one that went back still waits for its own slice.
    assert disruptions.window(3, 8, 4, 40) == (15, 19)


@pytest.mark.parametrize("kind", disruptions.KINDS)
def test_choose_trigger_makes_progress_and_leaves_room(kind):
    steps, every, total = 40, 4, 8
    for seed in range(30):
        rng = random.Random(seed)
        for start in (0, 3, 4, 17, 30, 35, 37):
            for index in range(total):
                got = disruptions.choose_trigger(kind, start, steps, every, index, total, rng)
                lo, hi = disruptions.window(index, total, start, steps)
                assert got is not None
                k, step = got
                assert start < step <= steps - 1  # past the resume step, before the end
                if kind == "sigkill_save" and lo <= 36:
                    assert k == "sigkill_save" and step % every == 0
                    assert step == -(-lo // every) * every  # the first save from lo on
                else:
                    assert k == ("sigkill_step" if kind == "sigkill_save" else kind)
                    assert lo <= step <= hi


def test_choose_trigger_edges():
    rng = random.Random(0)
    assert disruptions.choose_trigger("sigkill_step", 15, 16, 4, 2, 3, rng) is None  # no step left
    assert disruptions.choose_trigger("sigterm_step", 14, 16, 4, 2, 3, rng) == ("sigterm_step", 15)
    # No save of the schedule left before step 16: a plain kill instead.
    assert disruptions.choose_trigger("sigkill_save", 13, 16, 4, 2, 3, rng)[0] == "sigkill_step"
    # A slice without a multiple of C: the next save after it.
    assert disruptions.choose_trigger("sigkill_save", 0, 40, 8, 1, 8, rng) == ("sigkill_save", 8)
    assert disruptions.choose_trigger("sigkill_save", 0, 40, 16, 1, 8, rng) == ("sigkill_save", 16)


def _run(**kw):
    run = {
        "start_t": 100.0,
        "start_step": 4,
        "training_t": 110.0,
        "step_t": {5: 130.0, 6: 130.2, 7: 130.4, 8: 130.6, 9: 131.0},
        "last_step": 9,
        "signal_t": 131.5,
    }
    return run | kw


def test_seconds_lost():
    # Resumed from a step this run reached: the time since its progress line.
    assert run_record.seconds_lost(_run(), 8) == pytest.approx(0.9)
    # Resumed from the step this run itself started from: since its `started` event
    # (compilation included: all of this run's work was lost).
    assert run_record.seconds_lost(_run(), 4) == pytest.approx(21.5)
    assert run_record.seconds_lost(_run(), 9) == 0.0  # nothing lost
    assert run_record.seconds_lost(_run(signal_t=None), 4) == 0.0  # never signalled
    assert run_record.seconds_lost(_run(), 0) == pytest.approx(31.5)  # before it: the whole run


def test_committed_steps(tmp_path):
    assert run_record.committed_steps(str(tmp_path)) == []
    for name in ("4", "12", "8.orbax-checkpoint-tmp-1763826000", "16.orbax-checkpoint-tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert run_record.committed_steps(str(tmp_path)) == [4, 12]


def test_summarize():
    events = [
        {"kind": "sigkill_step", "steps_lost": 3, "seconds_lost": 1.5, "restore_s": None,
         "resumed": 4, "committed": 4, "exit_code": -9},
        {"kind": "sigterm_step", "steps_lost": 0, "seconds_lost": 0.0, "restore_s": 2.0,
         "resumed": 9, "committed": 9, "exit_code": 0},
        {"kind": "sigkill_save", "steps_lost": 4, "seconds_lost": 0.8, "restore_s": 3.0,
         "resumed": 8, "committed": 8, "exit_code": -9},
    ]  # fmt: skip
    s = run_record.summarize(events)
    assert s["max_steps_lost"] == 4 and s["max_seconds_lost"] == 1.5
    assert s["mean_restore_s"] == pytest.approx(2.5)
    assert s["resumed_latest_committed"] and s["sigterm_clean"] and s["kills_during_save"] == 1
    events[1] |= {"steps_lost": 1}
    events[2] |= {"resumed": 4}
    s = run_record.summarize(events)
    assert not s["sigterm_clean"] and not s["resumed_latest_committed"]
    assert run_record.summarize([])["mean_restore_s"] is None


def test_trees_bitwise_equal():
    a = {"w": np.array([1.0, 0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    same = {"w": np.array([1.0, 0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    assert resume_check.trees_bitwise_equal(a, same) == (True, [])
    signed = {"w": np.array([1.0, -0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    assert resume_check.trees_bitwise_equal(a, signed) == (False, ["['w']"])  # -0.0 is other bits
    ulp = {"w": np.nextafter(a["w"], 2, dtype=np.float32), "b": {"x": np.arange(3)}}
    assert not resume_check.trees_bitwise_equal(a, ulp)[0]
    cast = {"w": a["w"].astype(np.float64), "b": {"x": np.arange(3)}}
    assert resume_check.trees_bitwise_equal(a, cast)[1] == ["['w']"]
    extra = same | {"c": np.zeros(1)}
    assert resume_check.trees_bitwise_equal(a, extra)[1] == ["['c']"]


def test_train_command_is_the_briefed_one():
    cmd = trainer_process.train_command("/runs/x", "/data/shards", 16, 4)
    assert cmd[1:4] == ["-u", "-m", "jaxspeech.train"]
    for flag in (
        "--config.train.num_steps=16",
        "--config.train.checkpoint_every=4",
        "--config.train.log_every=1",
        "--config.monitor.log_batch_ids=True",
        "--config.monitor.samples_every=0",
        "--config.train.eval_at_end=False",
        "--config.data.dir=/data/shards",
    ):
        assert flag in cmd
    assert cmd[cmd.index("--workdir") + 1] == "/runs/x"
    assert cmd[cmd.index("--config") + 1] == "configs/demo.py:tiny"
