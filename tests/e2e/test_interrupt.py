"""Ctrl-C (SIGINT) in `python -m jaxspeech.train`: the step in flight finishes and is saved,
one line says how to resume, and the run is `stopped`, never `failed`; during the final
evaluation (everything saved) it stops at once. The read-only tools' one line:
tests/test_cli.py."""

import os
import signal

import pytest

from jaxspeech.runs import lifecycle as status_lib
from tests.e2e.cli import tiny_train_args
from tests.e2e.test_faults import ONE_SHAPE, STOP_BOUND_S, events, start, steps_of, stop

pytestmark = pytest.mark.slow


def _tmp_checkpoints(run) -> list[str]:
    """Orbax's temporary directories of saves that never committed."""
    return [d for d in os.listdir(run / "checkpoints") if "tmp" in d]


def test_ctrl_c_saves_the_step_in_flight_and_says_how_to_resume(corpus, tmp_path):
    _, shards = corpus
    args = tiny_train_args(
        tmp_path,
        shards,
        "--config.train.num_steps=400",
        "--config.train.checkpoint_every=0",
        *ONE_SHAPE,  # one step compiled before Ctrl-C, not two
    )
    proc, reader = start("jaxspeech.train", *args)
    try:
        reader.wait_for(r" 2/400\b", 1, timeout=600)  # the progress line of step 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_BOUND_S)
    finally:
        stop(proc)
    out = reader.text()
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "cannot schedule" not in out, out
    said = [ln for ln in out.splitlines() if ln.startswith("train: interrupted")]
    assert len(said) == 2, out  # when pressed, and where it stopped
    assert said[0].startswith("train: interrupted (Ctrl-C): stopping once the step")
    step = int(said[1].split("stopped after step ")[1].split()[0])
    assert said[1] == (
        f"train: interrupted: stopped after step {step} and saved checkpoint {step}; "
        "rerun the same command to resume"
    )
    assert 2 <= step < 400
    assert steps_of(tmp_path / "checkpoints") == [step] and not _tmp_checkpoints(tmp_path)
    (saved,) = events(tmp_path, "checkpoint_saved")
    assert (saved["step"], saved["reason"]) == (step, "interrupted")
    status = status_lib.run_status(str(tmp_path))
    assert (status["state"], status["step"], status["reason"]) == ("stopped", step, "interrupted")
    assert status["committed"] == step
    assert not events(tmp_path, "failed")


def test_ctrl_c_during_the_final_evaluation_stops_at_once(corpus, tiny_run_copy):
    """A finished run, rerun, only evaluates: its checkpoint is saved, so the first
    Ctrl-C stops at once (the last save commits before the final evaluation starts)."""
    _, shards = corpus
    run = tiny_run_copy  # finished at step 8
    args = tiny_train_args(run, shards, "--config.train.eval_at_end=True")
    proc, reader = start("jaxspeech.train", *args)
    try:
        reader.wait_for(r"^training steps 8 -> 8", 1, timeout=600)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STOP_BOUND_S)
    finally:
        stop(proc)
    out = reader.text()
    assert proc.returncode == 130, out
    assert "Traceback" not in out, out
    # Pressed before the last save's commit was confirmed it ends the same way, through
    # the orderly stop: either line says the step is saved.
    last = [ln for ln in out.splitlines() if ln.startswith("train: ")][-1]
    assert last in (
        "train: interrupted during the final evaluation; checkpoint 8 is saved: rerun the "
        "same command to evaluate it",
        "train: interrupted: stopped after step 8 and saved checkpoint 8; rerun the same "
        "command to resume",
    ), out
    assert steps_of(run / "checkpoints") == [4, 8] and not _tmp_checkpoints(run)
    status = status_lib.run_status(str(run))
    assert (status["state"], status["step"]) == ("stopped", 8), status
