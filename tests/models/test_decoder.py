"""The attention decoder (jaxspeech.models.decoder) against a numpy Transformer decoder
with the same weights; its masks (causal self-attention, the encoder's padding), teacher
forcing, the ctc+aed model's loss and gradients on the 8-device mesh against 1 device,
its config mistakes and its StableHLO export (decoding: tests/decoding/test_attention_*)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from configs import demo
from jaxspeech.config import build, validate
from jaxspeech.models.decoder import SOS_EOS, AttentionDecoder, teacher_forcing
from jaxspeech.parallel import rules
from tests.parallel import test_equivalence as equivalence

V, E, D, H = 9, 12, 16, 4


def _decoder(num_layers=2, scan_layers=False, seed=0) -> AttentionDecoder:
    return AttentionDecoder(
        vocab_size=V,
        enc_dim=E,
        dim=D,
        num_layers=num_layers,
        num_heads=H,
        ff_mult=2,
        dropout=0.1,
        scan_layers=scan_layers,
        rngs=nnx.Rngs(seed),
    )


def _params(module) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))


# ------------------------------------------------------------------ numpy reference
def np_layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def np_attention(x, mem, mask, p):
    """x (B, U, D), mem (B, T, E), mask (B, U, T) bool: softmax(q k / sqrt(K)) v, then wo."""
    q = np.einsum("bud,dhk->bhuk", x, p["wq"])
    k = np.einsum("bte,ehk->bhtk", mem, p["wk"])
    v = np.einsum("bte,ehk->bhtk", mem, p["wv"])
    s = np.einsum("bhuk,bhtk->bhut", q, k) / math.sqrt(q.shape[-1])
    s = np.where(mask[:, None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    probs = s / s.sum(-1, keepdims=True)
    return np.einsum("bhut,bhtk,hkd->bud", probs, v, p["wo"])


def np_decoder(p, tokens, enc, enc_len):
    """The decoder in float64 numpy: embedding * sqrt(D) + interleaved sinusoids, pre-LN
    blocks (causal self-attention, cross-attention, swish FFN), LN, projection."""
    b, u = tokens.shape
    pos = np.arange(u)[:, None] * np.exp(np.arange(0, D, 2) * (-math.log(10000.0) / D))[None]
    sinus = np.stack([np.sin(pos), np.cos(pos)], -1).reshape(u, D)
    x = p["embed"][tokens] * math.sqrt(D) + sinus[None]
    causal = np.tril(np.ones((u, u), bool))[None].repeat(b, 0)
    frames = np.arange(enc.shape[1])[None, None, :] < enc_len[:, None, None]
    enc_mask = np.broadcast_to(frames, (b, u, enc.shape[1]))
    for blk in p["blocks"].values():
        h = np_layer_norm(x, blk["self_norm"])
        x = x + np_attention(h, h, causal, blk["self_attn"])
        x = x + np_attention(np_layer_norm(x, blk["cross_norm"]), enc, enc_mask, blk["cross_attn"])
        ff = blk["ff"]
        h = np_layer_norm(x, ff["norm"]) @ ff["up"]["kernel"] + ff["up"]["bias"]
        h = h / (1 + np.exp(-h))
        x = x + h @ ff["down"]["kernel"] + ff["down"]["bias"]
    return np_layer_norm(x, p["norm"]) @ p["out"]["kernel"] + p["out"]["bias"]


def _inputs(seed=0, b=3, u=5, t=7):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, (b, u)).astype(np.int32)
    enc = rng.standard_normal((b, t, E)).astype(np.float32)
    enc_len = np.array([t, t - 3, 1][:b], np.int32)
    return tokens, enc, enc_len


def test_decoder_equals_a_numpy_transformer_decoder():
    dec = _decoder()
    tokens, enc, enc_len = _inputs()
    got = dec(jnp.asarray(tokens), jnp.asarray(enc), jnp.asarray(enc_len))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), _params(dec))
    want = np_decoder(p, tokens, enc.astype(np.float64), enc_len)
    assert got.shape == (3, 5, V) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_the_scanned_decoder_equals_the_looped_one():
    """scan_layers stacks the same blocks on a leading axis: same outputs."""
    scanned = _decoder(scan_layers=True)
    looped = _decoder(scan_layers=False, seed=1)
    p = _params(scanned)
    blocks = {i: jax.tree.map(lambda a, i=i: a[i], p["blocks"]) for i in range(2)}
    nnx.update(looped, p | {"blocks": blocks})
    tokens, enc, enc_len = (jnp.asarray(a) for a in _inputs(1))
    np.testing.assert_allclose(
        scanned(tokens, enc, enc_len), looped(tokens, enc, enc_len), rtol=1e-5, atol=1e-5
    )


def test_masks_make_a_padded_row_equal_the_row_alone():
    """Causal self-attention: later (padding) tokens never reach earlier positions; the
    encoder's padded frames are masked: the row's logits ignore both kinds of padding."""
    dec = _decoder()
    tokens, enc, enc_len = _inputs(2)
    alone = dec(jnp.asarray(tokens[1:2, :3]), jnp.asarray(enc[1:2, :4]), jnp.asarray([4]))
    padded_enc = enc.copy()
    padded_enc[1, 4:] = 100.0  # garbage where the frames are padding
    enc_len = np.array([7, 4, 1], np.int32)
    batch = dec(jnp.asarray(tokens), jnp.asarray(padded_enc), jnp.asarray(enc_len))
    np.testing.assert_allclose(batch[1:2, :3], alone, rtol=1e-5, atol=1e-5)
    changed = tokens.copy()
    changed[1, 3:] = (tokens[1, 3:] + 1) % V  # later tokens: no effect on earlier rows
    again = dec(jnp.asarray(changed), jnp.asarray(padded_enc), jnp.asarray(enc_len))
    np.testing.assert_allclose(again[1, :3], batch[1, :3], rtol=1e-6, atol=1e-6)
    assert not np.allclose(again[1, 3:], batch[1, 3:])


def test_teacher_forcing_shifts_labels_with_the_shared_sentinel():
    labels = jnp.asarray([[3, 4, 5, 0], [7, 0, 0, 0], [0, 0, 0, 0]], jnp.int32)
    inputs, targets = teacher_forcing(labels, jnp.asarray([3, 1, 0]))
    s = SOS_EOS
    assert s == 0  # the blank: never a target label
    np.testing.assert_array_equal(inputs, [[s, 3, 4, 5, s], [s, 7, s, s, s], [s, s, s, s, s]])
    np.testing.assert_array_equal(targets, [[3, 4, 5, s, s], [7, s, s, s, s], [s, s, s, s, s]])


def test_dropout_draws_in_training_and_gradients_are_finite():
    dec = _decoder(scan_layers=True)
    tokens, enc, enc_len = (jnp.asarray(a) for a in _inputs(3))
    a = dec(tokens, enc, enc_len, deterministic=False, rngs=nnx.Rngs(0))
    b = dec(tokens, enc, enc_len, deterministic=False, rngs=nnx.Rngs(1))
    assert not np.allclose(a, b)
    graphdef, params = nnx.split(dec, nnx.Param)

    def loss(p):
        m = nnx.merge(graphdef, p)
        return jnp.sum(m(tokens, enc, enc_len, deterministic=False, rngs=nnx.Rngs(0)) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


# ------------------------------------------------------------------ the ctc+aed model
def _aed_config(mesh_shape=(1, 1, 1, 1)):
    config = demo.get_config("tiny")
    config.model.conformer.update(dim=16, num_heads=2)
    config.model.head = "ctc+aed"
    config.model.decoder.update(dim=16, num_layers=2, num_heads=2)
    config.specaug.enabled = False
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    return config


def _aed_step(mesh_shape):
    """One step with the identity optimizer (the parameter change IS the gradient)."""
    config = _aed_config(mesh_shape)
    mesh = build.mesh_from_config(config, devices=jax.devices()[: int(np.prod(mesh_shape))])
    mean, std = np.full(80, -5.0), np.full(80, 3.0)
    with rules.axis_rules(build.rules_from_config(config)):
        return equivalence._step_on(config, mesh, mean, std, optax.identity(), 1, False)


def test_ctc_aed_loss_and_gradients_on_8_devices_equal_1_device():
    loss1, _, grads1, _ = _aed_step((1, 1, 1, 1))
    loss8, _, grads8, params8 = _aed_step((1, 2, 2, 2))
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads8, grads1)
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads1["decoder"])) > 1e-4
    # Decoder weights shard by the same table: (layers, embed, heads, kv) -> stage (a
    # size-1 axis here: the pipeline splits the stack there), fsdp, tensor.
    wq = params8["decoder"]["blocks"]["self_attn"]["wq"]
    assert tuple(wq.sharding.spec) == ("stage", "fsdp", "tensor", None)
    assert tuple(params8["decoder"]["out"]["kernel"].sharding.spec) == ("fsdp", "tensor")


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("model.decoder.dim", 17, "model.decoder.dim must be a multiple of"),
        ("loss.ctc_weight", 1.5, "loss.ctc_weight must be <= 1 with model.head=ctc+aed"),
        ("loss.label_smoothing", 1.0, "loss.label_smoothing must be in [0, 1)"),
        ("model.decoder.num_layers", 0, "model.decoder.num_layers must be >= 1"),
    ],
)
def test_config_mistakes_of_the_attention_decoder_are_one_line(key, value, line):
    config = _aed_config((1, 8, 1, 1))
    assert validate.mistakes(config, devices=8) == []
    one_line(config, key, value, line)
    config.model.head = "ctc"  # an unused decoder setting is not checked
    if key.startswith("model.decoder"):
        assert validate.mistakes(config, devices=8) == []


def one_line(config, key: str, value, line: str) -> None:
    """Set the dotted `key` of `config` to `value`: validation then reports exactly one
    mistake, and it says `line`."""
    section, name = key.rsplit(".", 1)
    node = config
    for part in section.split("."):
        node = node[part]
    node[name] = value
    found = validate.mistakes(config, devices=8)
    assert len(found) == 1 and line in found[0], found


def test_stablehlo_export_of_the_decoder_step_equals_the_model(tmp_path):
    """ctc+aed exports `aed_encoder` and `decoder_step` (symbolic batch, frames, prefix
    length) beside `ctc`; the deserialized step equals the model's last-position
    log-probs. The manifest says whether the attention decoder is in the artifact."""
    from jaxspeech.models import inference
    from jaxspeech.serving import recognizer_export as export_lib

    config = _aed_config()
    model = build.make_model(config, 8, 0)
    graphdef, params, model_vars = nnx.split(model, nnx.Param, ...)
    to_dict = lambda s: jax.tree.map(np.asarray, nnx.to_pure_dict(s))  # noqa: E731
    fns = inference.inference_functions(
        graphdef, to_dict(params), to_dict(model_vars), attention_decoder=True
    )
    assert {"ctc", "aed_encoder", "decoder_step"} <= set(fns)
    described = export_lib.export_stablehlo(
        {k: fns[k] for k in ("aed_encoder", "decoder_step")}, 16000, str(tmp_path)
    )
    assert [i["name"] for i in described["decoder_step"]["inputs"]] == [
        "encodings",
        "lengths",
        "prefix",
    ]
    step = jax.export.deserialize((tmp_path / "decoder_step.stablehlo").read_bytes())
    encoder = jax.export.deserialize((tmp_path / "aed_encoder.stablehlo").read_bytes())
    audio = (0.1 * np.random.default_rng(0).standard_normal((2, 8000))).astype(np.float32)
    audio_len = np.array([8000, 5000], np.int32)
    enc, enc_len = encoder.call(audio, audio_len)
    prefix = np.array([[SOS_EOS, 3, 5], [SOS_EOS, 2, 2]], np.int32)
    got = step.call(enc, enc_len, prefix)
    want_enc, want_len = model(jnp.asarray(audio), jnp.asarray(audio_len))
    np.testing.assert_allclose(enc, want_enc, rtol=1e-4, atol=1e-4)
    logits = model.decoder(jnp.asarray(prefix), want_enc, want_len)[:, -1]
    np.testing.assert_allclose(got, jax.nn.log_softmax(logits), rtol=1e-4, atol=1e-4)
    assert inference.attention_manifest("ctc+aed", True)["functions"] == list(described)
    assert inference.attention_manifest("ctc+aed", False)["exported"] is False
    assert inference.attention_manifest("ctc", True) is None


def test_ctc_aed_objective_is_the_joint_loss_of_its_parts():
    """model_losses sums ctc_weight * CTC + (1 - ctc_weight) * attention per utterance and
    reports both parts (train/loss_ctc, train/loss_att)."""
    from jaxspeech.training import objective

    config = _aed_config()
    model = build.make_model(config, equivalence.VOCAB, 0)
    batch = {k: jnp.asarray(v) for k, v in equivalence._batch(b=3).items()}
    graphdef, state = nnx.split(model)

    @jax.jit
    def losses(state):
        m = nnx.merge(graphdef, state)
        return objective.model_losses(m, batch, jax.random.key(0), jnp.int32(0), config.loss, 0)

    total, sums = losses(state)
    w = config.loss.ctc_weight
    want = w * sums["loss_ctc"] + (1 - w) * sums["loss_att"]
    np.testing.assert_allclose(float(total), float(want), rtol=1e-5)
    assert float(sums["loss_att"]) > 0 and float(sums["loss_ctc"]) > 0
