"""Log-mel features as pure jnp functions, computed inside the jitted train step.

The filterbank and window come from librosa (computed once, in numpy, at trace
time) so our features match librosa's `melspectrogram` exactly; only the
framing, FFT and log run in JAX, batched, on the accelerator.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import librosa
import numpy as np


@dataclasses.dataclass(frozen=True)
class LogMelConfig:
    """Feature parameters. Also recorded in each split's `stats.json` by data_prep."""

    sample_rate: int = 16000
    n_fft: int = 512
    win_length: int = 400  # 25 ms at 16 kHz
    hop_length: int = 160  # 10 ms at 16 kHz
    num_mel_bins: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-6  # added before the log so silence is finite

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"window": "hann", "center": True}


def num_frames(num_samples: jax.Array | int, hop_length: int) -> jax.Array | int:
    """Frames of a centred STFT of `num_samples` samples: 1 + S // hop (librosa, center=True)."""
    return 1 + num_samples // hop_length


@functools.lru_cache(maxsize=16)
def _window(n_fft: int, win_length: int) -> np.ndarray:
    """(n_fft,) float32: a periodic Hann window of win_length, zero-padded to n_fft, centred."""
    win = librosa.filters.get_window("hann", win_length, fftbins=True)
    return librosa.util.pad_center(win, size=n_fft).astype(np.float32)


@functools.lru_cache(maxsize=16)
def mel_filterbank(cfg: LogMelConfig) -> np.ndarray:
    """(n_fft // 2 + 1, num_mel_bins) float32 slaney mel filterbank (librosa's default)."""
    fb = librosa.filters.mel(
        sr=cfg.sample_rate,
        n_fft=cfg.n_fft,
        n_mels=cfg.num_mel_bins,
        fmin=cfg.fmin,
        fmax=cfg.fmax,
        htk=False,
        norm="slaney",
    )
    return fb.T.astype(np.float32)


def frame_signal(audio_bs: jax.Array, n_fft: int, hop_length: int) -> jax.Array:
    """(B, S) -> (B, 1 + S // hop, n_fft) frames of a zero-padded, centred signal."""
    _, s = audio_bs.shape
    t = 1 + s // hop_length
    padded = jnp.pad(audio_bs, ((0, 0), (n_fft // 2, n_fft // 2)))
    idx = jnp.arange(t)[:, None] * hop_length + jnp.arange(n_fft)[None, :]
    return padded[:, idx]


def log_mel(audio_bs: jax.Array, cfg: LogMelConfig = LogMelConfig()) -> jax.Array:
    """Natural-log mel power spectrogram.

    Args:
      audio_bs: (B, S) float32 waveform in [-1, 1].
    Returns:
      (B, T, num_mel_bins) float32 with T = 1 + S // hop_length; equals
      log(librosa.feature.melspectrogram(center=True, pad_mode="constant") + log_floor).
    """
    frames = frame_signal(audio_bs.astype(jnp.float32), cfg.n_fft, cfg.hop_length)
    spec = jnp.fft.rfft(frames * _window(cfg.n_fft, cfg.win_length), axis=-1)
    power = jnp.real(spec) ** 2 + jnp.imag(spec) ** 2
    mel = jnp.einsum("btf,fm->btm", power, mel_filterbank(cfg), precision="highest")
    return jnp.log(mel + cfg.log_floor)


def normalize(
    feats_btf: jax.Array, mean_f: jax.Array, std_f: jax.Array, mask_bt: jax.Array
) -> jax.Array:
    """Global CMVN: (x - mean) / std per bin; padded frames (mask False) are set to 0."""
    out = (feats_btf - mean_f) / std_f
    return jnp.where(mask_bt[..., None], out, 0.0)


def stats_to_mean_std(
    count: float, sum_f: np.ndarray, sum_sq_f: np.ndarray, min_std: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin mean and standard deviation (float32) from global count / sum / sum of squares."""
    if count <= 0:
        raise ValueError("normalization statistics cover zero frames")
    mean = np.asarray(sum_f, np.float64) / count
    var = np.maximum(np.asarray(sum_sq_f, np.float64) / count - mean**2, 0.0)
    return mean.astype(np.float32), np.maximum(np.sqrt(var), min_std).astype(np.float32)
