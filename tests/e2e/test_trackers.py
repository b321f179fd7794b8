"""Experiment trackers against real ones: a tiny run with monitor.trackers=tensorboard,
mlflow,wandb, SIGKILLed and resumed, read back from an `mlflow server` (SQLite backend,
artifacts served over HTTP) on 127.0.0.1 and from W&B's offline run files; then the
server killed under a tracker in use. One server, one test: the training runs are the
cost, shared by every assertion."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from jaxspeech.metrics import trackers
from jaxspeech.runs import events as run_events
from tests.e2e.cli import ROOT, cpu_env, run_module, train_args
from tests.test_launch_local import LineReader

pytestmark = pytest.mark.slow
SECRET = "s3cr3t-token-never-written"  # a credential in the environment: found nowhere
KEYS = ("train/loss", "train/grad_norm", "perf/price_per_audio_hour")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_mlflow(root) -> tuple[subprocess.Popen, str]:
    """`mlflow server` on a free port with a SQLite backend, artifacts proxied over HTTP
    (as a shared tracking server runs), in a process group of its own; returns it once
    it answers /health."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"),
            *("--port", str(port), "--workers", "1"),
            *("--backend-store-uri", f"sqlite:///{root}/mlflow.db"),
            *("--artifacts-destination", str(root / "artifacts")),
        ],
        cwd=root,
        # No job runner (its worker processes are for MLflow's GenAI jobs, not tracking).
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the CLI runs uvicorn as a child: killed as one group
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # a loaded 2-core machine: a hang bound, not a speed
    try:
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2).read()
                return proc, uri
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no mlflow server"
                time.sleep(0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def _logged(workdir, tracker: str) -> dict:
    try:
        return trackers.read_state(str(workdir)).get(tracker, {}).get("logged", {})
    except Exception:  # noqa: BLE001 - read while being replaced: try again
        return {}


def _committed(workdir, step: int) -> bool:
    return any(
        e["event"] == "checkpoint_committed" and e["step"] == step
        for e in run_events.read_events(str(workdir))
    )


def _killed_after_delivery(args, env, workdir, step: int) -> None:
    """Starts `jaxspeech.train ARGS`; SIGKILLs it once MLflow has train/loss at `step`
    (RUN/trackers.json says so) and checkpoint 4 is committed, before the run's end (its
    final evaluation takes seconds)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxspeech.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reader = LineReader(proc)
    try:
        deadline = time.monotonic() + 600
        while _logged(workdir, "mlflow").get("train/loss", 0) < step or not _committed(workdir, 4):
            assert proc.poll() is None and time.monotonic() < deadline, reader.text()
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before the kill:\n" + reader.text()
    finally:
        proc.kill()
        proc.wait()


def _metrics_jsonl(workdir) -> dict[str, dict[int, set[float]]]:
    """{key: {step: values}} of RUN/metrics.jsonl: a step the resume replayed has two rows
    (the same losses: a resume is bitwise; timings and prices of their own)."""
    out: dict[str, dict[int, set[float]]] = {}
    for line in open(workdir / "metrics.jsonl"):
        row = json.loads(line)
        for k, v in row.items():
            if k != "step":
                out.setdefault(k, {}).setdefault(row["step"], set()).add(v)
    return out


def _wandb_history(workdir) -> list[dict]:
    """The history rows ({"_step", key: value}) of the run's W&B offline files, decoded with
    wandb's own record protobuf from its LevelDB-style log (32 KiB blocks of records:
    crc32, length, type; a record cut over blocks is FIRST, MIDDLE..., LAST)."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for path in sorted(glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data = open(path, "rb").read()
        assert data[:4] == b":W&B", path
        pos, pending = 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header: padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            pending += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # FULL, LAST
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                pending = b""
                if record.WhichOneof("record_type") == "history":
                    items = record.history.item
                    rows.append({"/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_mlflow_and_wandb_get_the_runs_metrics_through_a_kill_and_a_dead_server(
    corpus, tmp_path, monkeypatch
):
    _, shards = corpus
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    server, uri = _start_mlflow(server_dir)
    try:
        _check_run(shards, tmp_path / "run", uri)
        # --- the server killed under a tracker in use: nothing blocks, drops counted
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "dead-server")
        workdir = tmp_path / "dead"
        workdir.mkdir()
        t = trackers.open_trackers("tensorboard,mlflow", str(workdir), {"seed": 1})
        t.scalars(1, {"train/loss": 1.0})
        deadline = time.monotonic() + 600
        while _logged(workdir, "mlflow").get("train/loss") != 1:
            assert time.monotonic() < deadline and not t.dropped()["mlflow"]["values"]
            time.sleep(0.05)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    for step in range(2, 12):  # returns at once whatever the server: put_nowait
        t.scalars(step, {"train/loss": 1.0 / step, "train/lr": 0.1})
    report = t.close(True, timeout=300)
    assert len(report) == 1 and "tracker mlflow: 20 metric values and 0 files" in report[0]
    assert _logged(workdir, "mlflow") == {"train/loss": 1}


