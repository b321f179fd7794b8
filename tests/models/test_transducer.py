"""Transducer parts and the ASR model's heads, against numpy re-computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import demo
from jaxspeech.config import build
from jaxspeech.decoding import search
from jaxspeech.losses import rnnt
from jaxspeech.losses.ctc import ctc_loss
from jaxspeech.models.transducer import Joiner, LSTMPredictor, StatelessPredictor
from jaxspeech.training.objective import model_losses, rnnt_loss_scales

V = 7


def _labels():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.integers(1, V, (3, 5)), jnp.int32)


def _stepwise(predictor, labels_bu):
    """Outputs of `step` fed blank (start) then each label: (B, U+1, D)."""
    b = labels_bu.shape[0]
    state = predictor.init_state(b)
    out, state = predictor.step(state, jnp.zeros((b,), jnp.int32))
    outs = [out]
    for u in range(labels_bu.shape[1]):
        out, state = predictor.step(state, labels_bu[:, u])
        outs.append(out)
    return jnp.stack(outs, axis=1)


@pytest.mark.parametrize("context_size", [1, 2, 3])
def test_stateless_predictor_matches_numpy_and_its_step(context_size):
    p = StatelessPredictor(V, 6, context_size=context_size, rngs=nnx.Rngs(0))
    p.conv[...] = jax.random.normal(jax.random.key(1), p.conv.shape)  # not the uniform init
    labels = _labels()
    got = np.asarray(p(labels))
    emb, w = np.asarray(p.embed[...]), np.asarray(p.conv[...])
    want = np.zeros_like(got)
    for b in range(labels.shape[0]):
        seq = [0] * context_size + list(np.asarray(labels[b]))  # blank before the first label
        for u in range(labels.shape[1] + 1):
            ctx = seq[u : u + context_size]  # the K labels ending at label u (1-based)
            want[b, u] = np.maximum(sum(w[k] * emb[ctx[k]] for k in range(context_size)), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(_stepwise(p, labels)), got, atol=1e-6)


def test_lstm_predictor_step_equals_sequence():
    p = LSTMPredictor(V, 8, num_layers=2, hidden=12, rngs=nnx.Rngs(0))
    labels = _labels()
    np.testing.assert_allclose(np.asarray(_stepwise(p, labels)), np.asarray(p(labels)), atol=1e-5)
    # Row u depends on labels 1..u only (causal): changing label 3 leaves rows 0..2 alone.
    changed = labels.at[:, 2].set((labels[:, 2] % (V - 1)) + 1)
    np.testing.assert_allclose(np.asarray(p(changed))[:, :3], np.asarray(p(labels))[:, :3])
    assert not np.allclose(np.asarray(p(changed))[:, 3:], np.asarray(p(labels))[:, 3:])


def test_joiner_is_out_of_tanh_of_sum():
    j = Joiner(5, 4, 6, V, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    enc, pred = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 4, 4))
    a = np.asarray(j.enc_proj(jnp.asarray(enc, jnp.float32)))
    b = np.asarray(j.pred_proj(jnp.asarray(pred, jnp.float32)))
    got = np.asarray(j.joint(jnp.asarray(a)[:, :, None], jnp.asarray(b)[:, None]))
    w, bias = np.asarray(j.out.kernel[...]), np.asarray(j.out.bias[...])
    want = np.tanh(a[:, :, None] + b[:, None]) @ w + bias
    assert got.shape == (2, 3, 4, V) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _config(head, rnnt_loss="full", encoder="conformer"):
    c = demo.get_config("tiny")
    c.model.head, c.loss.rnnt, c.model.encoder = head, rnnt_loss, encoder
    return c


def _batch():
    rng = np.random.default_rng(2)
    b = 4
    return {
        "audio": jnp.asarray(0.1 * rng.standard_normal((b, 12000)), jnp.float32),
        "audio_len": jnp.array([12000, 9000, 6000, 12000]),
        "labels": jnp.asarray(rng.integers(1, V, (b, 6)), jnp.int32),
        "label_len": jnp.array([6, 3, 0, 5]),
        "weight": jnp.array([1.0, 1.0, 1.0, 0.0]),  # the last row is padding
        "label_overflow": jnp.zeros(b, jnp.int32),
        "corrupt": jnp.zeros(b, jnp.int32),
    }


@pytest.mark.parametrize("head", ["ctc", "rnnt", "ctc+rnnt"])
def test_heads_have_their_parameters_and_losses(head):
    config = _config(head)
    model = build.make_model(config, V, 0)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    assert ("ctc" in params) == ("ctc" in head)
    assert ("transducer" in params) == ("rnnt" in head)
    batch = _batch()
    # Recompute the loss by hand with deterministic features (no SpecAugment, no dropout).
    config.specaug.enabled = False
    model = build.make_model(config, V, 0)
    loss, aux = model_losses(model, batch, jax.random.key(0), jnp.int32(0), config.loss, 0)
    enc, enc_len = model(batch["audio"], batch["audio_len"])
    total = np.zeros(4)
    if "ctc" in head:
        ctc_b, _ = ctc_loss(model.ctc_logits(enc), enc_len, batch["labels"], batch["label_len"])
        total += np.asarray(ctc_b) * (config.loss.ctc_weight if "rnnt" in head else 1.0)
    if "rnnt" in head:
        tr = model.transducer
        rnnt_b, _ = rnnt.rnnt_loss(
            tr.joiner.joint,
            tr.joiner.enc_proj(enc),
            enc_len,
            tr.joiner.pred_proj(tr.predictor(batch["labels"])),
            batch["labels"],
            batch["label_len"],
        )
        total += np.asarray(rnnt_b)
    if head == "rnnt":
        # At step 0 a transducer without a CTC head also learns from its acoustic-only
        # loss at weight 1 (objective.am_only_weight; checked against brute force in
        # tests/test_learning.py).
        am_b, _ = model.forward_am_only(
            enc, enc_len, batch["labels"], batch["label_len"], blank_id=0
        )
        total += np.asarray(am_b)
    w = np.asarray(batch["weight"])
    # The objective is summed over utterances; the step divides it by the batch's tokens.
    np.testing.assert_allclose(float(loss), np.sum(w * total), rtol=1e-5)
    np.testing.assert_allclose(float(aux["tokens"]), np.sum(w * np.asarray(batch["label_len"])))
    assert float(aux["utterances"]) == 3.0 and float(aux["skipped_infeasible"]) == 0.0


def test_infeasible_ctc_target_is_masked_and_counted_for_both_heads():
    config = _config("ctc+rnnt")
    config.specaug.enabled = False
    model = build.make_model(config, V, 0)
    batch = _batch()
    # 0.1 s of audio: 10 feature frames -> 1 encoder frame, too few for 6 CTC labels.
    batch["audio_len"] = batch["audio_len"].at[0].set(1600)
    loss, aux = model_losses(model, batch, jax.random.key(0), jnp.int32(0), config.loss, 0)
    assert float(aux["skipped_infeasible"]) == 1.0 and float(aux["utterances"]) == 2.0
    assert np.isfinite(float(loss))


def test_pruned_loss_warmup_scales():
    cfg = demo.get_config("default").loss
    s0, p0 = rnnt_loss_scales(cfg, jnp.float32(0))
    sh, ph = rnnt_loss_scales(cfg, jnp.float32(cfg.rnnt_warmup_steps / 2))
    s1, p1 = rnnt_loss_scales(cfg, jnp.float32(10 * cfg.rnnt_warmup_steps))
    np.testing.assert_allclose([s0, p0], [1.0, 0.1])
    np.testing.assert_allclose([sh, ph], [(1 + cfg.simple_scale) / 2, 0.55], rtol=1e-6)
    np.testing.assert_allclose([s1, p1], [cfg.simple_scale, 1.0])


def test_bad_head_encoder_and_decoder_are_clear_errors():
    with pytest.raises(ValueError, match="unknown head 'attention'"):
        build.make_model(_config("attention"), V, 0)
    with pytest.raises(ValueError, match="model.encoder must be one of"):
        build.make_model(_config("ctc", encoder="transformer"), V, 0)
    config = _config("ctc")
    config.decoding.method = "rnnt_beam"
    with pytest.raises(ValueError, match="needs a model with that head"):
        search.decoding_method(config)
    config.decoding.method = "auto"
    assert search.decoding_method(config) == "ctc_greedy"
    assert search.decoding_method(_config("ctc+rnnt")) == "rnnt_greedy"
