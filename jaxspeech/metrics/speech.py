"""Objective measures of synthesized speech against a reference recording of the same text.

- MCD-DTW: mel-cepstral distortion (dB) after aligning the two utterances' frames by
  dynamic time warping, as ESPnet's and most TTS papers' `mcd_dtw`.
- F0 RMSE (Hz and cents) over the frames voiced in both, aligned by the same DTW path,
  and the voicing decision error rate over all aligned frames.

The two utterances are never the same length (the synthesizer chooses its own
durations), hence the alignment. numpy and librosa only: these run in evaluation jobs
and notebooks that have no accelerator.

Scoring several syntheses (vocoders) against one recording: `Reference` keeps the
recording's mel cepstrum and pYIN F0 once computed (pYIN costs ~0.1 s per second of
audio), and `mcd_dtw_against` / `f0_rmse_against` take it; `mcd_dtw_waves` and `f0_rmse`
are the same measures of two waveforms.

Bad inputs raise `ValueError`: empty, non-1-D or non-finite audio, and (for F0) a
reference with no voiced frame at all, for which an F0 error is undefined. A reference
that is voiced but shares no voiced aligned frame with the synthesized speech (e.g. a
system that produced silence or noise) is a score, not an error: `f0_rmse` then returns
NaN for the RMSE keys with `frames: 0`, and a voicing error rate that shows why.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import librosa
import numpy as np

# 10 / ln 10 * sqrt(2): the constant of the usual MCD definition (Kubichek, 1993), which
# turns a Euclidean distance between natural-log cepstra (c1..) into decibels.
_MCD_SCALE = 10.0 / math.log(10.0) * math.sqrt(2.0)
# Absolute floor of the mel power (digital silence of a whole utterance stays finite).
_POWER_FLOOR = 1e-20
F0_MIN_HZ, F0_MAX_HZ = 50.0, 500.0
# pYIN's pitch grid in semitones (librosa's default 0.1). Its Viterbi pass is dense in the
# grid's states (twice its bins: voiced and unvoiced), so 0.2 costs a quarter: a 2.5 s
# utterance 0.10 s against 0.32 on the 2-core VM, about a minute of `make demo-tts`'s
# evaluation. The F0 a frame gets moves by 3-8 cents RMS, against errors of hundreds.
F0_RESOLUTION = 0.2


def _check_wave(wave: np.ndarray, name: str) -> np.ndarray:
    """A 1-D, non-empty, finite float waveform, or ValueError naming `name`."""
    wave = np.asarray(wave)
    if wave.ndim != 1:
        raise ValueError(f"{name} must be 1-D audio samples, got shape {wave.shape}")
    if wave.size == 0:
        raise ValueError(f"{name} is empty (0 samples)")
    wave = wave.astype(np.float32)
    if not np.all(np.isfinite(wave)):
        raise ValueError(f"{name} has non-finite samples (NaN or inf)")
    return wave


def _frames(sample_rate: int, window_ms: float, hop_ms: float) -> tuple[int, int, int]:
    """(win_length, hop_length, n_fft) in samples; n_fft the next power of two."""
    win = int(round(sample_rate * window_ms / 1000.0))
    hop = int(round(sample_rate * hop_ms / 1000.0))
    return win, hop, 1 << max(win - 1, 1).bit_length()


def mel_cepstrum(
    wave: np.ndarray,
    sample_rate: int = 16000,
    *,
    num_coeffs: int = 24,
    num_mels: int = 80,
    window_ms: float = 25.0,
    hop_ms: float = 10.0,
    floor_db: float = 80.0,
) -> np.ndarray:
    """(S,) waveform -> (T, C) float64 mel-frequency cepstra c1..cC (c0, the energy, left out
    as MCD implementations do), one frame every `hop_ms` (centred frames, T = 1 + S // hop).

    This is the MFCC-based mel cepstrum: the orthonormal DCT-II of the log of an
    `num_mels`-band mel power spectrum (librosa's filterbank, Hann windows of `window_ms`).
    The log is the natural log of the mel *amplitude* (half that of the power), the scale of
    SPTK's mel-cepstra, for which MCD's 10 / ln 10 factor gives decibels. It is NOT SPTK's
    `mcep` of a WORLD spectral envelope (that needs pysptk and pyworld, which we do not ship):
    it keeps the harmonics that an envelope smooths away, and its filterbank differs from
    an all-pass frequency warping. Absolute MCD values are therefore not comparable with
    other toolkits' numbers, only between systems measured by this function.

    The mel power is floored `floor_db` below the utterance's loudest band (librosa's
    `power_to_db(top_db=80)`, as in its MFCC): the log of the near-empty bands between
    the harmonics of clean (or vocoded) voiced speech would otherwise swing by orders of
    magnitude on a trace of noise and dominate the distance. A floor relative to the peak
    also keeps MCD independent of the overall gain, which only c0 (left out) carries.
    """
    wave = _check_wave(wave, "wave")
    win, hop, n_fft = _frames(sample_rate, window_ms, hop_ms)
    power = librosa.feature.melspectrogram(
        y=wave,
        sr=sample_rate,
        n_fft=n_fft,
        hop_length=hop,
        win_length=win,
        n_mels=num_mels,
        power=2.0,
    ).astype(np.float64)
    floor = max(float(power.max()) * 10.0 ** (-floor_db / 10.0), _POWER_FLOOR)
    log_amplitude = 0.5 * np.log(np.maximum(power, floor))
    # mfcc(S=...) is only the DCT of the given log spectrogram (no dB conversion).
    ceps = librosa.feature.mfcc(S=log_amplitude, n_mfcc=num_coeffs + 1, dct_type=2, norm="ortho")
    return ceps[1:].T


def mel_cepstrum_of_log_mel(
    log_mel_tf: np.ndarray,
    *,
    num_coeffs: int = 24,
    log_floor: float = 1e-6,
    floor_db: float = 80.0,
) -> np.ndarray:
    """(T, M) log-mel frames of our front end (natural log of mel power + `log_floor`,
    `jaxspeech.audio.features.log_mel`) -> (T, C) cepstra c1..cC, as `mel_cepstrum`
    computes them from a waveform: the same floor `floor_db` below the loudest band, the
    log of the mel amplitude and the orthonormal DCT-II. For a synthesizer's predicted
    frames, which have no waveform (no vocoder in the loop)."""
    x = np.asarray(log_mel_tf, dtype=np.float64)
    if x.ndim != 2 or 0 in x.shape or not np.all(np.isfinite(x)):
        raise ValueError(f"log-mel must be non-empty finite (frames, bins), got {x.shape}")
    power = np.maximum(np.exp(x) - log_floor, 0.0)
    floor = max(float(power.max()) * 10.0 ** (-floor_db / 10.0), _POWER_FLOOR)
    log_amplitude = 0.5 * np.log(np.maximum(power, floor))
    ceps = librosa.feature.mfcc(S=log_amplitude.T, n_mfcc=num_coeffs + 1, dct_type=2, norm="ortho")
    return ceps[1:].T


def dtw_path(cost: np.ndarray) -> np.ndarray:
    """(N, M) local costs -> (K, 2) int (i, j) pairs, increasing, from (0, 0) to (N-1, M-1):
    the monotonic alignment with steps (1, 0), (0, 1), (1, 1) whose summed cost over the
    cells it visits is least. librosa's `sequence.dtw` (its default steps and unit
    weights are exactly these) finds it; it returns the path end first, so it is reversed.
    """
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or 0 in cost.shape:
        raise ValueError(f"DTW needs a non-empty 2-D cost matrix, got shape {cost.shape}")
    if not np.all(np.isfinite(cost)):
        raise ValueError("DTW cost matrix has non-finite entries")
    _, path = librosa.sequence.dtw(C=cost, backtrack=True)
    return np.asarray(path[::-1], dtype=np.int64)


def _aligned_distances(ref_ceps: np.ndarray, syn_ceps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, 2) DTW path on the frames' Euclidean distances and the (K,) distances along it."""
    ref = np.asarray(ref_ceps, dtype=np.float64)
    syn = np.asarray(syn_ceps, dtype=np.float64)
    if ref.ndim != 2 or syn.ndim != 2 or ref.shape[1] != syn.shape[1]:
        raise ValueError(
            f"cepstra must be (frames, coefficients) arrays with the same number of "
            f"coefficients, got {ref.shape} and {syn.shape}"
        )
    if ref.shape[0] == 0 or syn.shape[0] == 0:
        raise ValueError(f"cepstra must have at least one frame, got {ref.shape} and {syn.shape}")
    # |a - b|^2 = |a|^2 + |b|^2 - 2 a.b would lose precision for near-identical frames.
    dist = np.sqrt(np.sum(np.square(ref[:, None, :] - syn[None, :, :]), axis=-1))
    path = dtw_path(dist)
    return path, dist[path[:, 0], path[:, 1]]


