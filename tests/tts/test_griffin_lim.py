"""Griffin-Lim inverts our front end: features -> audio -> features comes back close, with
the length conventions of `jaxspeech.audio.features`."""

import jax.numpy as jnp
import librosa
import numpy as np
import pytest

from jaxspeech.audio import features
from jaxspeech.audio.griffin_lim import griffin_lim, griffin_lim_batch, nnls
from tests.tts.tones import harmonic_tone

HOP = 160


def _log_mel(audio_s: np.ndarray) -> np.ndarray:
    return np.asarray(features.log_mel(jnp.asarray(audio_s[None])))[0]


@pytest.fixture(scope="module")
def round_trip():
    audio = harmonic_tone(8000 + 37)  # 0.5 s, not a whole number of hops
    feats = _log_mel(audio)
    return audio, feats, griffin_lim(feats, n_iter=64)


def test_length_follows_the_front_end(round_trip):
    audio, feats, out = round_trip
    t = feats.shape[0]
    assert t == features.num_frames(audio.shape[0], HOP) == 51
    assert out.shape == (t * HOP,) and out.dtype == np.float32
    # T * hop samples give T + 1 frames, the first T of which are the input's.
    assert _log_mel(out).shape[0] == t + 1


def test_features_survive_the_round_trip(round_trip):
    """Measured: mean |log-mel difference| 0.127 nats, median 0.032 (most of it the mel
    pseudo-inverse's, in quiet bins), mean difference +0.068. For contrast, inverting as if
    the features were magnitude, not power, gives 2.1 (mean difference +0.38), a 512-sample
    window instead of 400 gives 0.33."""
    _, feats, out = round_trip
    back = _log_mel(out)[: feats.shape[0]]
    diff = np.abs(back - feats)
    assert diff.mean() < 0.2, diff.mean()
    assert np.median(diff) < 0.08, np.median(diff)
    assert abs(float(np.mean(back - feats))) < 0.15  # the loudness comes back
    # Reproducible: the random initial phases come from `seed`.
    np.testing.assert_array_equal(griffin_lim(feats, n_iter=2), griffin_lim(feats, n_iter=2))


def test_batch_vocodes_each_row_from_its_valid_frames(round_trip):
    _, feats, _ = round_trip
    t = feats.shape[0]
    mel = np.stack([feats, np.where(np.arange(t)[:, None] < 30, feats, 7.0)])  # garbage tail
    mask = np.arange(t)[None, :] < np.array([[t], [30]])
    out = griffin_lim_batch(mel, mask, n_iter=4)
    assert out.shape == (2, t * HOP)
    np.testing.assert_allclose(out[0], griffin_lim(feats, n_iter=4))
    np.testing.assert_allclose(out[1, : 30 * HOP], griffin_lim(feats[:30], n_iter=4))
    assert np.all(out[1, 30 * HOP :] == 0.0)


def test_nnls_is_librosas(round_trip):
    """`nnls` returns `librosa.util.nnls`'s solution (the independent reference): on our
    features, where L-BFGS-B stops at the clipped pseudo-inverse, and on a problem where
    it takes steps, over two of librosa's blocks of columns (64 columns of 512 rows), which
    are solved apart (one L-BFGS-B over all 100 columns ends 2e-3 away)."""
    _, feats, _ = round_trip
    cfg = features.LogMelConfig()
    basis = features.mel_filterbank(cfg).T.astype(np.float64)
    mel_power = np.maximum(np.exp(feats.astype(np.float64)) - cfg.log_floor, 0.0).T
    np.testing.assert_allclose(nnls(basis, mel_power), librosa.util.nnls(basis, mel_power))
    rng = np.random.default_rng(0)
    a = rng.uniform(0.0, 1.0, (512, 20))
    b = a @ rng.normal(0.0, 1.0, (20, 100)) + rng.normal(0.0, 0.1, (512, 100))
    want = librosa.util.nnls(a, b)
    assert np.abs(want - np.clip(np.linalg.pinv(a) @ b, 0, None)).max() > 1.0  # it moved
    np.testing.assert_allclose(nnls(a, b), want, rtol=1e-9, atol=1e-12)


def test_wrong_features_are_refused():
    with pytest.raises(ValueError, match="log-mel"):
        griffin_lim(np.zeros((5, 40), np.float32))
    with pytest.raises(ValueError, match="log-mel features"):
        griffin_lim(np.zeros((5, 80), np.float32), features.LogMelConfig(kind="mfcc"))
