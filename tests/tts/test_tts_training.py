"""FastSpeech2 through the one trainer (config.task = "tts"): a tiny run through the CLI
learns (its mel loss falls, its durations fit), resumes to the same parameters, and its
objective and gradients are the same on an 8-device mesh as on one device, and in
micro-batches as in one pass.

One tiny corpus (tests/tts/corpus.py) and one finished tiny run per session
(tests/tts/conftest.py, shared with the synthesizer's evaluation tests); the runs share
the session's compilation cache (tests/e2e/cli.py)."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
import soundfile as sf

from configs import tts
from jaxspeech.config import build
from jaxspeech.data.plan import PlannedBatch
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.tts import task as tts_task
from jaxspeech.tts.objective import make_tts_grads_fn
from jaxspeech.tts.task import TtsTask
from tests.e2e.cli import run_module, tts_train_args

STEPS = tts.get_config("tiny").train.num_steps


@pytest.fixture(scope="module")
def data(tts_corpus) -> str:
    return str(tts_corpus)


def _train(workdir, data, *extra):
    return run_module("jaxspeech.train", *tts_train_args(workdir, data, *extra))


@pytest.fixture(scope="module")
def tiny_run(tts_tiny_run):
    """The session's finished tiny run (tests/tts/conftest.py): (run, console output)."""
    return tts_tiny_run


def _meta(run, step: int) -> dict:
    with open(os.path.join(run, "checkpoints", str(step), "meta", "metadata")) as f:
        return json.load(f)


def test_a_tiny_run_learns(tiny_run):
    run, out = tiny_run
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    mel = [r["train/loss_mel"] for r in rows if "train/loss_mel" in r]
    # Measured: 1.10 over steps 1-5, 0.65 over steps 36-40 (normalized log-mel L1).
    assert len(mel) == STEPS // 5 and mel[-1] < 0.7 * mel[0], mel
    with open(run / "eval" / f"train-step{STEPS}.json") as f:
        train = json.load(f)
    # Each phoneme's length is its own +-1 frame (uniform): the best guess errs by 2/3 of a
    # frame on average. Measured: 0.82 frames per phoneme after 40 steps (dev: 1.12).
    assert train["duration_error_frames"] < 1.5 and train["num_utts"] == 24
    with open(run / "eval" / f"dev-step{STEPS}.json") as f:
        dev = json.load(f)
    assert dev["num_utts"] == 6 and dev["mcd_utterances"] == 2 and np.isfinite(dev["mcd_dtw_db"])
    assert f"eval dev at step {STEPS}: mel L1 " in out and "frames/phoneme, MCD-DTW" in out
    events = [json.loads(line) for line in open(run / "events.jsonl")]
    assert events[-1]["event"] == "finished" and events[-1]["mel_l1"] == dev["mel_l1"]
    assert _meta(run, STEPS)["config"]["task"] == "tts"
    audio, sr = sf.read(run / "samples" / f"step{STEPS}.wav")
    assert sr == 16000 and len(audio) > 1600 and np.abs(audio).max() > 0.01
    assert sorted(os.listdir(run / "assets")) == [
        "phonemes.json",
        "pitch_stats.json",
        "speakers.json",
        "stats.json",
    ]


def test_resume_continues_to_the_same_parameters(tiny_run, data, tmp_path):
    """The run stopped at its mid-way checkpoint (as `train.run_steps` stops it, or a kill
    after that save) and rerun: the same parameters, bit for bit, as the uninterrupted run
    (the data order, the step's key and the compiled program are functions of (seed, step)
    and the config alone; the loader's position and the target statistics are restored).
    One process: the run is copied with its last checkpoint removed."""
    run, _ = tiny_run
    resumed = tmp_path / "run"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    quick = ["--config.train.eval_at_end=False", "--config.monitor.samples_every=0"]
    out = _train(resumed, data, *quick).stdout
    assert f"resumed from step {STEPS // 2}" in out
    want = _meta(run, STEPS)["params_fingerprint"]
    assert _meta(resumed, STEPS)["params_fingerprint"] == want


# ---------------------------------------------------------------- the objective
@pytest.fixture(scope="module")
def one_device(data, tmp_path_factory):
    """The tiny model's task on one device, its step-0 state and an 8-row batch."""
    config = tts.get_config("tiny")
    config.data.dir = data
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    task = TtsTask(config, mesh)
    task.install_assets(str(tmp_path_factory.mktemp("tts-assets")), False)
    state, setup = task.init_state()
    pipe = task.train_pipeline()
    rows = np.arange(8) * 3  # every speaker, phonemes of every kind
    batch = pipe.load(PlannedBatch(0, rows, np.ones(8, np.float32), 0))
    batch = {k: v for k, v in batch.items() if isinstance(v, np.ndarray)}
    key = jax.random.key(3)
    with jax.set_mesh(mesh):
        want = jax.jit(task.grads_fn(setup))(state.params, state.model_vars, batch, key, 0)
    return task, state, setup, batch, key, jax.device_get(want)


def _close(got, want):
    (g_grads, g_sums), (w_grads, w_sums) = jax.device_get(got), want
    for k in ("objective", "loss_mel", "loss_duration", "loss_pitch", "loss_energy"):
        np.testing.assert_allclose(g_sums[k], w_sums[k], rtol=2e-5, err_msg=k)
    assert g_sums["utterances"] == w_sums["utterances"] == 8
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_grads, w_grads
    )


def test_loss_and_gradients_on_an_8_device_mesh_equal_one_device(one_device, data, tmp_path):
    """Batch over (data, fsdp) = (4, 2), parameters FSDP-sharded by the run's rules."""
    if len(jax.devices()) < 8:
        pytest.skip("needs the 8 simulated CPU devices of tests/conftest.py")
    _, state1, _, batch, key, want = one_device
    config = tts.get_config("tiny")
    config.data.dir = data
    mesh = mesh_lib.make_mesh({"data": 4, "fsdp": 2}, devices=jax.devices()[:8])
    task = TtsTask(config, mesh)
    task.install_assets(str(tmp_path), False)
    spec = build.model_spec(task.make_model, tts_task.target_stats(task.assets), mesh)
    params = jax.device_put(jax.device_get(state1.params), spec.param_shardings)
    model_vars = jax.device_put(jax.device_get(state1.model_vars), spec.var_shardings)
    assert params["token_embed"].sharding.spec[1] == "fsdp"
    arrays = mesh_lib.host_to_global(mesh, batch)
    with jax.set_mesh(mesh):
        grads_fn = make_tts_grads_fn(spec.graphdef, task.cfg, config.tts.loss)
        got = jax.jit(grads_fn)(params, model_vars, arrays, key, 0)
    _close(got, want)


def test_micro_batches_add_up_to_the_whole_batch(one_device):
    """train.grad_accum = 2: each micro-batch's parts weigh by its share of the batch's
    frames and phonemes, so the sums equal the single pass (dropout off in tiny)."""
    task, state, setup, batch, key, want = one_device
    with jax.set_mesh(task.mesh):
        got = jax.jit(task.grads_fn(setup, 2))(state.params, state.model_vars, batch, key, 0)
    _close(got, want)
