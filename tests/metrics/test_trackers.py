"""jaxspeech.metrics.trackers with recording backends: config mistakes, the resume of a
tracker run, no step sent twice, a full queue and a failing tracker counted, never
blocking. (tests/e2e/test_trackers.py: the real MLflow server and W&B files.)"""

import importlib.util
import json
import threading

import numpy as np

from jaxspeech.metrics import trackers
from jaxspeech.metrics.writers import MetricWriter


class Recorder:
    """A backend that records every call; `gate` (an Event) holds each delivery."""

    def __init__(self, log: list, gate: threading.Event | None = None, fail: bool = False):
        self.name, self.log, self.gate, self.fail = "mlflow", log, gate, fail

    def open(self, run_id, run_name, params):
        self.log.append(("open", run_id, run_name, dict(params)))
        return run_id or "run-1"

    def last_steps(self, keys):
        self.log.append(("last_steps", sorted(keys)))
        return {"train/loss": 3} if "train/loss" in keys else {}

    def metrics(self, step, values):
        if self.gate is not None:
            self.gate.wait()
        if self.fail:
            raise ConnectionError("Connection refused\nsecond line")
        self.log.append(("metrics", step, dict(values)))

    def artifact(self, name, data):
        self.log.append(("artifact", name, data))

    def close(self, ok):
        self.log.append(("close", ok))


def _open(workdir, log, **kwargs):
    backend = lambda name: Recorder(log, **kwargs)  # noqa: E731
    return trackers.open_trackers(
        "tensorboard,mlflow", str(workdir), {"train": {"num_steps": 8}}, backend=backend
    )


def test_mistakes_each_one_line(monkeypatch):
    assert trackers.mistakes("tensorboard", env={}) == []
    (line,) = trackers.mistakes("tensorboard,comet", env={})
    assert "monitor.trackers must be distinct names out of tensorboard, mlflow, wandb" in line
    assert trackers.mistakes("mlflow,mlflow", env={"MLFLOW_TRACKING_URI": "x"})
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "mlflow" else find(n))
    assert trackers.mistakes("mlflow", env={"MLFLOW_TRACKING_URI": "http://h:5000"}) == [
        "monitor.trackers has mlflow, but the mlflow package is not installed: "
        "pip install 'jaxspeech[mlflow]'"
    ]
    monkeypatch.undo()
    (line,) = trackers.mistakes("mlflow", env={})
    assert "set MLFLOW_TRACKING_URI" in line
    assert trackers.mistakes("wandb", env={"WANDB_MODE": "offline"}) == []


def test_flat_params():
    tree = {"train": {"num_steps": 8, "lr": 1e-3}, "data": {"dir": "/d", "b": (1.0, 2.0)}}
    assert trackers.flat_params(tree) == {
        "train.num_steps": "8",
        "train.lr": "0.001",
        "data.dir": "/d",
        "data.b": "[1.0, 2.0]",
    }
    long = trackers.flat_params({"x": "a" * 600})["x"]
    assert len(long) == trackers.PARAM_CHARS and long.endswith("...")


