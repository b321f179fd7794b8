"""benchmarks/chaos.py: line parsing, disruption planning, the loss accounting and the
bitwise comparison (pure helpers; the chaos run itself is tests/e2e/test_chaos.py)."""

import importlib.util
import os
import random

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "chaos_benchmark", os.path.join(ROOT, "benchmarks", "chaos.py")
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_parse_line_reads_the_trainer_lines():
    progress = (
        "[#####...............]  25% 4/16 | 5.18 steps/s | ETA 2s | loss 3.978 (utt 217.5) | "
        "grad 8.31 | lr 1.20e-03 | 53 audio s/s | step 180 ms + data wait 3 ms | goodput 1%\n"
    )
    assert bench.parse_line(progress) == {"progress": 4, "total": 16}
    assert bench.parse_line("[####################] 100% 16/16 | 11.79 steps/s | ETA 0s") == {
        "progress": 16,
        "total": 16,
    }
    assert bench.parse_line("checkpoint 12 (every 4 steps): saving in the background (0.1s)") == {
        "saving": 12,
        "why": "every 4 steps",
    }
    assert bench.parse_line("checkpoint 7 (preemption): saving in the background (2.6s)") == {
        "saving": 7,
        "why": "preemption",
    }
    assert bench.parse_line("resumed from step 8 in 2.1s") == {"resumed": 8, "restore_s": 2.1}
    assert bench.parse_line(
        "training steps 6 -> 16; 2 batch shapes: [(8, 48000, 90), (3, 128000, 240)]"
    ) == {"training": 6, "stop": 16}
    assert bench.parse_line(
        "preempted: all processes stopped after step 6 and saved checkpoint 6; rerun the same "
        "command to resume"
    ) == {"preempted": 6}
    assert bench.parse_line(
        "WARNING: checkpoint 8 is corrupt or incomplete (x); moving it to checkpoints_corrupt/"
    ) == {"corrupt": 8}
    for other in (
        "compiled the step for batch 3 x 8.00 s: 0.6 GFLOP",
        "trained steps 0 -> 16 in 0.7 min; goodput 4% (compute 2s, compile 38s)",
        "model: conformer encoder, ctc head, float32 compute, float32 parameters",
        "",
    ):
        assert bench.parse_line(other) is None


def test_plan_kinds():
    assert bench.plan_kinds(0, 0) == []
    assert bench.plan_kinds(1, 5) == ["sigkill_save"]
    assert sorted(bench.plan_kinds(2, 5)) in (sorted(["sigkill_save", k]) for k in bench.KINDS)
    for seed in range(20):
        three = bench.plan_kinds(3, seed)
        assert sorted(three) == sorted(bench.KINDS)  # one of each
        eight = bench.plan_kinds(8, seed)
        assert len(eight) == 8 and set(eight) == set(bench.KINDS)
        assert eight == bench.plan_kinds(8, seed)  # seeded
    assert len({tuple(bench.plan_kinds(8, s)) for s in range(20)}) > 1


def test_windows_spread_over_the_run():
    # 40 steps, 8 disruptions: eight slices of 1..39, from run starts that did not move.
    spans = [bench.window(i, 8, 0, 40) for i in range(8)]
    assert spans == [(1, 4), (5, 9), (10, 14), (15, 19), (20, 24), (25, 29), (30, 34), (35, 39)]
    assert [bench.window(i, 3, 0, 16) for i in range(3)] == [(1, 5), (6, 10), (11, 15)]
    # A run that resumed past its slice strikes right after its start, never at S ...
    assert bench.window(1, 3, 12, 16) == (13, 13)
    assert bench.window(2, 3, 14, 16) == (15, 15)
    assert bench.window(2, 3, 15, 16) is None
    # ... and one that went back still waits for its own slice.
    assert bench.window(3, 8, 4, 40) == (15, 19)


