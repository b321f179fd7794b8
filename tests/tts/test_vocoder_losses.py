"""HiFi-GAN's losses and the discriminators' input views against numpy references, on small
random inputs with padding (per-row lengths)."""

import jax
import jax.numpy as jnp
import librosa
import numpy as np

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.vocoder import losses as vl
from jaxspeech.vocoder.discriminators import Features, average_pool, period_view

RNG = np.random.default_rng(0)
CFG = LogMelConfig()


def _random_features(rng, b: int, spatial: tuple[int, ...], lengths: np.ndarray) -> Features:
    """Three layers of (B, L, *rest, C) maps, the last a 1-channel score, with prefix masks
    of ceil(length / 2^i) positions (as strided layers shrink them)."""
    maps, masks = [], []
    for i, c in enumerate((3, 2, 1)):
        size = spatial[0] // 2**i
        maps.append(rng.standard_normal((b, size) + spatial[1:] + (c,)).astype(np.float32))
        valid = -(-lengths // 2**i)
        mask = np.arange(size)[None, :] < valid[:, None]
        masks.append(mask.reshape(mask.shape + (1,) * len(spatial)))
    return Features(maps, masks)


def _pair(seed: int):
    """(real, fake) lists of two sub-discriminators' features: a 1-D (scale) and a 2-D
    (period) one; the fake shares the real's masks (same lengths)."""
    rng = np.random.default_rng(seed)
    lengths = np.array([16, 5, 11])
    out = []
    for _ in range(2):
        out.append(
            [_random_features(rng, 3, (16,), lengths), _random_features(rng, 3, (16, 3), lengths)]
        )
    real, fake = out
    fake = [Features(f.maps, r.masks) for r, f in zip(real, fake)]
    return real, fake


def _np_masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    mask = np.broadcast_to(mask, values.shape)
    return float(values[mask].mean())


def test_adversarial_losses_equal_numpy():
    real, fake = _pair(1)
    want_g = sum(_np_masked_mean((1 - f.maps[-1]) ** 2, f.masks[-1]) for f in fake)
    want_real = sum(_np_masked_mean((1 - r.maps[-1]) ** 2, r.masks[-1]) for r in real)
    want_fake = sum(_np_masked_mean(f.maps[-1] ** 2, f.masks[-1]) for f in fake)
    np.testing.assert_allclose(float(vl.generator_adversarial(fake)), want_g, rtol=1e-5)
    got_real, got_fake = vl.discriminator_adversarial(real, fake)
    np.testing.assert_allclose(float(got_real), want_real, rtol=1e-5)
    np.testing.assert_allclose(float(got_fake), want_fake, rtol=1e-5)


def test_feature_matching_equals_numpy():
    real, fake = _pair(2)
    want = sum(
        _np_masked_mean(np.abs(rm - fm), mask)
        for r, f in zip(real, fake)
        for rm, fm, mask in zip(r.maps, f.maps, r.masks)
    )
    np.testing.assert_allclose(float(vl.feature_matching(real, fake)), want, rtol=1e-5)


def test_masked_means_ignore_the_padding_and_are_batch_global():
    values = np.array([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]], np.float32)
    mask = np.array([[True, True, False], [True, False, False]])
    # (1 + 2 + 3) / 3 over the batch, not the mean of the rows' means (1.5 + 3) / 2.
    assert float(vl.masked_mean(values, mask)) == 2.0
    assert float(vl.masked_mean(values, np.zeros_like(mask))) == 0.0  # nothing valid: 0


def _np_log_mel(audio: np.ndarray) -> np.ndarray:
    mel = librosa.feature.melspectrogram(
        y=audio, sr=16000, n_fft=512, hop_length=160, win_length=400, window="hann",
        center=True, pad_mode="constant", power=2.0, n_mels=80, fmin=0.0, fmax=8000.0,
    )  # fmt: skip
    return np.log(mel + 1e-6).T


def test_mel_l1_equals_librosa_on_each_rows_valid_samples():
    """Each row's L1 over its own (unpadded) audio's frames; summed over the batch and
    divided by the batch's frames x bins. The padded tails hold garbage."""
    b, t = 3, 12
    lengths = np.array([t * 160 - 1, 900, 641])
    real = (0.3 * RNG.standard_normal((b, t * 160))).astype(np.float32)
    fake = (0.3 * RNG.standard_normal((b, t * 160))).astype(np.float32)
    total, count = 0.0, 0
    for row in range(b):
        n = lengths[row]
        diff = np.abs(_np_log_mel(real[row, :n]) - _np_log_mel(fake[row, :n]))
        assert diff.shape[0] == 1 + n // 160
        total, count = total + diff.sum(), count + diff.size
    mask = np.arange(t * 160)[None] < lengths[:, None]
    got = jax.jit(vl.mel_l1, static_argnums=3)(
        jnp.asarray(np.where(mask, real, 0)), jnp.asarray(np.where(mask, fake, 0)),
        jnp.asarray(lengths), CFG,
    )  # fmt: skip
    np.testing.assert_allclose(float(got), total / count, rtol=1e-4)


def test_period_view_reflect_pads_each_row_at_its_own_end():
    """The paper's view of one unpadded waveform (reflect-pad to a multiple of the period,
    reshape), row by row; garbage past each length never shows."""
    s = 29
    lengths = np.array([29, 17, 12, 25])
    audio = RNG.standard_normal((4, s)).astype(np.float32)
    for period in (2, 3, 5, 7, 11):
        view, rows = jax.jit(period_view, static_argnums=2)(audio, lengths, period)
        view, rows = np.asarray(view), np.asarray(rows)
        assert view.shape == (4, -(-s // period), period)
        for b, n in enumerate(lengths):
            want = np.pad(audio[b, :n], (0, -n % period), mode="reflect").reshape(-1, period)
            assert rows[b] == want.shape[0]
            np.testing.assert_array_equal(view[b, : rows[b]], want)
            assert np.all(view[b, rows[b] :] == 0.0)


def test_average_pool_is_the_papers_on_the_valid_samples():
    """AvgPool1d(4, 2, padding=2), zeros counted (PyTorch's count_include_pad), of each
    row's unpadded samples: L // 2 + 1 outputs."""
    lengths = np.array([20, 13])
    audio = RNG.standard_normal((2, 20)).astype(np.float32)
    pooled, pooled_len = average_pool(jnp.asarray(audio), jnp.asarray(lengths))
    for b, n in enumerate(lengths):
        x = np.pad(audio[b, :n], 2)
        want = np.array([x[2 * j : 2 * j + 4].sum() / 4 for j in range(n // 2 + 1)])
        assert int(pooled_len[b]) == n // 2 + 1
        np.testing.assert_allclose(np.asarray(pooled)[b, : n // 2 + 1], want, rtol=1e-6)
