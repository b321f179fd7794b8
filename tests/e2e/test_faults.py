"""Faults through the real CLIs: SIGTERM on one host, a dead peer, divergence, a corrupt
latest checkpoint, an incompatible model, and initialization from another run.

(Random SIGKILLs with bitwise comparison to an uninterrupted run: tests/e2e/test_chaos.py.)
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.e2e.cli import ROOT, run_module
from tests.e2e.cli import tiny_train_args as tiny_args
from tests.test_launch_local import LineReader, assert_gone

pytestmark = pytest.mark.slow

CPU1 = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


def start(*module_args, env=CPU1):
    proc = subprocess.Popen(
        [sys.executable, "-m", *module_args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, LineReader(proc)


def stop(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def steps_of(ckpt_dir):
    return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())


def test_sigterm_saves_the_step_in_flight_and_the_run_resumes(corpus, tmp_path):
    _, shards = corpus
    # No periodic saves: only the preemption can have written the checkpoint.
    args = tiny_args(
        tmp_path, shards, "--config.train.num_steps=400", "--config.train.checkpoint_every=0"
    )
    proc, reader = start("jaxspeech.train", *args)
    try:
        reader.wait_for(r"\] +\d+% 3/400 \|", 1, timeout=240)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        seconds = time.monotonic() - t0
    finally:
        stop(proc)
    out = reader.text()
    assert code == 0, out
    m = re.search(r"preempted: all processes stopped after step (\d+) and saved checkpoint \1", out)
    assert m, out
    step = int(m.group(1))
    assert step >= 3 and f"checkpoint {step} (preemption)" in out
    assert seconds < 30, seconds  # "within seconds": the step in flight and one save
    assert steps_of(tmp_path / "checkpoints") == [step]
    again = run_module(
        "jaxspeech.train", *tiny_args(tmp_path, shards, f"--config.train.num_steps={step + 2}")
    ).stdout
    assert f"resumed from step {step}" in again and f"training steps {step} -> {step + 2}" in again


def _multihost(workdir, shards, *extra):
    return [
        "jaxspeech.launch_local",
        "--num_processes=2",
        "--devices_per_process=2",
        "--grace_s=120",  # let the survivors stop on their own: that is what is tested
        "--",
        *tiny_args(workdir, shards, "--config.data.loader_shards=2", *extra),
    ]


def _child_pid(reader, i):
    pattern = rf"^\[p{i}\] jax.distributed: process {i} of 2 \(flags\), pid (\d+)$"
    reader.wait_for(pattern, 1, timeout=120)
    return int(next(m.group(1) for ln in reader.lines if (m := re.match(pattern, ln))))


def test_sigterm_on_one_host_stops_every_host_at_one_agreed_step(corpus, tmp_path):
    _, shards = corpus
    proc, reader = start(
        *_multihost(
            tmp_path, shards, "--config.train.num_steps=400", "--config.train.checkpoint_every=0"
        ),
        env=dict(os.environ),
    )
    try:
        pid1 = _child_pid(reader, 1)
        reader.wait_for(r"^\[p0\] \[.*\] +\d+% 3/400 \|", 1, timeout=300)
        os.kill(pid1, signal.SIGTERM)  # process 1 only, as a preempted TPU host
        code = proc.wait(timeout=90)
    finally:
        stop(proc)
    out = reader.text()
    assert code == 0, out
    steps = [
        re.search(rf"^\[p{i}\] preempted: all processes stopped after step (\d+)", out, re.M)
        for i in range(2)
    ]
    assert all(steps), out
    assert steps[0].group(1) == steps[1].group(1), out  # one step, agreed by both
    step = int(steps[0].group(1))
    # One checkpoint, with both processes' data iterators (test_multihost.py resumes such
    # a 2-process checkpoint; the single-process test above resumes a preempted one).
    assert steps_of(tmp_path / "checkpoints") == [step]
    iterators = os.listdir(tmp_path / "checkpoints" / str(step) / "data_iter")
    assert sorted(f for f in iterators if f.endswith(".json")) == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]


def test_a_dead_peer_makes_the_other_process_exit_within_the_heartbeat(corpus, tmp_path):
    _, shards = corpus
    proc, reader = start(
        *_multihost(tmp_path, shards, "--config.train.num_steps=400", "--heartbeat_timeout_s=10"),
        env=dict(os.environ),
    )
    try:
        pid0, pid1 = _child_pid(reader, 0), _child_pid(reader, 1)
        reader.wait_for(r"^\[p0\] \[.*\] +\d+% 4/400 \|", 1, timeout=300)
        os.kill(pid1, signal.SIGKILL)
        t0 = time.monotonic()
        reader.wait_for(r"launch_local: process 0 exited with code", 1, timeout=60)
        seconds = time.monotonic() - t0
        code = proc.wait(timeout=30)
    finally:
        stop(proc)
    out = reader.text()
    assert code == 128 + signal.SIGKILL, out  # the first failure: process 1's
    assert "launch_local: process 1 exited with code -9 (SIGKILL)" in out
    survivor = re.search(r"launch_local: process 0 exited with code (-?\d+)", out)
    assert int(survivor.group(1)) != 0, out
    assert seconds < 10 + 20, out  # the heartbeat timeout plus slack; never a hang
    # Our message when the survivor is in a collective (it fails at once); JAX's own when
    # it is elsewhere (compiling, reading data) and the heartbeat runs out.
    assert re.search(
        r"^\[p0\] (error: process 0 of 2 stopped|.*detected fatal errors.*another task died)",
        out,
        re.M,
    ), out
    assert_gone([pid0, pid1])


def test_divergence_skips_steps_then_stops_with_diagnostics(corpus, tmp_path):
    _, shards = corpus
    # A learning rate of 1e15 makes every weight huge after one update; from then on the
    # forward pass overflows and every gradient is NaN.
    proc = run_module(
        "jaxspeech.train",
        *tiny_args(
            tmp_path,
            shards,
            "--config.optim.peak_lr=1e15",
            "--config.optim.warmup_steps=1",
            "--config.train.max_nonfinite_steps=3",
            "--config.train.num_steps=12",
            "--config.train.checkpoint_every=0",
        ),
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 3, out + proc.stderr
    skipped = re.findall(r"step (\d+): non-finite loss or gradient .* \((\d) in a row", out)
    assert [int(n) for _, n in skipped] == [1, 2, 3], out
    first, last = int(skipped[0][0]), int(skipped[-1][0])
    assert last == first + 2
    assert f"3 steps in a row ({first}..{last})" in proc.stderr
    report_dir = tmp_path / "diagnostics" / f"nonfinite-step{last}"
    report = json.load(open(report_dir / "report.json"))
    assert report["step"] == last and report["nonfinite_grads"] and not report["nonfinite_params"]
    assert (report_dir / "batch_p0.npz").exists()
    # Skipped means unchanged: the parameter norm is the same at every skipped step.
    norms = {
        r["step"]: r["train/param_norm"]
        for r in map(json.loads, open(tmp_path / "metrics.jsonl"))
        if "train/param_norm" in r
    }
    assert len({norms[s] for s in range(first - 1, last)}) == 1, norms
    assert np.isfinite(norms[first]), norms


def test_corrupt_latest_checkpoint_falls_back_and_bad_configs_are_refused(corpus, tmp_path):
    _, shards = corpus
    run = tmp_path / "run"
    base = ("--config.train.num_steps=6", "--config.train.checkpoint_every=2")
    run_module("jaxspeech.train", *tiny_args(run, shards, *base, "--config.train.run_steps=4"))
    assert steps_of(run / "checkpoints") == [2, 4]
    # Silent corruption of step 4: its stored fingerprint no longer matches its arrays.
    meta_path = run / "checkpoints" / "4" / "meta" / "metadata"
    meta = json.load(open(meta_path))
    meta["params_fingerprint"] = "0" * 32
    json.dump(meta, open(meta_path, "w"))
    out = run_module("jaxspeech.train", *tiny_args(run, shards, *base)).stdout
    assert "WARNING: checkpoint 4 is corrupt or incomplete (parameter fingerprint " in out
    assert "resumed from step 2" in out and "100% 6/6" in out
    assert [d.split("-")[0] for d in os.listdir(run / "checkpoints_corrupt")] == ["4"]

    # Another model in the same workdir: one clear error, and the run's config is kept.
    config_before = (run / "config.json").read_text()
    bad = run_module(
        "jaxspeech.train",
        *tiny_args(run, shards, *base, "--config.model.conformer.dim=48"),
        check=False,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "was written by a different model or optimizer" in bad.stderr
    assert re.search(r"encoder/.*: checkpoint float32\[.*32.*\], this run float32", bad.stderr)
    assert (run / "config.json").read_text() == config_before

    # A new run starts from this run's parameters (fine-tuning) ...
    tuned = run_module(
        "jaxspeech.train",
        *tiny_args(
            tmp_path / "tuned",
            shards,
            f"--config.init_from={run / 'checkpoints' / '6'}",
            "--config.train.num_steps=1",
        ),
    ).stdout
    assert f"initialized parameters from {run / 'checkpoints' / '6'} (step 6)" in tuned
    # ... but not from a run of another model (a path that is no run: test_checkpoint.py).
    refused = run_module(
        "jaxspeech.train",
        *tiny_args(
            tmp_path / "refused",
            shards,
            f"--config.init_from={run}",
            "--config.model.conformer.dim=48",
        ),
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "config.init_from: checkpoint 6" in refused.stderr
    assert "was written by a different model" in refused.stderr