def mcd_dtw(ref_ceps: np.ndarray, syn_ceps: np.ndarray) -> float:
    """Mel-cepstral distortion in dB of (T1, C) and (T2, C) cepstra (`mel_cepstrum`):
    the DTW path on the Euclidean distances between frames, then the mean over the path of
    (10 / ln 10) * sqrt(2 * sum_c (ref_c - syn_c)^2)."""
    _, dists = _aligned_distances(ref_ceps, syn_ceps)
    return float(_MCD_SCALE * np.mean(dists))


def _f0(wave: np.ndarray, sample_rate: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """(T,) F0 in Hz (NaN where unvoiced) and (T,) voiced flags, by probabilistic YIN."""
    # Two periods of the lowest F0 per analysis frame (YIN needs them), rounded up to a
    # power of two: 1024 samples (64 ms) at 16 kHz.
    frame = 1 << int(math.ceil(math.log2(2.0 * sample_rate / F0_MIN_HZ)))
    f0, voiced, _ = librosa.pyin(
        wave,
        fmin=F0_MIN_HZ,
        fmax=F0_MAX_HZ,
        sr=sample_rate,
        frame_length=frame,
        hop_length=hop,
        center=True,
        resolution=F0_RESOLUTION,
    )
    return f0, voiced


def _f0_hop(sample_rate: int) -> int:
    """The F0 frames' hop in samples: `mel_cepstrum`'s (10 ms), so that one DTW path pairs
    both."""
    return _frames(sample_rate, 25.0, 10.0)[1]


@dataclasses.dataclass(frozen=True, eq=False)
class Reference:
    """A reference recording, (S,) `wave` at `sample_rate` Hz as given, whose analyses
    for the measures (`samples`, `cepstrum`, `pitch`) are computed on first use and kept:
    one object scores any number of syntheses of the same text without analysing the
    recording again. A bad wave (empty, not 1-D, non-finite) raises the measures' own
    ValueError ("reference audio ...") on each use, not when the object is made."""

    wave: np.ndarray
    sample_rate: int

    @functools.cached_property
    def samples(self) -> np.ndarray:
        """(S,) float32 samples, checked."""
        return _check_wave(self.wave, "reference audio")

    @functools.cached_property
    def cepstrum(self) -> np.ndarray:
        """(T, C) `mel_cepstrum` (default analysis settings)."""
        return mel_cepstrum(self.samples, self.sample_rate)

    @functools.cached_property
    def pitch(self) -> tuple[np.ndarray, np.ndarray]:
        """(T,) pYIN F0 in Hz (NaN where unvoiced) and (T,) voiced flags, on the frames of
        `cepstrum`."""
        return _f0(self.samples, self.sample_rate, _f0_hop(self.sample_rate))


def mcd_dtw_against(ref: Reference, syn_wave: np.ndarray) -> float:
    """`mcd_dtw` of (S2,) synthesized speech's `mel_cepstrum` against the reference's."""
    ref_ceps = ref.cepstrum  # first: a bad reference is named before a bad synthesis
    syn_ceps = mel_cepstrum(_check_wave(syn_wave, "synthesized audio"), ref.sample_rate)
    return mcd_dtw(ref_ceps, syn_ceps)


def mcd_dtw_waves(ref_wave: np.ndarray, syn_wave: np.ndarray, sample_rate: int) -> float:
    """`mcd_dtw` of two waveforms' `mel_cepstrum` (default analysis settings)."""
    return mcd_dtw_against(Reference(ref_wave, sample_rate), syn_wave)


def f0_rmse(ref_wave: np.ndarray, syn_wave: np.ndarray, sample_rate: int) -> dict[str, float]:
    """`f0_rmse_against` of two waveforms."""
    return f0_rmse_against(Reference(ref_wave, sample_rate), syn_wave)


def f0_rmse_against(ref: Reference, syn_wave: np.ndarray) -> dict[str, float]:
    """F0 errors of (S2,) synthesized speech against the reference, on the MCD-DTW
    alignment.

    F0 and the voiced / unvoiced decision per 10 ms frame come from librosa's probabilistic
    YIN (`librosa.pyin`, 50-500 Hz: its HMM decides voicing, no threshold of ours), on the
    same centred frames as `mel_cepstrum`, so the DTW path of the two utterances' mel
    cepstra (as in `mcd_dtw`) pairs their F0 frames too.

    Returns {"f0_rmse_hz", "f0_rmse_cents": RMSE over the aligned pairs voiced in both
    (cents: 1200 log2(syn / ref)); NaN when there is none, "voicing_error": share of the
    aligned pairs whose voicing decisions differ, "frames": voiced-in-both pairs used,
    "aligned_frames": length of the path}. ValueError when the reference has no voiced
    frame (the measure is undefined, e.g. silence).
    """
    _ = ref.samples  # first: a bad reference is named before a bad synthesis
    syn_wave = _check_wave(syn_wave, "synthesized audio")
    sample_rate = ref.sample_rate
    ref_f0, ref_voiced = ref.pitch
    if not np.any(ref_voiced):
        raise ValueError("reference audio has no voiced frame: F0 error is undefined")
    syn_f0, syn_voiced = _f0(syn_wave, sample_rate, _f0_hop(sample_rate))
    path, _ = _aligned_distances(ref.cepstrum, mel_cepstrum(syn_wave, sample_rate))
    # Both front ends frame centred windows every hop: T = 1 + S // hop for each.
    i, j = path[:, 0], path[:, 1]
    both = ref_voiced[i] & syn_voiced[j]
    out = {
        "voicing_error": float(np.mean(ref_voiced[i] != syn_voiced[j])),
        "frames": int(np.sum(both)),
        "aligned_frames": int(len(path)),
    }
    if not np.any(both):
        return out | {"f0_rmse_hz": math.nan, "f0_rmse_cents": math.nan}
    ref_hz, syn_hz = ref_f0[i[both]], syn_f0[j[both]]
    cents = 1200.0 * np.log2(syn_hz / ref_hz)
    return out | {
        "f0_rmse_hz": float(np.sqrt(np.mean(np.square(syn_hz - ref_hz)))),
        "f0_rmse_cents": float(np.sqrt(np.mean(np.square(cents)))),
    }
