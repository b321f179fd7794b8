"""Faults through the real CLIs: SIGTERM on one host of two, a dead peer, divergence, a
corrupt latest checkpoint, an incompatible model, and initialization from another run.

(SIGKILLs and a SIGTERM in a single-process run, with the events of the preemption save and
a bitwise comparison to an uninterrupted run: tests/e2e/test_chaos.py.)
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

from jaxspeech import tasks
from jaxspeech.common.errors import UserError
from jaxspeech.runs import events as run_events
from jaxspeech.runs import loading
from tests.e2e.cli import ROOT, cpu_env, run_module, tiny_config
from tests.e2e.cli import tiny_train_args as tiny_args
from tests.test_launch_local import LineReader, assert_gone

pytestmark = pytest.mark.slow

# Bounds on "within seconds" that hold on a loaded 2-core machine: they catch a hang (a
# process waiting for a dead peer, a save that never ends), not a slow host.
STOP_BOUND_S = 120


def start(*module_args, env=None):
    env = env or cpu_env()
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


def events(workdir, *names) -> list[dict]:
    """RUN/events.jsonl's events called `names` (all without names), in order."""
    return [e for e in run_events.read_events(str(workdir)) if not names or e["event"] in names]


# One batch shape (utterances up to 3 s; the loader skips the rest): each shape costs every
# process a compilation, and process 1 cannot load process 0's from the persistent cache
# (only process 0 writes it, under its own keys), so the other waits at the first step.
ONE_SHAPE = ("--config.data.bucket_boundaries=(3.0,)",)


def _multihost(workdir, shards, *extra):
    return [
        "jaxspeech.launch_local",
        "--num_processes=2",
        "--devices_per_process=2",
        "--grace_s=120",  # let the survivors stop on their own: that is what is tested
        "--",
        *tiny_args(workdir, shards, "--config.data.loader_shards=2", *ONE_SHAPE, *extra),
    ]