def _check_run(shards, workdir, uri: str) -> None:
    from mlflow import MlflowClient

    env = cpu_env() | {
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_EXPERIMENT_NAME": "e2e",
        "MLFLOW_TRACKING_TOKEN": SECRET,  # sent as a bearer token; this server ignores it
        "WANDB_MODE": "offline",
        "WANDB_API_KEY": SECRET,
    }
    args = train_args(
        workdir,
        shards,
        "--config.train.log_every=1",
        "--config.monitor.device_hour_price=2.5",
    )
    # SIGKILLed after steps the last committed checkpoint (4) does not hold were delivered:
    # the resume replays them, and must not send them again.
    _killed_after_delivery([*args, "--config.monitor.trackers=tensorboard,mlflow"], env, workdir, 5)
    killed_state = trackers.read_state(str(workdir))
    out = run_module(
        "jaxspeech.train",
        *args,
        "--config.monitor.trackers=tensorboard,mlflow,wandb",
        env=env,
    ).stdout
    assert "100% 8/8" in out and "per audio hour" in out
    assert "not delivered" not in out, out
    started = [e["step"] for e in run_events.read_events(str(workdir)) if e["event"] == "started"]
    assert started == [0, 4]

    state = trackers.read_state(str(workdir))
    run_id = state["mlflow"]["run_id"]
    assert run_id == killed_state["mlflow"]["run_id"]  # the same MLflow run continued
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("e2e")
    assert [r.info.run_id for r in client.search_runs([experiment.experiment_id])] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.num_steps"] == "8"
    assert run.data.params["monitor.device_hour_price"] == "2.5"
    expected = _metrics_jsonl(workdir)
    assert all(len(v) == 1 for v in expected["train/loss"].values()), expected["train/loss"]
    for key in KEYS:
        history = client.get_metric_history(run_id, key)
        steps = [m.step for m in history]
        assert sorted(steps) == sorted(set(steps)) == sorted(expected[key]), (key, steps)
        assert all(m.value in expected[key][m.step] for m in history), key
    wer = json.load(open(workdir / "eval" / "dev-step8.json"))["wer"]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/dev/wer")] == [
        (8, wer)
    ]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.json", "eval", "samples"} <= artifacts, artifacts
    assert [a.path for a in client.list_artifacts(run_id, "eval")] == ["eval/dev-step8.json"]
    samples = _walk(client, run_id, "samples")
    assert "samples/spectrogram/clean_vs_augmented-step8.png" in samples, samples
    config = json.loads(open(client.download_artifacts(run_id, "config.json")).read())
    assert config["train"]["num_steps"] == 8

    # W&B (offline) joined at the resume: every step this invocation trained, once each.
    rows = _wandb_history(workdir)
    trained = range(5, 9)
    assert [r["_step"] for r in rows if "train/loss" in r] == list(trained)
    for r in rows:
        if "train/loss" in r:
            assert {r["train/loss"]} == expected["train/loss"][r["_step"]]
    assert [r["eval/dev/wer"] for r in rows if "eval/dev/wer" in r] == [wer]

    # Credentials stay in the environment: no file of the run holds one.
    for path in glob.glob(str(workdir / "**"), recursive=True):
        if os.path.isfile(path):
            assert SECRET.encode() not in open(path, "rb").read(), path


def _walk(client, run_id: str, folder: str) -> list[str]:
    out = []
    for a in client.list_artifacts(run_id, folder):
        out += _walk(client, run_id, a.path) if a.is_dir else [a.path]
    return out
