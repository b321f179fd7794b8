"""Vocos's generator (jaxspeech/vocoder/vocos.py): its inverse STFT against librosa's, its
magnitude prior against the filterbank and librosa's STFT, the generator's output contract
and padding invariance, and how config.vocoder.generator picks the class (a run saved
before the key is HiFi-GAN's, one before vocos_mel_prior has no prior; an unknown name is
one line).

Pure functions and one tiny generator (compiles dominate); the trainer, evaluation and
export of a Vocos run: tests/tts/test_vocoder_training.py and test_vocoder_export.py
(configs/vocoder.py:tiny is a Vocos)."""

from __future__ import annotations

import dataclasses

import librosa
import numpy as np
import pytest
from flax import nnx

from configs import vocoder
from jaxspeech.audio import features
from jaxspeech.config import validate
from jaxspeech.vocoder import loading
from jaxspeech.vocoder.generator import GENERATORS
from jaxspeech.vocoder.hifigan import HiFiGANGenerator, num_params, vocode
from jaxspeech.vocoder.vocos import (
    DEMO_GENERATOR,
    VocosGenerator,
    istft,
    magnitude_prior,
    prior_basis,
)

HOP, N_FFT, MELS = 160, 640, 80


def _librosa_istft(spec_ft: np.ndarray, frames: int) -> np.ndarray:
    return librosa.istft(
        spec_ft, hop_length=HOP, n_fft=N_FFT, window="hann", center=True, length=frames * HOP
    )


def test_istft_equals_librosa_and_inverts_the_stft():
    """A consistent STFT (of audio) comes back as the audio; an arbitrary complex spectrum
    (what a generator predicts) gives librosa.istft's signal; a row with fewer valid
    frames gives librosa's istft of those frames alone, then zeros."""
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.normal(size=HOP * 24 + 37)).astype(np.float32)
    stft = librosa.stft(audio, n_fft=N_FFT, hop_length=HOP, window="hann", center=True)
    t = stft.shape[1]  # 1 + len // hop frames, as our front end's
    noise = rng.normal(size=stft.shape) + 1j * rng.normal(size=stft.shape)
    valid = 11
    specs = np.stack([stft.T, noise.T, noise.T])  # (3, T, F)
    mask = np.arange(t)[None] < np.array([[t], [t], [valid]])
    got = np.asarray(istft(specs.real, specs.imag, mask, n_fft=N_FFT, hop=HOP))
    assert got.shape == (3, t * HOP)
    np.testing.assert_allclose(got[0, : len(audio)], audio, atol=1e-6)
    np.testing.assert_allclose(got[0], _librosa_istft(stft, t), atol=1e-6)
    np.testing.assert_allclose(got[1], _librosa_istft(noise, t), atol=1e-6)
    np.testing.assert_allclose(
        got[2, : valid * HOP], _librosa_istft(noise[:, :valid], valid), atol=1e-6
    )
    assert not got[2, valid * HOP :].any()