def _metrics(workdir) -> dict[int, dict]:
    """RUN/metrics.jsonl's training rows by step (the last row of a step wins)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("train/loss")} for r in rows}


def _checkpoint_params(workdir, step) -> list:
    import jax

    from jaxspeech.parallel import mesh as mesh_lib

    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    params = loading.load_run(str(workdir), step=step, mesh=mesh).params
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def _child_pid(reader, i):
    pattern = rf"^\[p{i}\] jax.distributed: process {i} of 2 \(flags\), pid (\d+)$"
    reader.wait_for(pattern, 1, timeout=120)
    return int(next(m.group(1) for ln in reader.lines if (m := re.match(pattern, ln))))


# A non-default sync strategy with state of its own (jaxspeech.parallel.sync): BMUF across
# the two processes (replica axis, blocks of 2 steps), gradients all-reduced inside each,
# with block momentum (the reference's 1 - 1/N: the default, 0, would keep it at zero and
# a wrongly restored momentum would go unseen).
SYNC = (
    "--config.mesh.replica=2",
    "--config.sync.strategy=hierarchical",
    "--config.sync.outer=bmuf",
    "--config.sync.block_steps=2",
    "--config.sync.block_momentum=-1",
)


def test_sigterm_on_one_host_stops_every_host_at_one_agreed_step(corpus, tmp_path):
    """... and the run, under a sync strategy with per-learner state, resumes bitwise."""
    _, shards = corpus
    run = ("--config.train.num_steps=400", "--config.train.checkpoint_every=0", *SYNC)
    proc, reader = start(*_multihost(tmp_path, shards, *run), env=dict(os.environ))
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
    assert [e["step"] for e in events(tmp_path, "preempted")] == [step]  # process 0 writes
    # One checkpoint, with both processes' data iterators (test_multihost.py resumes such
    # a 2-process checkpoint; the single-process test above resumes a preempted one).
    assert steps_of(tmp_path / "checkpoints") == [step]
    iterators = os.listdir(tmp_path / "checkpoints" / str(step) / "data_iter")
    assert sorted(f for f in iterators if f.endswith(".json")) == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]

    # Resumed for 2 more steps, the run equals one never interrupted, bit for bit: the
    # learners' models and optimizer states, the block momentum and the data iterators
    # all came back from the preemption checkpoint.
    resumed = run_module(*_multihost(tmp_path, shards, *run, "--config.train.run_steps=2"))
    assert f"[p0] resumed from step {step}" in resumed.stdout, resumed.stdout
    fresh = tmp_path / "uninterrupted"
    run_module(*_multihost(fresh, shards, *run, f"--config.train.run_steps={step + 2}"))
    for s in (step + 1, step + 2):
        assert _metrics(tmp_path)[s] == _metrics(fresh)[s]
    a, b = (_checkpoint_params(d, step + 2) for d in (tmp_path, fresh))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


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
        reader.wait_for(r"launch_local: process 0 exited with code", 1, timeout=STOP_BOUND_S + 60)
        seconds = time.monotonic() - t0
        code = proc.wait(timeout=30)
    finally:
        stop(proc)
    out = reader.text()
    assert code == 128 + signal.SIGKILL, out  # the first failure: process 1's
    assert "launch_local: process 1 exited with code -9 (SIGKILL)" in out
    survivor = re.search(r"launch_local: process 0 exited with code (-?\d+)", out)
    assert int(survivor.group(1)) != 0, out
    assert seconds < STOP_BOUND_S, out  # the 10 s heartbeat timeout plus slack; never a hang
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
            *ONE_SHAPE,  # one step to compile (the diagnostics save its batch)
        ),
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 3, out + proc.stderr
    skipped = events(tmp_path, "nonfinite_skip")
    assert [e["in_a_row"] for e in skipped] == [1, 2, 3], out
    first, last = skipped[0]["step"], skipped[-1]["step"]
    assert last == first + 2 and f"step {first}: non-finite loss or gradient" in out
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


def test_corrupt_latest_checkpoint_falls_back_and_bad_configs_are_refused(
    corpus, tiny_run_copy, tmp_path
):
    _, shards = corpus
    run = tiny_run_copy  # finished at step 8, checkpoints 4 and 8
    assert steps_of(run / "checkpoints") == [4, 8]
    # Silent corruption of step 8: its stored fingerprint no longer matches its arrays.
    meta_path = run / "checkpoints" / "8" / "meta" / "metadata"
    meta = json.load(open(meta_path))
    meta["params_fingerprint"] = "0" * 32
    json.dump(meta, open(meta_path, "w"))
    out = run_module("jaxspeech.train", *tiny_args(run, shards)).stdout
    assert "WARNING: checkpoint 8 is corrupt or incomplete (parameter fingerprint " in out
    assert "100% 8/8" in out
    (corrupt,) = events(run, "checkpoint_corrupt")
    assert corrupt["step"] == 8 and corrupt["message"].startswith("WARNING: checkpoint 8 is")
    assert [e["step"] for e in events(run, "resumed")] == [4]
    assert [d.split("-")[0] for d in os.listdir(run / "checkpoints_corrupt")] == ["8"]
    assert steps_of(run / "checkpoints") == [4, 8]  # step 8 trained again and saved

    # Another model in the same workdir: one clear error, and the run's config is kept.
    config_before = (run / "config.json").read_text()
    other_model = tiny_config(shards, "--config.model.conformer.dim=48")
    with pytest.raises(UserError, match="was written by a different model or optimizer") as e:
        tasks.train_and_evaluate(other_model, str(run))
    assert re.search(r"encoder/.*: checkpoint float32\[.*32.*\], this run float32", str(e.value))
    assert (run / "config.json").read_text() == config_before
    # ... nor is it a starting point for another model (a path that is no run:
    # test_checkpoint.py).
    other_model.init_from = str(run)
    with pytest.raises(UserError, match="config.init_from: checkpoint 8") as e:
        tasks.train_and_evaluate(other_model, str(tmp_path / "refused"))
    assert "was written by a different model" in str(e.value)

    # A new run of the same model starts from this run's parameters (fine-tuning).
    tuned = tmp_path / "tuned"
    source = run / "checkpoints" / "8"
    out = run_module(
        "jaxspeech.train",
        *tiny_args(tuned, shards, f"--config.init_from={source}", "--config.train.num_steps=1"),
    ).stdout
    assert f"initialized parameters from {source} (step 8)" in out
    assert [(e["event"], e.get("path")) for e in events(tuned)][:2] == [
        ("initialized_from", str(source)),
        ("started", None),
    ]
