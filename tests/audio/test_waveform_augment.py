"""Host-side waveform augmentation, checked against independent numpy/scipy references."""

import pickle
from fractions import Fraction

import numpy as np
import pytest
import scipy.signal
import soundfile
import soxr

from jaxspeech.audio import augment

SR = 16000


def _sine(freq: float, num_samples: int, sample_rate: int = SR) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(num_samples) / sample_rate).astype(np.float32)


def _peak_freq(x: np.ndarray, sample_rate: int = SR, pad: int = 16) -> float:
    """Frequency of the largest FFT bin of a Hann-windowed, zero-padded signal."""
    n = pad * len(x)
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x)), n=n))
    return float(np.argmax(spec)) * sample_rate / n


def _snr_db(signal: np.ndarray, noise: np.ndarray) -> float:
    s, n = signal.astype(np.float64), noise.astype(np.float64)
    return 10 * np.log10(np.mean(s**2) / np.mean(n**2))


def _schroeder_rt60(rir: np.ndarray, sample_rate: int) -> float:
    """RT60 from the backward-integrated energy decay, fit from -5 to -25 dB (ISO 3382 T20)."""
    energy = np.cumsum((rir.astype(np.float64) ** 2)[::-1])[::-1]
    edc_db = 10 * np.log10(energy / energy[0])
    i5, i25 = np.argmax(edc_db <= -5), np.argmax(edc_db <= -25)
    slope = np.polyfit(np.arange(i5, i25) / sample_rate, edc_db[i5:i25], 1)[0]  # dB / s
    return -60.0 / slope


# ---------------------------------------------------------------------------- speed


FACTORS = [0.9, 1.1, 0.95, 1.05, 1.0]
LENGTHS = [0, 1, 2, 3, 7, 10, 99, 100, 101, 1234, 12345, 16000, 16001, 48000, 160003]


def test_speed_perturbed_length_rounds_half_up():
    for n in range(0, 500):
        for f in FACTORS + [0.8, 1.2]:
            # Exact rational arithmetic on the decimal factor: floor(n / f + 1/2).
            want = int(Fraction(n) / Fraction(str(f)) + Fraction(1, 2))
            assert augment.speed_perturbed_length(n, f) == want, (n, f)
    assert augment.speed_perturbed_length(2, 0.8) == 3  # 2.5 rounds up, as soxr does


@pytest.mark.parametrize("factor", FACTORS)
def test_speed_perturb_length_matches_plan(factor):
    rng = np.random.default_rng(0)
    for n in LENGTHS:
        audio = rng.standard_normal(n).astype(np.float32)
        out = augment.speed_perturb(audio, factor, SR)
        assert out.dtype == np.float32
        assert out.shape == (augment.speed_perturbed_length(n, factor),), n
        # soxr itself already gives the planned length: the pad/trim is only a safety net.
        if factor != 1.0:
            assert len(soxr.resample(audio, SR * factor, SR)) == len(out), n


@pytest.mark.parametrize("factor", [0.9, 1.1])
@pytest.mark.parametrize("freq", [440.0, 1000.0])
def test_speed_perturb_scales_frequency(factor, freq):
    out = augment.speed_perturb(_sine(freq, SR), factor, SR)
    assert abs(_peak_freq(out) - freq * factor) < 0.5
    assert abs(len(out) - SR / factor) <= 0.5


def test_speed_one_is_identity_copy():
    audio = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    out = augment.speed_perturb(audio, 1.0, SR)
    np.testing.assert_array_equal(out, audio)
    assert out is not audio


def test_speed_rejects_nonpositive_factor():
    with pytest.raises(ValueError, match="> 0"):
        augment.speed_perturbed_length(100, 0.0)


# ---------------------------------------------------------------------------- noise