def test_magnitude_prior_inverts_the_front_ends_mel():
    """On one grid the prior's power spectrum gives back the mel it came from (the
    filterbank's pseudo-inverse: M basis^T = I); on Vocos's grid, from the front end's
    log-mel of a harmonic sound, it is near librosa's own STFT magnitude where the sound
    has its energy (the mel's band averages fill the valleys between harmonics)."""
    cfg = features.LogMelConfig()
    same = prior_basis(dataclasses.replace(cfg, win_length=cfg.n_fft), cfg.n_fft)
    fb = librosa.filters.mel(sr=16000, n_fft=cfg.n_fft, n_mels=MELS, fmax=8000.0)  # (M, bins)
    np.testing.assert_allclose(fb @ same.T, np.eye(MELS), atol=1e-4)
    t = np.arange(16000) / 16000
    rng = np.random.default_rng(0)
    harmonics = sum(0.1 / k * np.sin(2 * np.pi * 150 * k * t) for k in range(1, 20))
    audio = (harmonics + 0.01 * rng.normal(size=t.size)).astype(np.float32)
    mel = np.asarray(features.log_mel(audio[None], cfg))
    got = np.asarray(magnitude_prior(mel, cfg, N_FFT))[0]  # (T, F) log-magnitude
    stft = librosa.stft(audio, n_fft=N_FFT, hop_length=HOP, window="hann", center=True)
    want = np.log(np.abs(stft).T + 1e-5)
    assert got.shape == want.shape == (101, N_FFT // 2 + 1)
    loud = want > np.percentile(want, 80)
    assert abs((got - want)[loud].mean()) < 0.3 and np.abs(got - want)[loud].mean() < 0.5


@pytest.fixture(scope="module")
def generator() -> VocosGenerator:
    return VocosGenerator(n_mels=MELS, dim=16, intermediate_dim=32, layers=2, rngs=nnx.Rngs(0))


def test_generator_output_and_padding_invariance(generator):
    """(B, T) frames -> (B, T * hop) samples in [-1, 1], zero past each row's frames; a
    row's valid samples are the same with more padding frames holding garbage (the
    convolution and the inverse STFT ignore masked frames)."""
    rng = np.random.default_rng(1)
    t, extra, lengths = 9, 5, np.array([9, 6, 1])
    mel = rng.normal(-5.0, 3.0, (3, t, MELS)).astype(np.float32)
    mask = np.arange(t)[None] < lengths[:, None]
    run = nnx.jit(vocode)
    want = np.asarray(run(generator, mel, mask))
    assert want.shape == (3, t * HOP) and want.dtype == np.float32
    assert np.abs(want).max() <= 1.0 and np.all(np.abs(want).max(axis=1) > 0)
    valid = np.repeat(mask, HOP, axis=1)
    assert not want[~valid].any()
    garbage = rng.uniform(-20, 20, (3, t + extra, MELS)).astype(np.float32)
    long_mask = np.pad(mask, ((0, 0), (0, extra)))
    long_mel = np.where(long_mask[..., None], np.pad(mel, ((0, 0), (0, extra), (0, 0))), garbage)
    got = np.asarray(run(generator, long_mel, long_mask))
    np.testing.assert_allclose(got[:, : t * HOP], want, atol=1e-6)
    assert not got[:, t * HOP :].any()
    for i, n in enumerate(lengths):  # each row alone, unpadded
        alone = np.asarray(run(generator, mel[i : i + 1, :n], mask[i : i + 1, :n]))
        np.testing.assert_allclose(alone[0], want[i, : n * HOP], atol=1e-6)


def test_config_picks_the_generator():
    config = vocoder.get_config("tiny")
    assert loading.generator_kind(config) == "vocos"
    model = nnx.eval_shape(lambda: loading.make_vocoder(config, 0))
    assert isinstance(model.generator, VocosGenerator) and model.generator.hop == HOP
    demo = loading.generator_arguments(vocoder.get_config())  # DEMO_GENERATOR
    assert demo.items() >= DEMO_GENERATOR.items() and "mel_prior" not in demo
    prior = loading.generator_arguments(config)["mel_prior"]  # tiny's: the front end's
    assert features.LogMelConfig(**prior) == features.LogMelConfig()
    size = num_params(nnx.eval_shape(lambda: VocosGenerator(**demo, rngs=nnx.Rngs(0))))
    assert 0.7e6 < size < 0.8e6  # 0.76 M (configs/vocoder.py's docstring)
    assert validate.VOCODER_GENERATORS == tuple(GENERATORS)
    old = vocoder.get_config("hifigan")
    del old.vocoder["generator"]  # a run saved before the key existed
    assert loading.generator_kind(old) == "hifigan"
    model = nnx.eval_shape(lambda: loading.make_vocoder(old, 0))
    assert isinstance(model.generator, HiFiGANGenerator)
    old = vocoder.get_config("tiny")
    del old.vocoder["vocos_mel_prior"]  # a Vocos run saved before the prior existed
    assert "mel_prior" not in loading.generator_arguments(old)
    config.features.hop_length = 256  # Vocos's inverse STFT takes any hop (HiFi-GAN's: 160)
    assert validate.mistakes(config) == []
    config.vocoder.generator = "wavenet"
    assert validate.mistakes(config) == [
        "vocoder.generator: unknown generator 'wavenet'; choose one of hifigan, vocos"
    ]
