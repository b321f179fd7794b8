import jax
import jax.numpy as jnp
import librosa
import numpy as np
import pytest

from jaxspeech.audio import augment, features


def _reference(audio: np.ndarray, cfg: features.LogMelConfig) -> np.ndarray:
    mel = librosa.feature.melspectrogram(
        y=audio.astype(np.float64),
        sr=cfg.sample_rate,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
        power=2.0,
        n_mels=cfg.num_mel_bins,
        fmin=cfg.fmin,
        fmax=cfg.fmax,
        htk=False,
        norm="slaney",
    )
    return np.log(mel + cfg.log_floor).T


@pytest.mark.parametrize("num_samples", [16000, 12345])
def test_log_mel_matches_librosa(num_samples):
    rng = np.random.default_rng(0)
    t = np.arange(num_samples) / 16000
    audio = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(num_samples)
    cfg = features.LogMelConfig()
    got = np.asarray(
        jax.jit(features.log_mel, static_argnums=1)(jnp.asarray(audio[None], jnp.float32), cfg)
    )[0]
    want = _reference(audio.astype(np.float32), cfg)
    assert got.shape == want.shape == (features.num_frames(num_samples, 160), 80)
    assert np.max(np.abs(got - want)) < 1e-3


def test_log_mel_batch_rows_are_independent():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 8000)).astype(np.float32) * 0.1
    batched = np.asarray(features.log_mel(jnp.asarray(a)))
    single = np.asarray(features.log_mel(jnp.asarray(a[1:2])))
    np.testing.assert_allclose(batched[1], single[0], atol=1e-5)


def test_normalize_and_stats():
    x = np.random.default_rng(2).standard_normal((500, 4)) * 3 + 1
    mean, std = features.stats_to_mean_std(len(x), x.sum(0), (x**2).sum(0))
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(std, x.std(0), rtol=1e-5)
    mask = np.array([[True, True, False]])
    out = features.normalize(
        jnp.ones((1, 3, 4)), jnp.asarray(mean), jnp.asarray(std), jnp.asarray(mask)
    )
    assert np.all(np.asarray(out)[0, 2] == 0)
    with pytest.raises(ValueError):
        features.stats_to_mean_std(0, x.sum(0), x.sum(0))


def test_spec_augment_masks_inside_length():
    feats = jnp.ones((4, 200, 80))
    lengths = jnp.array([200, 150, 100, 50])
    out = np.asarray(
        augment.spec_augment(
            jax.random.key(0),
            feats,
            lengths,
            num_freq_masks=2,
            freq_mask_width=10,
            num_time_masks=3,
            time_mask_max_ratio=0.1,
        )
    )
    for b, n in enumerate([200, 150, 100, 50]):
        masked_frames = np.all(out[b] == 0, axis=1)
        masked_bins = np.all(out[b] == 0, axis=0)
        # frequency masks: at most 2 bands of <= 10 bins
        assert masked_bins.sum() <= 20
        # time masks: at most 3 spans of <= 10% of the length, all inside the valid frames
        assert masked_frames[n:].sum() == 0
        assert masked_frames.sum() <= 3 * int(0.1 * n)
    # different keys give different masks; the same key the same ones
    again = np.asarray(
        augment.spec_augment(
            jax.random.key(0),
            feats,
            lengths,
            num_freq_masks=2,
            freq_mask_width=10,
            num_time_masks=3,
            time_mask_max_ratio=0.1,
        )
    )
    other = np.asarray(
        augment.spec_augment(
            jax.random.key(1),
            feats,
            lengths,
            num_freq_masks=2,
            freq_mask_width=10,
            num_time_masks=3,
            time_mask_max_ratio=0.1,
        )
    )
    assert np.array_equal(out, again) and not np.array_equal(out, other)
    assert (out == 0).mean() > 0.01


def _numpy_vtlp(feats_tf: np.ndarray, alpha: float, boundary: float = 0.8) -> np.ndarray:
    """Independent reference: piecewise-linear warp + np.interp, one utterance."""
    f = feats_tf.shape[1]
    top = f - 1.0
    knee = boundary * top * min(1.0, 1.0 / alpha)
    pos = np.arange(f, dtype=np.float64)
    src = np.where(
        pos <= knee, pos * alpha, knee * alpha + (pos - knee) * (top - knee * alpha) / (top - knee)
    )
    return np.stack([np.interp(src, np.arange(f), row) for row in feats_tf])


def test_freq_warp_matches_numpy_interpolation():
    rng = np.random.default_rng(3)
    feats = rng.standard_normal((6, 9, 80)).astype(np.float32)
    key = jax.random.key(7)
    out = np.asarray(augment.freq_warp(key, jnp.asarray(feats), 0.15))
    # The factors freq_warp draws (same key, same call as inside it).
    alphas = np.asarray(jax.random.uniform(key, (6,), minval=0.85, maxval=1.15))
    assert alphas.min() < 0.95 and alphas.max() > 1.05  # both directions exercised
    for b in range(6):
        # float32 source positions vs float64: differences of ~1e-5 where features jump
        np.testing.assert_allclose(out[b], _numpy_vtlp(feats[b], float(alphas[b])), atol=1e-4)


def test_freq_warp_moves_a_formant_and_keeps_the_edges():
    f = 80
    feats = np.zeros((3, 1, f), np.float32)
    feats[:, :, 40] = 1.0  # one peak at bin 40
    feats[:, :, 0] = 2.0
    feats[:, :, f - 1] = 3.0
    alphas = jnp.array([0.8, 1.0, 1.25])
    src = np.asarray(augment.warp_positions(alphas, f))
    np.testing.assert_allclose(src[:, 0], 0.0)
    np.testing.assert_allclose(src[:, -1], f - 1.0, rtol=1e-6)
    assert np.all(np.diff(src, axis=1) > 0)  # monotonic: no band folds over
    np.testing.assert_allclose(src[1], np.arange(f))  # alpha = 1 is the identity
    # alpha 0.8: output bin 50 reads input bin 40, so the peak moves up to 50; 1.25: to 32.
    np.testing.assert_allclose(src[0, 50], 40.0, rtol=1e-6)
    np.testing.assert_allclose(src[2, 32], 40.0, rtol=1e-6)
    # max_ratio 0 leaves features unchanged
    same = augment.freq_warp(jax.random.key(0), jnp.asarray(feats), 0.0)
    np.testing.assert_allclose(np.asarray(same), feats, atol=1e-6)