@pytest.mark.parametrize("kind", bench.KINDS)
def test_choose_trigger_makes_progress_and_leaves_room(kind):
    steps, every, total = 40, 4, 8
    for seed in range(30):
        rng = random.Random(seed)
        for start in (0, 3, 4, 17, 30, 35, 37):
            for index in range(total):
                got = bench.choose_trigger(kind, start, steps, every, index, total, rng)
                lo, hi = bench.window(index, total, start, steps)
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
    assert bench.choose_trigger("sigkill_step", 15, 16, 4, 2, 3, rng) is None  # no step left
    assert bench.choose_trigger("sigterm_step", 14, 16, 4, 2, 3, rng) == ("sigterm_step", 15)
    # No save of the schedule left before step 16: a plain kill instead.
    assert bench.choose_trigger("sigkill_save", 13, 16, 4, 2, 3, rng)[0] == "sigkill_step"
    # A slice without a multiple of C: the next save after it.
    assert bench.choose_trigger("sigkill_save", 0, 40, 8, 1, 8, rng) == ("sigkill_save", 8)
    assert bench.choose_trigger("sigkill_save", 0, 40, 16, 1, 8, rng) == ("sigkill_save", 16)


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
    assert bench.seconds_lost(_run(), 8) == pytest.approx(0.9)
    # Resumed from the step this run itself started from: since its `training steps` line
    # (compilation included: all of this run's work was lost).
    assert bench.seconds_lost(_run(), 4) == pytest.approx(21.5)
    assert bench.seconds_lost(_run(), 9) == 0.0  # nothing lost
    assert bench.seconds_lost(_run(signal_t=None), 4) == 0.0  # never signalled
    assert bench.seconds_lost(_run(), 0) == pytest.approx(31.5)  # before it: the whole run


def test_committed_steps(tmp_path):
    assert bench.committed_steps(str(tmp_path)) == []
    for name in ("4", "12", "8.orbax-checkpoint-tmp-1763826000", "16.orbax-checkpoint-tmp"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert bench.committed_steps(str(tmp_path)) == [4, 12]


def test_summarize():
    events = [
        {"kind": "sigkill_step", "steps_lost": 3, "seconds_lost": 1.5, "restore_s": None,
         "resumed": 4, "committed": 4, "exit_code": -9},
        {"kind": "sigterm_step", "steps_lost": 0, "seconds_lost": 0.0, "restore_s": 2.0,
         "resumed": 9, "committed": 9, "exit_code": 0},
        {"kind": "sigkill_save", "steps_lost": 4, "seconds_lost": 0.8, "restore_s": 3.0,
         "resumed": 8, "committed": 8, "exit_code": -9},
    ]  # fmt: skip
    s = bench.summarize(events)
    assert s["max_steps_lost"] == 4 and s["max_seconds_lost"] == 1.5
    assert s["mean_restore_s"] == pytest.approx(2.5)
    assert s["resumed_latest_committed"] and s["sigterm_clean"] and s["kills_during_save"] == 1
    events[1] |= {"steps_lost": 1}
    events[2] |= {"resumed": 4}
    s = bench.summarize(events)
    assert not s["sigterm_clean"] and not s["resumed_latest_committed"]
    assert bench.summarize([])["mean_restore_s"] is None


def test_trees_bitwise_equal():
    a = {"w": np.array([1.0, 0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    same = {"w": np.array([1.0, 0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    assert bench.trees_bitwise_equal(a, same) == (True, [])
    signed = {"w": np.array([1.0, -0.0, np.nan], np.float32), "b": {"x": np.arange(3)}}
    assert bench.trees_bitwise_equal(a, signed) == (False, ["['w']"])  # -0.0 is other bits
    ulp = {"w": np.nextafter(a["w"], 2, dtype=np.float32), "b": {"x": np.arange(3)}}
    assert not bench.trees_bitwise_equal(a, ulp)[0]
    cast = {"w": a["w"].astype(np.float64), "b": {"x": np.arange(3)}}
    assert bench.trees_bitwise_equal(a, cast)[1] == ["['w']"]
    extra = same | {"c": np.zeros(1)}
    assert bench.trees_bitwise_equal(a, extra)[1] == ["['c']"]


def test_train_command_is_the_briefed_one():
    cmd = bench.train_command("/runs/x", "/data/shards", 16, 4)
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