def test_a_resumed_run_continues_the_tracker_run_and_sends_no_step_twice(tmp_path):
    log: list = []
    t = _open(tmp_path, log)
    for step in (1, 2, 3):
        t.scalars(step, {"train/loss": float(step)})
    t.scalars(3, {"eval/dev/wer": 0.5})  # another key at the same step: sent
    t.artifact(3, "samples", "samples/s-step3.md", b"text")
    assert t.close(True) == []
    assert log[0] == ("open", None, tmp_path.name, {"train.num_steps": "8"})
    assert [e[1] for e in log if e[0] == "metrics"] == [1, 2, 3, 3]
    assert log[-1] == ("close", True)
    # The resume replays steps 2..4 (its checkpoint was step 1): 2 and 3 were delivered,
    # step 3 of train/loss just before a kill could note it (the tracker run holds it).
    state = trackers.read_state(str(tmp_path))
    state["mlflow"]["logged"]["train/loss"] = 2
    (tmp_path / trackers.STATE).write_text(json.dumps(state))
    log.clear()
    t = _open(tmp_path, log)
    for step in (2, 3, 4):
        t.scalars(step, {"train/loss": float(step), "eval/dev/wer": 0.25})
    t.artifact(3, "samples", "samples/s-step3.md", b"text")
    assert t.close(True) == []
    assert log[0][:2] == ("open", "run-1")  # the same tracker run
    assert log[1] == ("last_steps", ["eval/dev/wer", "train/loss"])
    sent = [e[1:] for e in log if e[0] == "metrics"]
    assert sent == [(4, {"train/loss": 4.0, "eval/dev/wer": 0.25})]  # per key: up to 3 sent
    assert not [e for e in log if e[0] == "artifact"]
    state = trackers.read_state(str(tmp_path))
    assert state["mlflow"]["logged"] == {"train/loss": 4, "eval/dev/wer": 4, "file:samples": 3}


def test_a_stuck_tracker_never_blocks_and_its_drops_are_counted(tmp_path):
    gate, log = threading.Event(), []
    t = _open(tmp_path, log, gate=gate)
    # Far more than the queue holds, while the tracker is stuck on its first item.
    for step in range(1, trackers.QUEUE_SIZE + 11):
        t.scalars(step, {"train/loss": 1.0, "train/lr": 0.1})
    # One item is being delivered, QUEUE_SIZE wait: at least 9 calls (18 values) dropped.
    dropped = t.dropped()["mlflow"]["values"]
    assert 18 <= dropped <= 20 and dropped % 2 == 0
    report = t.close(True, timeout=0.2)  # still stuck at the end: what is left is dropped
    assert report == [
        f"tracker mlflow: {2 * (trackers.QUEUE_SIZE + 10) - 2} metric values and 0 files not "
        "delivered (first: its queue is full (1000 items)); RUN/metrics.jsonl, RUN/eval/ and "
        "TensorBoard have them"
    ]
    gate.set()


def test_a_failing_tracker_is_reported_by_the_writer(tmp_path, capsys):
    log: list = []
    writer = MetricWriter(str(tmp_path / "tb"), trackers=_open(tmp_path, log, fail=True))
    writer.scalars(1, {"train/loss": 2.0})
    writer.image(1, "spec", np.zeros((4, 5, 3), np.uint8))
    assert writer.close_trackers(ok=False) == {"mlflow": {"values": 1, "files": 0}}
    out = capsys.readouterr().out
    assert "WARNING: tracker mlflow: ConnectionError: Connection refused; training goes on" in out
    assert "WARNING: tracker mlflow: 1 metric values and 0 files not delivered" in out
    png = next(e for e in log if e[0] == "artifact")
    assert png[1] == "samples/spec-step1.png" and png[2][:4] == b"\x89PNG"
    assert log[-1] == ("close", False)
    writer.close()


def test_an_export_sends_its_manifest_to_the_runs_tracker_run(tmp_path):
    log: list = []
    t = _open(tmp_path, log)
    t.scalars(1, {"train/loss": 1.0})
    assert t.close(True) == []
    before = (tmp_path / trackers.STATE).read_text()
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"run": {"step": 1}}')
    log.clear()
    backend = lambda name: Recorder(log)  # noqa: E731
    sent = trackers.send_to_runs(
        str(tmp_path), str(manifest), "export/manifest.json", backend=backend
    )
    assert sent == []
    assert log == [
        ("open", "run-1", tmp_path.name, {}),
        ("last_steps", ["train/loss"]),
        ("artifact", "export/manifest.json", b'{"run": {"step": 1}}'),
        ("close", True),
    ]
    assert (tmp_path / trackers.STATE).read_text() == before  # the training job's file
    # A run without trackers: nothing to send to.
    empty = tmp_path / "other"
    empty.mkdir()
    assert trackers.send_to_runs(str(empty), str(manifest), "m.json", backend=backend) == []
