import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.models import build_model
from jaxspeech.models.layers import depthwise_conv1d, rel_shift
from jaxspeech.models.subsampling import conv_out_length, patches_3x3_s2


def test_rel_shift_equals_explicit_gather():
    b, h, t = 2, 3, 5
    x = np.random.default_rng(0).standard_normal((b, h, t, 2 * t - 1)).astype(np.float32)
    got = np.asarray(rel_shift(jnp.asarray(x)))
    want = np.empty((b, h, t, t), np.float32)
    for i in range(t):
        for j in range(t):
            want[:, :, i, j] = x[:, :, i, t - 1 - i + j]  # distance i - j
    np.testing.assert_array_equal(got, want)


def test_rel_shift_of_a_chunk_against_cached_keys_equals_explicit_gather():
    """Tq queries (the last Tq of Tk keys): column r holds distance Tk - 1 - r."""
    b, h, tq, tk = 2, 3, 3, 7
    x = np.random.default_rng(1).standard_normal((b, h, tq, tq + tk - 1)).astype(np.float32)
    got = np.asarray(rel_shift(jnp.asarray(x)))
    want = np.empty((b, h, tq, tk), np.float32)
    for i in range(tq):
        for j in range(tk):
            distance = (tk - tq + i) - j  # query i sits at key position tk - tq + i
            want[:, :, i, j] = x[:, :, i, tk - 1 - distance]
    np.testing.assert_array_equal(got, want)


def test_patch_conv_equals_lax_conv():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 17, 12, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 5)).astype(np.float32)  # HWIO
    want = jax.lax.conv_general_dilated(
        x, w, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    patches = patches_3x3_s2(jnp.asarray(x))  # (.., 9 * C) ordered (i, j, c)
    got = patches @ w.reshape(9 * 3, 5)
    assert got.shape == want.shape == (2, conv_out_length(17), conv_out_length(12), 5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4)


def _lax_depthwise(x, w, bias):
    k = w.shape[0]
    pad = (k - 1) // 2
    return (
        jax.lax.conv_general_dilated(
            x,
            w[:, None, :],
            (1,),
            [(pad, k - 1 - pad)],
            dimension_numbers=("NWC", "WIO", "NWC"),
            feature_group_count=x.shape[-1],
        )
        + bias
    )


# T below the halo, inside one block, a ragged last block, many blocks; K = 1, 5, 15.
@pytest.mark.parametrize(
    "t,k,block", [(3, 5, 32), (11, 5, 32), (11, 15, 4), (70, 15, 32), (97, 1, 16), (64, 5, 8)]
)
def test_depthwise_conv_equals_grouped_lax_conv(t, k, block):
    rng = np.random.default_rng(t * 100 + k)
    x = rng.standard_normal((2, t, 4)).astype(np.float32)
    w = rng.standard_normal((k, 4)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    got = depthwise_conv1d(x, w, bias, block=block)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_lax_depthwise(x, w, bias)), atol=1e-5)
    # Gradients too: the band is built from w by a gather, whose transpose must be right.
    cot = rng.standard_normal(got.shape).astype(np.float32)
    grads = jax.grad(lambda *a: jnp.sum(depthwise_conv1d(*a, block=block) * cot), (0, 1, 2))
    want = jax.grad(lambda *a: jnp.sum(_lax_depthwise(*a) * cot), (0, 1, 2))
    for g, r in zip(grads(x, w, bias), want(x, w, bias)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-4)


class _CTCLogits:
    """The tiny model's CTC logits as one call: (audio, lengths) -> (logits, frames)."""

    def __init__(self, model):
        self.model = model
        self.encoder = model.encoder

    def __call__(self, audio, lengths, **kw):
        enc, frames = self.model(audio, lengths, **kw)
        return self.model.ctc_logits(enc), frames


