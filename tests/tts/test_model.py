"""FastSpeech2: shapes, masks, padding invariance, duration control, losses against numpy,
learning on a fixed batch, and the same loss and gradient on an 8-device mesh.

One tiny model; every jitted function is compiled for few shapes (compiles dominate)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel.rules import state_shardings
from jaxspeech.tts.losses import fastspeech2_loss
from jaxspeech.tts.model import FastSpeech2, durations_from_log

B, N, EXTRA_PAD, T, MELS, VOCAB, SPEAKERS = 8, 6, 4, 32, 16, 12, 3


def _model(seed: int = 0, pos_enc: str = "rel", reduction: int = 1) -> FastSpeech2:
    model = FastSpeech2(
        vocab_size=VOCAB,
        num_speakers=SPEAKERS,
        dim=32,
        num_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        ff_mult=2,
        conv_kernel=3,
        n_mels=MELS,
        variance_channels=16,
        variance_kernel=3,
        embed_kernel=3,
        dropout=0.1,
        pos_enc=pos_enc,
        reduction=reduction,
        rngs=nnx.Rngs(seed),
    )
    # Untrained durations are ~exp(0) - 1 = 0 frames (clipped to 1): start the duration
    # predictor near 4 frames a token so that `duration_scale` has something to scale.
    model.duration_predictor.out.bias[...] = jnp.full((1,), math.log(5.0), jnp.float32)
    return model


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    """B sequences of 1..N tokens (0-padded), durations 0..4 for real tokens (some 0),
    the last row longer than T frames (overflow), random targets."""
    rng = np.random.default_rng(seed)
    lengths = np.array([N, 1, 3, 5, N, 2, 4, N])
    real = np.arange(N)[None, :] < lengths[:, None]
    tokens = np.where(real, rng.integers(1, VOCAB, (B, N)), 0).astype(np.int32)
    durations = np.where(real, rng.integers(0, 5, (B, N)), 0).astype(np.int32)
    durations[-1] = np.where(real[-1], 8, 0)  # 48 frames > T
    return {
        "tokens": tokens,
        "speaker": rng.integers(0, SPEAKERS, B).astype(np.int32),
        "durations": durations,
        "pitch": np.where(real, rng.standard_normal((B, N)), 0).astype(np.float32),
        "energy": np.where(real, rng.standard_normal((B, N)), 0).astype(np.float32),
        "mel": rng.standard_normal((B, T, MELS)).astype(np.float32),
    }


def _padded(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same batch with EXTRA_PAD padding tokens appended to every sequence."""
    pad = lambda a: np.pad(a, ((0, 0), (0, EXTRA_PAD)))  # noqa: E731
    return batch | {k: pad(batch[k]) for k in ("tokens", "durations", "pitch", "energy")}


@nnx.jit(static_argnums=3)
def _forward_and_synthesize(model, batch, scale, max_frames):
    """The training forward (dropout off) and `synthesize` at a traced `scale`."""
    pred = model(
        batch["tokens"],
        batch["speaker"],
        batch["durations"],
        batch["pitch"],
        batch["energy"],
        max_frames,
        deterministic=True,
    )
    return pred, model.synthesize(batch["tokens"], batch["speaker"], max_frames, scale)


@pytest.fixture(scope="module")
def outputs():
    """{name: (training forward, [synthesize at scale 1, at scale 2])} for the batch and
    its padded copy (one compile per shape: the scale is traced)."""
    model, batch = _model(), _batch()
    out = {}
    for name, b in (("plain", batch), ("padded", _padded(batch))):
        runs = [_forward_and_synthesize(model, b, jnp.float32(s), T) for s in (1.0, 2.0)]
        out[name] = jax.tree.map(np.asarray, (runs[0][0], [synth for _, synth in runs]))
    return out


