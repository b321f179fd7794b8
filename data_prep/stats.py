"""Normalization statistics (CMVN): per-utterance sums of the features the model sees
(log-mel, or MFCC with `--features mfcc`), added per shard in file order, then over shards
in shard order."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from jaxspeech.audio.features import LogMelConfig, mel_filterbank
from jaxspeech.audio.mfcc import mfcc_np


@functools.cache
def _blas_controller() -> Any:
    """The process's threadpoolctl controller, built once."""
    # threadpoolctl comes with librosa (via scikit-learn); the controller is built once
    # because inspecting the loaded libraries costs milliseconds, applying it microseconds.
    import threadpoolctl

    return threadpoolctl.ThreadpoolController()


def log_mel(audio_i16: np.ndarray, feature: LogMelConfig) -> np.ndarray:
    """The statistics' features: (F, T) float32 log-mel of an int16 waveform (N,).

    Equals ``log(librosa.feature.melspectrogram(y, power=2.0, pad_mode="constant",
    norm="slaney", ...) + log_floor)`` with the filterbank cached and applied as a BLAS
    matmul: librosa rebuilds the filterbank per call and applies it with an einsum that
    took ~75% of the preparation time on two cores.
    """
    import librosa

    y = audio_i16.astype(np.float32) / 32768.0
    spectrum = librosa.stft(
        y,
        n_fft=feature.n_fft,
        hop_length=feature.hop_length,
        win_length=feature.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
    )
    power = np.square(np.abs(spectrum))  # (n_fft // 2 + 1, T) float32
    # One BLAS thread: parallelism comes from Beam workers, and OpenBLAS threads contending
    # for busy cores made this small matmul 40x slower (21 ms instead of 0.5 ms).
    with _blas_controller().limit(limits=1, user_api="blas"):
        mel = mel_filterbank(feature).T @ power
    return np.log(mel + np.float32(feature.log_floor))


def log_mel_sums(
    audio_i16: np.ndarray, feature: LogMelConfig
) -> tuple[int, np.ndarray, np.ndarray]:
    """(frames, per-bin sum (F,) float64, per-bin sum of squares (F,) float64)."""
    feats = log_mel(audio_i16, feature).astype(np.float64)
    return feats.shape[1], feats.sum(axis=1), np.square(feats).sum(axis=1)


def feature_sums(
    audio_i16: np.ndarray, feature: LogMelConfig
) -> tuple[int, np.ndarray, np.ndarray]:
    """`log_mel_sums` of the model's features: for kind "mfcc" those of the MFCCs (deltas
    included, `jaxspeech.audio.mfcc.mfcc_np`: the model's arithmetic) of the log-mel."""
    if feature.kind != "mfcc":
        return log_mel_sums(audio_i16, feature)
    mel = log_mel(audio_i16, feature)
    with _blas_controller().limit(limits=1, user_api="blas"):  # as in log_mel: one thread
        feats = mfcc_np(mel, feature.num_ceps, feature.lifter, feature.deltas)
    return feats.shape[1], feats.sum(axis=1), np.square(feats).sum(axis=1)


Stats = tuple[int, np.ndarray, np.ndarray]  # (frames, per-bin sum (F,), sum of squares (F,))


def add_stats(total: Stats | None, x: Stats) -> Stats:
    """Adds zeroth, first and second order statistics (float64)."""
    if total is None:
        return int(x[0]), np.array(x[1], np.float64), np.array(x[2], np.float64)
    return total[0] + int(x[0]), total[1] + x[1], total[2] + x[2]


def stats_to_json(stats: Stats | None) -> dict[str, Any] | None:
    """{count, sum (F,), sum_sq (F,)} as JSON values; None stays None (no frames)."""
    if stats is None:
        return None
    return {"count": stats[0], "sum": stats[1].tolist(), "sum_sq": stats[2].tolist()}


def combine_stats(per_shard: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Per-shard {count, sum, sum_sq} -> their total, summed in shard order (None: no frames).

    This is how statistics computed in parallel become the global ones: the sums of sums.
    """
    total = None
    for s in per_shard:
        if s is not None:
            total = add_stats(total, (s["count"], np.asarray(s["sum"]), np.asarray(s["sum_sq"])))
    return stats_to_json(total)