def _tiny_model(specaug=None, **kw):
    return _CTCLogits(
        build_model(
            encoder="conformer",
            encoder_kwargs=dict(
                dim=16,
                num_layers=2,
                num_heads=2,
                conv_kernel=5,
                subsampling_channels=4,
                dropout=0.0,
                **kw,
            ),
            vocab_size=7,
            feature_config=LogMelConfig(num_mel_bins=20),
            specaug=specaug,
            rngs=nnx.Rngs(0),
        )
    )


def test_padding_does_not_change_valid_outputs():
    """Appending padding to an utterance leaves its logits on valid frames unchanged."""
    model = _tiny_model()
    audio = np.random.default_rng(3).standard_normal((1, 8000)).astype(np.float32) * 0.1
    short, n_short = model(jnp.asarray(audio), jnp.array([8000]))
    padded = np.concatenate([audio, np.full((1, 4000), 0.5, np.float32)], axis=1)
    long, n_long = model(jnp.asarray(padded), jnp.array([8000]))
    assert int(n_short[0]) == int(n_long[0])
    n = int(n_short[0])
    np.testing.assert_allclose(np.asarray(short[0, :n]), np.asarray(long[0, :n]), atol=1e-4)


def test_model_output_shapes_and_train_mode_randomness():
    model = _tiny_model(
        specaug=dict(num_freq_masks=1, freq_mask_width=5, num_time_masks=2, time_mask_max_ratio=0.1)
    )
    audio = jnp.asarray(np.random.default_rng(4).standard_normal((2, 16000)), jnp.float32)
    lens = jnp.array([16000, 9000])
    logits, out_len = model(audio, lens)
    assert logits.shape[0] == 2 and logits.shape[2] == 7 and logits.dtype == jnp.float32
    assert int(out_len[0]) == logits.shape[1]
    a, _ = model(audio, lens, train=True, rngs=nnx.Rngs(1))
    b, _ = model(audio, lens, train=True, rngs=nnx.Rngs(2))
    assert not np.allclose(np.asarray(a), np.asarray(b))  # SpecAugment differs by key
    c, _ = model(audio, lens)
    np.testing.assert_array_equal(np.asarray(c), np.asarray(logits))  # eval is deterministic


def test_scanned_layers_equal_unrolled_layers():
    unrolled, scanned = _tiny_model(), _tiny_model(scan_layers=True)
    p_unrolled = nnx.to_pure_dict(nnx.state(unrolled.model, nnx.Param))
    blocks = p_unrolled["encoder"]["blocks"]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[blocks[i] for i in sorted(blocks)])
    p_scanned = {**p_unrolled, "encoder": {**p_unrolled["encoder"], "blocks": stacked}}
    state = nnx.state(scanned.model, nnx.Param)
    nnx.replace_by_pure_dict(state, p_scanned)
    nnx.update(scanned.model, state)
    audio = jnp.asarray(np.random.default_rng(5).standard_normal((2, 12000)), jnp.float32)
    lens = jnp.array([12000, 7000])
    a, _ = unrolled(audio, lens)
    b, _ = scanned(audio, lens)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    # Parameters of the stacked layers carry a leading "layers" axis (the pipeline's stages).
    kernel = nnx.state(scanned.model, nnx.Param)["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert kernel.get_metadata()["out_sharding"] == ("layers", "embed", "mlp")


def test_scanned_layers_train_with_dropout():
    model = _tiny_model(scan_layers=True, specaug=None)
    model.encoder.blocks.ff1.dropout.rate = 0.5  # stacked modules share one config
    audio = jnp.asarray(np.random.default_rng(6).standard_normal((2, 12000)), jnp.float32)
    lens = jnp.array([12000, 7000])
    a, _ = model(audio, lens, train=True, rngs=nnx.Rngs(1))
    b, _ = model(audio, lens, train=True, rngs=nnx.Rngs(2))
    c, _ = model(audio, lens, train=True, rngs=nnx.Rngs(1))
    assert not np.allclose(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