def test_output_shapes_and_masks(outputs):
    pred, synth = outputs["plain"]
    batch = _batch()
    assert pred["mel"].shape == (B, T, MELS) and pred["mel"].dtype == np.float32
    for key in ("log_duration", "pitch", "energy"):
        assert pred[key].shape == (B, N) and pred[key].dtype == np.float32
        assert np.all(pred[key][batch["tokens"] == 0] == 0.0)
    np.testing.assert_array_equal(pred["token_mask"], batch["tokens"] != 0)
    totals = batch["durations"].sum(1)
    np.testing.assert_array_equal(pred["frame_mask"], np.arange(T)[None] < totals[:, None])
    np.testing.assert_array_equal(pred["overflow"], totals > T)
    assert pred["overflow"][-1] and not pred["overflow"][:-1].any()
    assert np.all(pred["mel"][~pred["frame_mask"]] == 0.0)
    mel, frame_mask, durations = synth[0]
    assert mel.shape == (B, T, MELS) and frame_mask.shape == (B, T)
    assert durations.shape == (B, N) and durations.dtype == np.int32
    np.testing.assert_array_equal(frame_mask, np.arange(T)[None] < durations.sum(1, keepdims=True))
    assert np.all(mel[~frame_mask] == 0.0) and np.all(np.isfinite(mel))


def test_padding_tokens_change_no_valid_output(outputs):
    (pred, synth), (pred_pad, synth_pad) = outputs["plain"], outputs["padded"]
    mask = pred["token_mask"]
    for key in ("log_duration", "pitch", "energy"):
        np.testing.assert_allclose(pred_pad[key][:, :N][mask], pred[key][mask], atol=1e-5)
    np.testing.assert_array_equal(pred_pad["frame_mask"], pred["frame_mask"])
    np.testing.assert_allclose(pred_pad["mel"], pred["mel"], atol=1e-5)
    for (mel, frame_mask, durations), (mel_p, mask_p, durations_p) in zip(synth, synth_pad):
        np.testing.assert_array_equal(durations_p[:, :N], durations)
        assert np.all(durations_p[:, N:] == 0)
        np.testing.assert_array_equal(mask_p, frame_mask)
        np.testing.assert_allclose(mel_p, mel, atol=1e-5)


def test_rotary_positions_keep_shapes_masks_and_padding_invariance():
    """pos_enc="rope" (configs/tts.py's): the same contract as the relative positions'."""
    model, batch = _model(pos_enc="rope"), _batch()
    assert model.encoder[0].attn.__class__.__name__ == "RotaryAttention"
    runs = [_forward_and_synthesize(model, b, jnp.float32(1.0), T) for b in (batch, _padded(batch))]
    (pred, synth), (pred_pad, synth_pad) = jax.tree.map(np.asarray, runs)
    np.testing.assert_array_equal(pred["frame_mask"], pred_pad["frame_mask"])
    assert np.all(pred["mel"][~pred["frame_mask"]] == 0.0) and np.all(np.isfinite(pred["mel"]))
    np.testing.assert_allclose(pred_pad["mel"], pred["mel"], atol=1e-5)
    np.testing.assert_allclose(synth_pad[0], synth[0], atol=1e-5)
    np.testing.assert_array_equal(synth_pad[2][:, :N], synth[2])