@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0])
def test_colored_noise_level_and_slope(exponent):
    rng = np.random.default_rng(123)
    n = 2**16 + 37  # not a fast FFT size: exercises the crop
    psds = []
    for _ in range(8):
        x = augment.colored_noise(rng, n, exponent)
        assert x.dtype == np.float32 and x.shape == (n,)
        assert abs(float(np.mean(x, dtype=np.float64))) < 1e-6
        assert abs(np.sqrt(np.mean(x.astype(np.float64) ** 2)) - 1.0) < 1e-5
        freqs, psd = scipy.signal.welch(x, fs=SR, nperseg=4096)
        psds.append(psd)
    band = (freqs >= 100) & (freqs <= 6000)
    slope = np.polyfit(np.log(freqs[band]), np.log(np.mean(psds, axis=0)[band]), 1)[0]
    assert abs(slope + exponent) < 0.1, slope


def test_colored_noise_tiny_lengths_are_finite():
    rng = np.random.default_rng(0)
    for n in (0, 1):
        assert np.array_equal(augment.colored_noise(rng, n, 1.0), np.zeros(n, np.float32))
    x = augment.colored_noise(rng, 2, 2.0)
    assert np.all(np.isfinite(x))


@pytest.mark.parametrize("snr_db", [-5.0, 0.0, 7.5, 20.0, 30.0])
def test_mix_at_snr_hits_target(snr_db):
    rng = np.random.default_rng(2)
    audio = (0.1 * rng.standard_normal(SR)).astype(np.float32)
    noise = augment.colored_noise(rng, SR, 1.0) * 3.0
    mixed = augment.mix_at_snr(audio, noise, snr_db)
    assert mixed.dtype == np.float32
    added = mixed.astype(np.float64) - audio.astype(np.float64)
    assert abs(_snr_db(audio, added) - snr_db) < 1e-4


def test_mix_at_snr_silent_inputs():
    rng = np.random.default_rng(3)
    audio = rng.standard_normal(100).astype(np.float32)
    silent = np.zeros(100, np.float32)
    out = augment.mix_at_snr(silent, audio, 10.0)
    assert np.all(np.isfinite(out)) and np.array_equal(out, silent)
    out = augment.mix_at_snr(audio, silent, 10.0)
    assert np.all(np.isfinite(out)) and np.array_equal(out, audio)
    assert augment.mix_at_snr(silent[:0], silent[:0], 10.0).shape == (0,)
    with pytest.raises(ValueError, match="same shape"):
        augment.mix_at_snr(audio, audio[:50], 10.0)


def test_crop_or_tile():
    rng = np.random.default_rng(4)
    noise = np.arange(100, dtype=np.float32)
    crop = augment.crop_or_tile(noise, 30, rng)
    start = int(crop[0])
    np.testing.assert_array_equal(crop, noise[start : start + 30])
    tiled = augment.crop_or_tile(noise, 250, rng)
    start = int(tiled[0])
    np.testing.assert_array_equal(tiled, (start + np.arange(250)) % 100)
    np.testing.assert_array_equal(augment.crop_or_tile(noise, 100, rng), noise)
    starts = {int(augment.crop_or_tile(noise, 30, rng)[0]) for _ in range(50)}
    assert len(starts) > 10  # random windows, not always the same one
    with pytest.raises(ValueError, match="empty"):
        augment.crop_or_tile(noise[:0], 10, rng)


# ---------------------------------------------------------------------------- reverb


@pytest.mark.parametrize("seed,rt60", [(0, 0.25), (1, 0.4), (2, 0.6), (3, 0.8)])
def test_simulate_rir_direct_path_and_rt60(seed, rt60):
    rir = augment.simulate_rir(np.random.default_rng(seed), SR, rt60_range=(rt60, rt60))
    assert rir.dtype == np.float32
    assert len(rir) == round(rt60 * SR)
    assert rir[0] == 1.0
    assert abs(_schroeder_rt60(rir, SR) / rt60 - 1.0) < 0.25


def test_simulate_rir_direct_path_leads():
    # The direct path is the first arrival and, in most rooms, the tallest; coinciding
    # reflections may sum above it, but never far above.
    firsts = 0
    for seed in range(40):
        rir = augment.simulate_rir(np.random.default_rng(seed), SR)
        assert rir[0] == 1.0 and np.all(np.isfinite(rir))
        assert np.max(np.abs(rir)) < 3.0
        firsts += int(np.argmax(np.abs(rir))) == 0
    assert firsts >= 30


