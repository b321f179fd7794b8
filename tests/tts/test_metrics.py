"""MCD-DTW and F0 RMSE against brute-force and closed-form references."""

import math

import librosa
import numpy as np
import pytest

from jaxspeech.metrics import speech as tts

SR = 16000


def _all_paths(n: int, m: int):
    """Every monotonic path (0, 0) -> (n-1, m-1) with steps (1,0), (0,1), (1,1)."""

    def walk(i, j):
        if (i, j) == (n - 1, m - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 0), (0, 1), (1, 1)):
            if i + di < n and j + dj < m:
                for rest in walk(i + di, j + dj):
                    yield [(i, j)] + rest

    return list(walk(0, 0))


def _best_path(cost: np.ndarray) -> list[tuple[int, int]]:
    return min(_all_paths(*cost.shape), key=lambda p: sum(cost[i, j] for i, j in p))


def _is_monotonic_path(path: np.ndarray, n: int, m: int) -> bool:
    steps = {tuple(s) for s in np.diff(path, axis=0)}
    ends = tuple(path[0]) == (0, 0) and tuple(path[-1]) == (n - 1, m - 1)
    return ends and steps <= {(1, 0), (0, 1), (1, 1)}


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (3, 1), (2, 2), (3, 4), (4, 4), (5, 6)])
def test_dtw_path_has_the_brute_force_minimum_cost(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(3):
        cost = rng.uniform(0.0, 1.0, shape)
        path = tts.dtw_path(cost)
        assert path.dtype.kind == "i" and path.shape[1] == 2
        assert _is_monotonic_path(path, *shape)
        want = min(sum(cost[i, j] for i, j in p) for p in _all_paths(*shape))
        np.testing.assert_allclose(cost[path[:, 0], path[:, 1]].sum(), want, rtol=1e-12)


def test_brute_force_enumerates_delannoy_many_paths():  # the reference itself
    assert len(_all_paths(3, 3)) == 13 and len(_all_paths(5, 6)) == 681


def test_mcd_of_identical_cepstra_is_zero():
    ceps = np.random.default_rng(0).standard_normal((17, 24))
    assert tts.mcd_dtw(ceps, ceps) == 0.0


def test_mcd_is_symmetric():
    rng = np.random.default_rng(1)
    for n, m in [(9, 14), (20, 11), (1, 5)]:
        a, b = rng.standard_normal((n, 24)), rng.standard_normal((m, 24))
        np.testing.assert_allclose(tts.mcd_dtw(a, b), tts.mcd_dtw(b, a), rtol=1e-12)


def test_mcd_equals_direct_computation_along_the_brute_force_path():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    dist = np.array([[np.linalg.norm(x - y) for y in b] for x in a])
    path = _best_path(dist)
    want = np.mean(
        [10.0 / np.log(10.0) * np.sqrt(2.0 * np.sum((a[i] - b[j]) ** 2)) for i, j in path]
    )
    np.testing.assert_allclose(tts.mcd_dtw(a, b), want, rtol=1e-12)


def _utterance(f0s, seed: int, seconds: float = 0.15) -> np.ndarray:
    """A speech-like test signal: harmonic 'vowels' on the given F0s with different
    spectral tilts, separated by noise 'consonants', over a -60 dB noise floor."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    parts = []
    for n, f0 in enumerate(f0s):
        tilt = 0.5 + 0.4 * ((n * 7) % 5) / 4
        vowel = sum(tilt**k * np.sin(2 * np.pi * f0 * k * t) for k in range(1, 12))
        parts += [0.2 * vowel * np.hanning(t.size), 0.05 * rng.standard_normal(t.size // 3)]
    wave = np.concatenate(parts)
    return (wave + 1e-3 * rng.standard_normal(wave.size)).astype(np.float32)


def test_mcd_of_a_time_stretched_copy_is_much_smaller_than_of_another_signal():
    ref = _utterance([110, 160, 130, 200, 120], seed=0)
    stretched = librosa.effects.time_stretch(ref, rate=0.8)  # 25% longer, same spectra
    other = _utterance([230, 90, 300, 180, 250], seed=1)
    assert abs(len(stretched) / len(ref) - 1.25) < 0.01
    same = tts.mcd_dtw_waves(ref, stretched, SR)
    different = tts.mcd_dtw_waves(ref, other, SR)
    assert 0 < same < 0.5 * different, (same, different)
    assert tts.mcd_dtw_waves(ref, ref, SR) == 0.0


def test_mcd_ignores_the_overall_gain():  # c0 is left out and the floor follows the peak
    ref = _utterance([110, 160], seed=4)
    assert tts.mcd_dtw_waves(ref, 0.1 * ref, SR) < 1e-3


def test_mel_cepstrum_frames_and_coefficients():
    wave = _utterance([150], seed=3)
    ceps = tts.mel_cepstrum(wave, SR)
    assert ceps.dtype == np.float64 and ceps.shape == (1 + len(wave) // 160, 24)
    # c1..c24 of the orthonormal DCT of ln(mel amplitude): recompute with numpy's own DCT.
    mel = librosa.feature.melspectrogram(
        y=wave, sr=SR, n_fft=512, hop_length=160, win_length=400, n_mels=80
    )
    mel = mel.astype(np.float64)
    log_amp = 0.5 * np.log(np.maximum(mel, mel.max() * 1e-8))  # 80 dB below the peak
    k, n = np.arange(25)[:, None], np.arange(80)[None, :]
    dct = np.sqrt(2 / 80) * np.cos(np.pi * k * (2 * n + 1) / 160)
    np.testing.assert_allclose(ceps, (dct @ log_amp)[1:].T, atol=1e-9)
    assert tts.mel_cepstrum(wave, SR, num_coeffs=12).shape[1] == 12
    silence = tts.mel_cepstrum(np.zeros(1600, np.float32), SR)
    assert silence.shape == (11, 24) and np.all(np.isfinite(silence))


def _tone(f0: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (0.3 * sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))).astype(np.float32)


def test_f0_rmse_of_two_harmonic_tones():
    out = tts.f0_rmse(_tone(120.0), _tone(130.0), SR)
    assert abs(out["f0_rmse_hz"] - 10.0) < 0.5, out
    # 1200 log2(130 / 120) = 138.6 cents; pYIN's pitch grid is 10 cents wide.
    assert abs(out["f0_rmse_cents"] - 1200 * math.log2(130 / 120)) < 10.0, out
    assert out["voicing_error"] == 0.0 and out["frames"] == out["aligned_frames"] >= 101


def test_f0_rmse_of_a_tone_against_itself_is_zero():
    out = tts.f0_rmse(_tone(200.0, 0.5), _tone(200.0, 0.5), SR)
    assert out["f0_rmse_hz"] == 0.0 and out["f0_rmse_cents"] == 0.0 and out["frames"] > 0


def test_f0_rmse_of_unvoiced_synthesis_is_nan_with_full_voicing_error():
    out = tts.f0_rmse(_tone(120.0, 0.5), np.zeros(SR // 2, np.float32), SR)
    assert math.isnan(out["f0_rmse_hz"]) and math.isnan(out["f0_rmse_cents"])
    assert out["frames"] == 0 and out["voicing_error"] == 1.0


def test_a_reference_analysed_once_scores_as_the_waves_do(monkeypatch):
    """`Reference` reused for two syntheses: the same MCD and F0 errors as the waveform
    functions, with the recording's cepstrum and pYIN computed once (the waveform
    functions: twice and once per synthesis)."""
    ref_wave, syns = _tone(120.0, 0.5), [_tone(130.0, 0.6), _utterance([110, 160], seed=5)]
    want = [(tts.mcd_dtw_waves(ref_wave, s, SR), tts.f0_rmse(ref_wave, s, SR)) for s in syns]
    calls = {"mel_cepstrum": 0, "_f0": 0}

    def counted(name, f):
        def call(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)

        return call

    for name in calls:
        monkeypatch.setattr(tts, name, counted(name, getattr(tts, name)))
    ref = tts.Reference(ref_wave, SR)
    got = [(tts.mcd_dtw_against(ref, s), tts.f0_rmse_against(ref, s)) for s in syns]
    assert got == want
    # The reference's cepstrum and F0 once; each synthesis's cepstrum twice, F0 once.
    assert calls == {"mel_cepstrum": 1 + 2 * len(syns), "_f0": 1 + len(syns)}


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: tts.mel_cepstrum(np.zeros(0), SR), "wave is empty"),
        (lambda: tts.mel_cepstrum(np.zeros((2, 800)), SR), "must be 1-D"),
        (lambda: tts.mcd_dtw_waves(np.zeros(0), np.ones(800), SR), "reference audio is empty"),
        (lambda: tts.mcd_dtw_waves(np.ones(800), np.zeros((1, 8)), SR), "synthesized audio must"),
        (lambda: tts.f0_rmse_against(tts.Reference([], SR), np.ones(8)), "reference audio is"),
        (lambda: tts.mel_cepstrum(np.full(800, np.nan), SR), "non-finite"),
        (lambda: tts.f0_rmse(np.zeros(SR // 2), _tone(120.0, 0.5), SR), "no voiced frame"),
        (lambda: tts.f0_rmse(_tone(120.0, 0.5), np.zeros(0), SR), "synthesized audio is empty"),
        (lambda: tts.dtw_path(np.zeros(5)), "non-empty 2-D"),
        (lambda: tts.dtw_path(np.zeros((0, 3))), "non-empty 2-D"),
        (lambda: tts.dtw_path(np.full((2, 2), np.inf)), "non-finite"),
        (lambda: tts.mcd_dtw(np.zeros((3, 24)), np.zeros((3, 12))), "same number"),
        (lambda: tts.mcd_dtw(np.zeros((0, 24)), np.zeros((3, 24))), "at least one frame"),
    ],
)
def test_bad_inputs_raise_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