def test_reduction_decodes_r_frames_a_position_with_the_same_contract():
    """reduction=2 (configs/tts.py's): the decoder runs over pairs of frames (each pair's two
    vectors concatenated and projected, numpy's reading of it below) and its projection
    spreads each position back over two frames; an odd frame count (T - 1) is padded to
    the pairs and cut back. Shapes, masks and padding invariance as at reduction 1."""
    model, batch = _model(pos_enc="rope", reduction=2), _batch()
    t = T - 1
    runs = [_forward_and_synthesize(model, b, jnp.float32(1.0), t) for b in (batch, _padded(batch))]
    (pred, synth), (pred_pad, synth_pad) = jax.tree.map(np.asarray, runs)
    totals = batch["durations"].sum(1)
    np.testing.assert_array_equal(pred["frame_mask"], np.arange(t)[None] < totals[:, None])
    assert pred["mel"].shape == (B, t, MELS) and synth[0].shape == (B, t, MELS)
    assert np.all(pred["mel"][~pred["frame_mask"]] == 0.0) and np.all(np.isfinite(pred["mel"]))
    np.testing.assert_allclose(pred_pad["mel"], pred["mel"], atol=1e-5)
    np.testing.assert_allclose(synth_pad[0], synth[0], atol=1e-5)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    mask = np.arange(5)[None] < np.array([[5], [2]])
    got, got_mask = model._reduced(jnp.asarray(x), jnp.asarray(mask))
    pairs = np.concatenate([x, np.zeros((2, 1, 32), np.float32)], 1).reshape(2, 3, 64)
    kernel, bias = np.asarray(model.reduce.kernel[...]), np.asarray(model.reduce.bias[...])
    want_mask = np.array([[1, 1, 1], [1, 0, 0]], bool)
    np.testing.assert_array_equal(np.asarray(got_mask), want_mask)
    want = np.where(want_mask[..., None], pairs @ kernel + bias, 0.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reduction must be >= 1"):
        _model(reduction=0)


def test_synthesize_durations_follow_the_scale(outputs):
    pred, synth = outputs["plain"]
    mask = pred["token_mask"]
    for scale, (_, _, durations) in zip((1.0, 2.0), synth):
        want = np.clip(np.round((np.exp(pred["log_duration"]) - 1) * scale), 1, T)
        np.testing.assert_array_equal(durations, np.where(mask, want, 0))
        got = durations_from_log(jnp.asarray(pred["log_duration"]), jnp.asarray(mask), scale, T)
        np.testing.assert_array_equal(np.asarray(got), durations)
    once, twice = synth[0][2], synth[1][2]
    assert np.all(once[mask] >= 1)
    # Twice the duration up to the rounding, where neither clip (1 or T frames) applied.
    free = mask & (once > 1) & (twice < T)
    assert free.sum() >= 10
    assert np.all(np.abs(twice[free] - 2 * once[free]) <= 1)


def _loss_reference(pred, targets, weights):
    fm, tm = pred["frame_mask"], pred["token_mask"]
    mel = np.abs(pred["mel"] - targets["mel"])[fm].sum() / max(fm.sum() * MELS, 1)
    dur = np.log(1.0 + targets["durations"])
    parts = {
        "mel": mel,
        "duration": np.mean((pred["log_duration"] - dur)[tm] ** 2),
        "pitch": np.mean((pred["pitch"] - targets["pitch"])[tm] ** 2),
        "energy": np.mean((pred["energy"] - targets["energy"])[tm] ** 2),
    }
    return sum(weights[k] * v for k, v in parts.items()), parts


def test_loss_equals_numpy():
    rng = np.random.default_rng(3)
    batch = _batch(3)
    pred = {
        "mel": rng.standard_normal((B, T, MELS)).astype(np.float32),
        "frame_mask": np.arange(T)[None] < batch["durations"].sum(1, keepdims=True),
        "token_mask": batch["tokens"] != 0,
    } | {k: rng.standard_normal((B, N)).astype(np.float32) for k in ("log_duration", "pitch")}
    pred["energy"] = rng.standard_normal((B, N)).astype(np.float32)
    weights = {"mel": 1.5, "duration": 0.5, "pitch": 2.0, "energy": 0.1}
    total, parts = fastspeech2_loss(
        pred,
        batch,
        mel_weight=weights["mel"],
        duration_weight=weights["duration"],
        pitch_weight=weights["pitch"],
        energy_weight=weights["energy"],
    )
    want_total, want_parts = _loss_reference(pred, batch, weights)
    np.testing.assert_allclose(float(total), want_total, rtol=1e-5)
    for k, v in want_parts.items():
        assert parts[k].shape == () and parts[k].dtype == jnp.float32
        np.testing.assert_allclose(float(parts[k]), v, rtol=1e-5)
    empty = pred | {"frame_mask": np.zeros((B, T), bool), "token_mask": np.zeros((B, N), bool)}
    assert float(fastspeech2_loss(empty, batch)[0]) == 0.0  # no valid element: 0, not NaN


def _loss(graphdef, params, batch, *, rngs=None):
    model = nnx.merge(graphdef, params)
    pred = model(
        batch["tokens"],
        batch["speaker"],
        batch["durations"],
        batch["pitch"],
        batch["energy"],
        T,
        deterministic=rngs is None,
        rngs=rngs,
    )
    return fastspeech2_loss(pred, batch)[0]


@pytest.fixture(scope="module")
def split_model():
    graphdef, state = nnx.split(_model(1))
    return graphdef, state, nnx.to_pure_dict(state)


@pytest.fixture(scope="module")
def single_device_loss_and_grad(split_model):
    graphdef, _, params = split_model
    fn = jax.jit(jax.value_and_grad(lambda p, b: _loss(graphdef, p, b)))
    return fn, fn(params, _batch(2))


def test_adam_steps_lower_the_loss(split_model, single_device_loss_and_grad):
    graphdef, _, params = split_model
    loss_and_grad, (first, _) = single_device_loss_and_grad
    batch = _batch(2)
    tx = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state, key):  # with dropout, as training runs
        grads = jax.grad(lambda p: _loss(graphdef, p, batch, rngs=nnx.Rngs(dropout=key)))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for i in range(25):
        params, opt_state = step(params, opt_state, jax.random.key(i))
    last, _ = loss_and_grad(params, batch)
    assert float(last) < 0.7 * float(first), (float(first), float(last))


