"""The soft-target loss inside the training step (jaxspeech.training.step with SoftTargets) against
the loss computed directly from the model's CTC logits, and the loader's targets filler on
labeled and untranscribed batches."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import demo
from jaxspeech.config import build
from jaxspeech.data import mixing
from jaxspeech.data.pipeline import PAD_INDEX, PlannedBatch, empty_batch
from jaxspeech.distill import student
from jaxspeech.losses import distill as distill_losses
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.training import batch as batch_lib
from jaxspeech.training import objective
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib
from tests.distill.test_targets import SPLIT, data, reference  # noqa: F401  (shared fixtures)
from tests.e2e.cli import run_module, tiny_train_args
from tests.e2e.conftest import corpus, tiny_run  # noqa: F401

VOCAB, K = 8, 3


def _config():
    config = demo.get_config("tiny")
    config.model.conformer.dim = 16
    config.model.conformer.num_heads = 2
    config.specaug.enabled = False
    config.mesh.data, config.mesh.fsdp = 4, 2
    return config


def _batch(frames, rng):
    """4 labeled rows, 3 soft rows (one with a teacher frame count that does not match),
    1 padding row."""
    b = empty_batch(8, 16000, 5)
    b["audio"][:] = 0.1 * rng.standard_normal(b["audio"].shape)
    b["audio_len"][:] = [16000, 12000, 16000, 9000, 16000, 14000, 10000, 16000]
    b["labels"][:4] = rng.integers(1, VOCAB, (4, 5))
    b["label_len"][:4] = 5
    b["weight"][:4] = 1.0
    logits = rng.standard_normal((8, frames, VOCAB))
    top = np.argsort(-logits, axis=-1)[..., :K]
    logp = np.take_along_axis(jax.nn.log_softmax(logits), top, -1)
    b |= {
        "teacher_idx": top.astype(np.int32),
        "teacher_logp": np.asarray(logp, np.float32),
        "teacher_len": np.zeros(8, np.int32),
        "soft": np.array([0, 0, 0, 0, 1, 1, 1, 0], np.float32),
        "no_target": np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int32),
    }
    return b


def test_step_soft_loss_equals_the_direct_computation():
    config, rng = _config(), np.random.default_rng(0)
    soft = objective.SoftTargets(weight=0.5, kind="kl", rest="spread", temperature=2.0)
    mesh = build.mesh_from_config(config)
    with rules.axis_rules(build.rules_from_config(config)):
        f = config.features.num_mel_bins
        state, setup = state_lib.init_train_state(
            config, VOCAB, mesh, np.zeros(f), np.ones(f), tx=optax.sgd(0.0)
        )
        graphdef = setup.spec.graphdef

        @jax.jit
        def forward(params, model_vars, audio, audio_len):
            model = nnx.merge(graphdef, params, model_vars)
            enc, enc_len = model(audio, audio_len)
            return model.ctc_logits(enc), enc_len

        lengths = jnp.array([16000, 12000, 16000, 9000, 16000, 14000, 10000, 16000])
        logits, enc_len = forward(state.params, state.model_vars, jnp.zeros((8, 16000)), lengths)
        batch = _batch(logits.shape[1], rng)
        batch["teacher_len"][:] = np.asarray(enc_len)
        batch["teacher_len"][6] += 1  # a mismatch: counted, not trained
        step = step_lib.jit_train_step(
            setup,
            step_lib.make_train_step(graphdef, setup.tx, 0, 0, config.loss, soft=soft),
            batch_lib.batch_shardings(mesh, soft_targets=True),
        )
        with jax.set_mesh(mesh):
            _, m = step(state, mesh_lib.host_to_global(mesh, batch))
            logits, enc_len = forward(
                state.params, state.model_vars, batch["audio"], batch["audio_len"]
            )
    loss_b, ok = distill_losses.distill_loss(
        logits,
        enc_len,
        batch["teacher_idx"],
        batch["teacher_logp"],
        batch["teacher_len"],
        rest="spread",
        temperature=2.0,
        kind="kl",
    )
    rows = [4, 5]  # soft and matching
    assert list(np.asarray(ok)[4:7]) == [True, True, False]
    frames = float(np.sum(batch["teacher_len"][rows]))
    tokens = 20.0
    norm = tokens + frames
    np.testing.assert_allclose(m["loss_soft"], np.sum(np.asarray(loss_b)[rows]) / norm, rtol=1e-4)
    assert m["soft_frames"] == frames and m["soft_utterances"] == 2
    assert m["skipped_frame_mismatch"] == 1 and m["skipped_no_target"] == 1
    # the objective: CTC over the labeled rows plus weight x the soft rows' loss
    np.testing.assert_allclose(
        m["loss"] * norm, m["loss_ctc"] * norm + 0.5 * m["loss_soft"] * norm, rtol=1e-4
    )


class _Reader:
    """A stand-in for TargetsReader: targets by global record position."""

    def __init__(self, targets):
        self.targets = targets

    def read_positions(self, positions):
        return [self.targets[p] for p in positions]


def _target(n, fill, missing=None):
    return {
        "id": f"u{fill}",
        "num_frames": n,
        "missing": missing,
        "indices": np.full((n, K), fill, np.int16),
        "logprobs": np.full((n, K), -1.5, np.float16),
    }


def test_filler_labels_untranscribed_rows_and_pads_labeled_ones():
    filler = student.TargetsFiller("unused", "unused", K, frames=[6, 9])
    filler._reader = _Reader(
        {3: _target(4, 3), 7: _target(9, 7), 8: _target(0, 8, {"kind": "too_long", "reason": "x"})}
    )
    planned = PlannedBatch(1, np.array([3, 7, 8, PAD_INDEX]), np.ones(4, np.float32), 0)
    out = empty_batch(4, 100, 5)
    out["weight"][:3] = 1.0
    out["label_len"][:3] = 2
    filler(mixing.OTHER, planned, out)
    assert out["teacher_idx"].shape == (4, 9, K) and out["teacher_logp"].dtype == np.float32
    assert list(out["soft"]) == [1, 1, 0, 0] and list(out["no_target"]) == [0, 0, 1, 0]
    assert list(out["teacher_len"]) == [4, 9, 0, 0]
    assert (out["teacher_idx"][0, :4] == 3).all() and (out["teacher_idx"][0, 4:] == 0).all()
    assert not out["weight"].any() and not out["label_len"].any()  # transcripts unused
    labeled = empty_batch(4, 100, 5)
    labeled["weight"][:] = 1.0
    filler(mixing.LABELED, planned, labeled)
    assert labeled["weight"].all() and not labeled["soft"].any()
    assert labeled["teacher_idx"].shape == (4, 9, K)
    with pytest.raises(ValueError, match="more than the bucket"):
        filler(mixing.OTHER, planned._replace(bucket=0), empty_batch(4, 100, 5))


# ---------------------------------------------------------------- a student run, end to end
def test_student_trains_on_the_schedule(corpus, data, reference, tmp_path):  # noqa: F811
    """The tiny corpus's train split mixed with the targets job's split: steps 1-2 labeled
    only, 3-4 the teacher's targets only, 5-6 alternating, through the real trainer (the
    mixed iterator's bitwise resume mid-phase: tests/data/test_mixing.py)."""
    _, shards = corpus
    run = tmp_path / "student"
    args = tiny_train_args(
        run,
        shards,
        "--config.train.num_steps=6",
        "--config.train.checkpoint_every=0",
        f"--config.distill.other_dir={data}",
        f"--config.distill.other_split={SPLIT}",
        f"--config.distill.targets={reference[0]}",
        "--config.distill.schedule=2:1,4:0,6:2",
        "--config.distill.weight=0.5",
        # the targets split holds one deliberately unreadable record (tests/distill/
        # test_targets.py); the fault budget is the labeled split's (71 records)
        "--config.data.max_corrupt_fraction=0.05",
    )
    out = run_module("jaxspeech.train", *args)
    assert "schedule '2:1,4:0,6:2': until step 2 labeled only" in out.stdout, out.stdout
    rows = {}
    for line in open(run / "metrics.jsonl"):
        r = json.loads(line)
        if "train/loss" in r:
            rows[r["step"]] = r
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    share = [rows[s]["train/labeled_batch_share"] for s in range(1, 7)]
    assert share == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    for s in (3, 4, 6):  # the teacher's rows: a soft loss, no supervised tokens
        assert rows[s]["train/soft_utterances"] > 0 and rows[s]["train/loss_soft"] > 0
        assert rows[s]["train/loss_ctc"] == 0
    for s in (1, 2, 5):
        assert rows[s]["train/soft_utterances"] == 0 and rows[s]["train/loss_ctc"] > 0
    # the targets split's two records without targets (unreadable, too long) are counted
    assert sum(rows[s]["train/skipped_no_target"] for s in (3, 4, 6)) <= 2