def test_simulate_rir_is_seeded():
    a = augment.simulate_rir(np.random.default_rng(7), SR)
    b = augment.simulate_rir(np.random.default_rng(7), SR)
    c = augment.simulate_rir(np.random.default_rng(8), SR)
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)


def test_reverberate_identity_impulses():
    audio = np.random.default_rng(5).standard_normal(777).astype(np.float32)
    np.testing.assert_allclose(augment.reverberate(audio, np.array([1.0])), audio, atol=1e-5)
    delayed = np.zeros(50, np.float32)
    delayed[13] = 0.5  # a delayed, quieter impulse: alignment and level are both restored
    out = augment.reverberate(audio, delayed)
    assert out.shape == audio.shape
    np.testing.assert_allclose(out, audio, atol=1e-5)


def test_reverberate_explicit_direct_index():
    audio = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    rir = np.array([0.0, 1.0, 0.0, 0.0, 2.0])  # a reflection taller than the direct path
    want = audio.astype(np.float64).copy()
    want[3:] += 2.0 * audio[:-3]
    want *= np.sqrt(np.mean(audio.astype(np.float64) ** 2) / np.mean(want**2))
    got = augment.reverberate(audio, rir, direct_index=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reverberate_matches_direct_convolution():
    rng = np.random.default_rng(6)
    audio = rng.standard_normal(500).astype(np.float32)
    rir = 0.3 * rng.standard_normal(64) * np.exp(-np.arange(64) / 10.0)
    rir[5] = 2.0  # direct-path peak after some pre-ringing
    want = np.convolve(audio.astype(np.float64), rir)[5 : 5 + 500]
    want *= np.sqrt(np.mean(audio.astype(np.float64) ** 2) / np.mean(want**2))
    np.testing.assert_allclose(augment.reverberate(audio, rir), want, rtol=1e-4, atol=1e-4)


def test_reverberate_keeps_rms_and_length():
    rng = np.random.default_rng(7)
    audio = (0.2 * rng.standard_normal(SR)).astype(np.float32)
    rir = augment.simulate_rir(rng, SR)
    out = augment.reverberate(audio, rir)
    assert out.shape == audio.shape and out.dtype == np.float32
    rms = lambda x: np.sqrt(np.mean(x.astype(np.float64) ** 2))
    assert abs(rms(out) / rms(audio) - 1.0) < 1e-5
    silent = np.zeros(100, np.float32)
    np.testing.assert_array_equal(augment.reverberate(silent, rir), silent)


# ---------------------------------------------------------------------------- augmenter


FULL = augment.WaveformAugmentConfig(
    speeds=(0.9, 1.0, 1.1), noise_prob=1.0, reverb_prob=1.0, num_rirs=8
)


def test_augmenter_deterministic_and_exact_lengths():
    aug = augment.WaveformAugmenter(FULL, SR)
    audio = np.random.default_rng(8).standard_normal(12345).astype(np.float32)
    for seed in range(6):
        speed = aug.choose_speed(np.random.default_rng(seed))
        assert speed in FULL.speeds
        a = aug(audio, np.random.default_rng(seed), speed)
        b = aug(audio, np.random.default_rng(seed), speed)
        np.testing.assert_array_equal(a, b)
        assert a.dtype == np.float32
        assert a.shape == (augment.speed_perturbed_length(len(audio), speed),)
        assert np.all(np.isfinite(a))
    assert not np.array_equal(
        aug(audio, np.random.default_rng(0), 1.0), aug(audio, np.random.default_rng(1), 1.0)
    )
    rng = np.random.default_rng(9)
    for n in (1, 2, 101, 4000, 16001):
        for speed in FULL.speeds:
            out = aug(rng.standard_normal(n).astype(np.float32), rng, speed)
            assert out.shape == (augment.speed_perturbed_length(n, speed),)


def test_augmenter_disabled_is_identity():
    cfg = augment.WaveformAugmentConfig()
    assert not cfg.enabled and FULL.enabled
    assert augment.WaveformAugmentConfig(speeds=(0.9, 1.1)).enabled
    aug = augment.WaveformAugmenter(cfg, SR)
    audio = np.random.default_rng(10).standard_normal(999).astype(np.float32)
    np.testing.assert_array_equal(aug(audio, np.random.default_rng(0)), audio)
    assert aug._rirs is None  # nothing built when nothing is used


def test_augmenter_reverb_only_keeps_length_and_level():
    cfg = augment.WaveformAugmentConfig(reverb_prob=1.0, num_rirs=4, rt60=(0.3, 0.5))
    aug = augment.WaveformAugmenter(cfg, SR)
    audio = (0.1 * np.random.default_rng(11).standard_normal(SR)).astype(np.float32)
    out = aug(audio, np.random.default_rng(0))
    assert out.shape == audio.shape and not np.allclose(out, audio)
    assert abs(np.std(out) / np.std(audio) - 1.0) < 1e-3
    assert len(aug.rirs) == 4


def test_augmenter_noise_file_resampled_and_downmixed(tmp_path):
    # 8 kHz stereo: left 500 Hz, right 1500 Hz. Played at 16 kHz without resampling they
    # would read as 1000 / 3000 Hz; taking one channel would lose a tone.
    t = np.arange(8000 * 3) / 8000
    stereo = np.stack([np.sin(2 * np.pi * 500 * t), np.sin(2 * np.pi * 1500 * t)], axis=1)
    path = tmp_path / "noise.wav"
    soundfile.write(path, 0.5 * stereo, 8000, subtype="FLOAT")
    cfg = augment.WaveformAugmentConfig(noise_prob=1.0, snr_db=(10.0, 10.0), noise_files=(path,))
    aug = augment.WaveformAugmenter(cfg, SR)
    assert aug._noises is None  # loaded lazily
    audio = (0.1 * np.random.default_rng(12).standard_normal(SR)).astype(np.float32)
    out = aug(audio, np.random.default_rng(0))
    added = out.astype(np.float64) - audio
    assert abs(_snr_db(audio, added) - 10.0) < 1e-3
    spec = np.abs(np.fft.rfft(added * np.hanning(SR)))  # 1 Hz bins
    top2 = sorted(np.argsort(spec)[-2:])
    assert abs(top2[0] - 500) <= 1 and abs(top2[1] - 1500) <= 1
    assert 0.8 < spec[top2[0]] / spec[top2[1]] < 1.25  # equal-level channels, averaged
    assert aug.noises[0].shape == (3 * SR,)


def test_augmenter_pickles_without_caches():
    aug = augment.WaveformAugmenter(FULL, SR)
    audio = np.random.default_rng(13).standard_normal(4000).astype(np.float32)
    want = aug(audio, np.random.default_rng(5), 1.1)
    assert aug._rirs is not None
    blob = pickle.dumps(aug)
    assert len(blob) < 2000  # the RIR bank stays behind
    clone = pickle.loads(blob)
    assert clone._rirs is None and clone.cfg == FULL and clone.sample_rate == SR
    np.testing.assert_array_equal(clone(audio, np.random.default_rng(5), 1.1), want)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"speeds": (0.9, 0.0)}, "speeds"),
        ({"speeds": ()}, "speeds"),
        ({"noise_prob": 1.5}, "noise_prob"),
        ({"reverb_prob": -0.1}, "reverb_prob"),
        ({"snr_db": (20.0, 5.0)}, "snr_db"),
        ({"rt60": (0.0, 0.5)}, "rt60"),
        ({"reverb_prob": 0.5, "num_rirs": 0}, "num_rirs"),
        ({"noise_prob": 0.5, "noise_exponents": ()}, "noise_exponents"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        augment.WaveformAugmentConfig(**kwargs)


def test_config_accepts_lists_and_missing_file_names_path(tmp_path):
    cfg = augment.WaveformAugmentConfig(speeds=[0.9, 1.1], snr_db=[0, 10])
    assert cfg.speeds == (0.9, 1.1) and cfg.snr_db == (0, 10)
    hash(cfg)
    missing = tmp_path / "nope.wav"
    cfg = augment.WaveformAugmentConfig(noise_prob=1.0, noise_files=(str(missing),))
    with pytest.raises(ValueError, match="nope.wav"):
        augment.WaveformAugmenter(cfg, SR)
    with pytest.raises(ValueError, match="sample_rate"):
        augment.WaveformAugmenter(augment.WaveformAugmentConfig(), 0)