def test_loss_and_gradient_on_an_8_device_mesh_equal_one_device(
    split_model, single_device_loss_and_grad
):
    """Batch over (data, fsdp) = (4, 2), parameters FSDP-sharded by the rules."""
    if len(jax.devices()) < 8:
        pytest.skip("needs the 8 simulated CPU devices of tests/conftest.py")
    graphdef, state, params = split_model
    loss_and_grad, (want_loss, want_grads) = single_device_loss_and_grad
    mesh = mesh_lib.make_mesh({"data": 4, "fsdp": 2}, devices=jax.devices()[:8])
    sharded = jax.device_put(params, state_shardings(state, mesh))
    assert sharded["token_embed"].sharding.spec[1] == "fsdp"
    batch = mesh_lib.host_to_global(mesh, _batch(2))
    assert batch["mel"].sharding.spec[0] == ("replica", "stage", "data", "fsdp")
    with jax.set_mesh(mesh):
        loss, grads = jax.jit(jax.value_and_grad(lambda p, b: _loss(graphdef, p, b)))(
            sharded, batch
        )
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4),
        grads,
        want_grads,
    )


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="num_speakers"):
        FastSpeech2(vocab_size=4, num_speakers=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="embed_kernel must be odd"):
        FastSpeech2(
            vocab_size=4,
            dim=8,
            encoder_layers=1,
            decoder_layers=1,
            variance_channels=4,
            embed_kernel=4,
            rngs=nnx.Rngs(0),
        )


def test_out_of_range_phoneme_and_speaker_ids_are_refused():
    """Unchecked, a phoneme or speaker past its table synthesized 0 frames (jnp.take fills
    NaN) and speaker -1 the last voice (it wraps): one line naming the id and the range,
    eagerly and through the jitted `make_synthesize_fn` alike (checked before tracing)."""
    from jaxspeech.common.errors import UserError
    from jaxspeech.tts.model import id_mistake, make_synthesize_fn

    ok = np.array([[1, 2, 0]], np.int32)
    assert id_mistake(ok, np.array([SPEAKERS - 1]), VOCAB, SPEAKERS) == ""
    cases = [
        (ok, [-1], f"speaker id -1 is out of range: valid ids are 0 to {SPEAKERS - 1}"),
        (ok, [SPEAKERS], f"speaker id {SPEAKERS} is out of range"),
        (
            [[1, VOCAB, 2]],
            [0],
            f"phoneme id {VOCAB} is out of range: valid ids are 0 to {VOCAB - 1}",
        ),
        ([[1, -3, 2]], [0], "phoneme id -3 is out of range"),
    ]
    model = nnx.eval_shape(_model)  # shapes only: the ids are refused before any compute
    graphdef, params = nnx.split(model, nnx.Param)
    fn = make_synthesize_fn(graphdef, 8)
    for tokens, speaker, message in cases:
        tokens, speaker = np.asarray(tokens, np.int32), np.asarray(speaker, np.int32)
        assert id_mistake(tokens, speaker, VOCAB, SPEAKERS).startswith(message)
        with pytest.raises(UserError, match=message):
            model.synthesize(jnp.asarray(tokens), jnp.asarray(speaker), 8)
        with pytest.raises(UserError, match=message):
            fn(params, tokens, speaker)
