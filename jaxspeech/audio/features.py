"""Log-mel features as pure jnp functions, computed inside the jitted train step.

The filterbank and window come from librosa (computed once, in numpy, at trace
time) so our features match librosa's `melspectrogram` exactly; only the
framing, FFT and log run in JAX, batched, on the accelerator.

On CPU the frames are processed a few hundred at a time (a loop over time
chunks), so that the FFT's input and output stay in cache: on a 2-core VM
that made a batch of 32 x 10 s about 2.5x faster than one batched pass
(`benchmarks/features.py`). Other platforms run one batched pass.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import librosa
import numpy as np

from jaxspeech.audio import mfcc


@dataclasses.dataclass(frozen=True)
class LogMelConfig:
    """Front-end parameters (`config.features`): the log-mel's, and with kind "mfcc" the
    cepstra computed from it (`jaxspeech.audio.mfcc`). Also recorded in each split's
    `stats.json` by data_prep."""

    sample_rate: int = 16000
    n_fft: int = 512
    win_length: int = 400  # 25 ms at 16 kHz
    hop_length: int = 160  # 10 ms at 16 kHz
    num_mel_bins: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    log_floor: float = 1e-6  # added before the log so silence is finite
    kind: str = "log_mel"  # or "mfcc": the log-mel's DCT (the fields below)
    num_ceps: int = 40  # MFCCs kept (mfcc only)
    lifter: float = 22.0  # cepstral lifter L, 0 = off (mfcc only)
    deltas: int = 0  # orders of deltas appended, 0-2 (mfcc only)

    def __post_init__(self):
        if self.kind not in mfcc.FEATURE_KINDS:
            raise ValueError(
                f"unknown feature kind {self.kind!r}; choose one of {mfcc.FEATURE_KINDS}"
            )
        if self.kind == "mfcc" and not 0 <= self.deltas <= mfcc.MAX_DELTAS:
            raise ValueError(f"deltas must be in [0, {mfcc.MAX_DELTAS}], got {self.deltas}")

    @property
    def num_features(self) -> int:
        """Features per frame, the encoder's input width: num_mel_bins, or for MFCC
        num_ceps * (1 + deltas)."""
        if self.kind == "mfcc":
            return mfcc.feature_width(self.num_ceps, self.deltas)
        return self.num_mel_bins

    def as_dict(self) -> dict:
        """The settings stats.json records. The MFCC fields only for kind "mfcc": a log-mel
        front end's record is the one it had before they existed (prepared data stays
        valid)."""
        d = dataclasses.asdict(self)
        if self.kind != "mfcc":
            d = {k: v for k, v in d.items() if k not in _MFCC_FIELDS}
        return d | {"window": "hann", "center": True}


_MFCC_FIELDS = ("kind", "num_ceps", "lifter", "deltas")


def floor_div(n, d):
    """n // d; on a JAX integer array without `lax.rem` (jnp's `//` on signed integers
    corrects the truncating division with a remainder, which jax2onnx 0.17.1 cannot lower
    with a symbolic batch): truncate, then step down where n < 0 and d does not divide n."""
    if not isinstance(n, jax.Array):
        return n // d
    q = jax.lax.div(n, jnp.asarray(d, n.dtype))
    return q - ((n < 0) & (q * d != n)).astype(n.dtype)


def num_frames(num_samples: jax.Array | int, hop_length: int) -> jax.Array | int:
    """Frames of a centred STFT of `num_samples` samples: 1 + S // hop (librosa, center=True)."""
    return 1 + floor_div(num_samples, hop_length)


@functools.lru_cache(maxsize=16)
def _window(win_length: int) -> np.ndarray:
    """(win_length,) float32 periodic Hann window (librosa's `get_window("hann", fftbins=True)`)."""
    return librosa.filters.get_window("hann", win_length, fftbins=True).astype(np.float32)


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


# Frames per FFT call on CPU (batch rows x frames of a time chunk): a few hundred keep
# the FFT's input and output in cache; 32 x 10 s in one call took 2.5x as long.
_CPU_FRAMES_PER_CHUNK = 512


def _frames_of_blocks(blocks_bng: jax.Array, t: int, hop_blocks: int, win_blocks: int) -> jax.Array:
    """(B, N, g) signal blocks -> (B, t, win_blocks * g) frames; frame i starts at block
    i * hop_blocks. Strided slices, concatenated: no gather."""
    last = hop_blocks * (t - 1) + 1
    return jnp.concatenate(
        [
            jax.lax.slice_in_dim(blocks_bng, j, j + last, hop_blocks, axis=1)
            for j in range(win_blocks)
        ],
        axis=-1,
    )


@functools.lru_cache(maxsize=16)
def _dft_matrix(cfg: LogMelConfig) -> np.ndarray:
    """(win_length, 2 * (n_fft // 2 + 1)) float32: the windowed real DFT of a frame's
    support zero-padded to n_fft, as [cos | -sin] columns (computed in float64)."""
    n = np.arange(cfg.win_length)[:, None]
    k = np.arange(cfg.n_fft // 2 + 1)[None, :]
    ang = 2.0 * np.pi * ((n * k) % cfg.n_fft) / cfg.n_fft  # exact phase, no large arguments
    w = _window(cfg.win_length).astype(np.float64)[:, None]
    return np.concatenate([w * np.cos(ang), -w * np.sin(ang)], axis=1).astype(np.float32)


def log_mel_of_frames(frames_btw: jax.Array, cfg: LogMelConfig) -> jax.Array:
    """(B, T, win_length) frames under the window's support -> (B, T, F) log-mel.

    librosa centres the window in an n_fft frame; the FFT of the windowed support
    zero-padded at the end differs from that only by a circular shift, i.e. a phase,
    so the power spectrum is the same.
    """
    spec = jnp.fft.rfft(frames_btw * _window(cfg.win_length), n=cfg.n_fft, axis=-1)
    power = jnp.real(spec) ** 2 + jnp.imag(spec) ** 2
    mel = jnp.einsum("btf,fm->btm", power, mel_filterbank(cfg), precision="highest")
    return jnp.log(mel + cfg.log_floor)


def log_mel_of_windows(buf_bs: jax.Array, cfg: LogMelConfig, m: int) -> jax.Array:
    """(B, S) samples -> (B, m, F) log-mel of the m windows (win_length samples each)
    that start every hop from sample 0; S >= hop * (m - 1) + win_length. No centring:
    the caller's buffer starts where the first window does (the streaming front end).
    """
    hop, win = cfg.hop_length, cfg.win_length
    if isinstance(buf_bs.shape[0], int):
        idx = hop * np.arange(m)[:, None] + np.arange(win)[None, :]
        return log_mel_of_frames(buf_bs[:, idx], cfg)
    # A symbolic batch (an exported stream step): the windowed DFT as one strided VALID
    # convolution, as `log_mel` does for symbolic shapes (no gather, no FFT for jax2onnx).
    spec = jax.lax.conv_general_dilated(
        buf_bs[:, : hop * (m - 1) + win, None],
        _dft_matrix(cfg)[:, None, :],
        window_strides=(hop,),
        padding="VALID",
        dimension_numbers=("NWC", "WIO", "NWC"),
        precision="highest",
    )
    return _log_mel_of_spectrum(spec, cfg)


def _log_mel_of_spectrum(spec_btk: jax.Array, cfg: LogMelConfig) -> jax.Array:
    """(B, T, 2K) [real | imaginary] spectrum (`_dft_matrix`'s columns) -> (B, T, F) log-mel."""
    re, im = jnp.split(spec_btk, 2, axis=-1)
    mel = jnp.einsum("btf,fm->btm", re**2 + im**2, mel_filterbank(cfg), precision="highest")
    return jnp.log(mel + cfg.log_floor)


def _log_mel_chunked(audio_bs: jax.Array, cfg: LogMelConfig, chunk: int) -> jax.Array:
    """log_mel of a concretely shaped batch, `chunk` frames of time per step of a loop."""
    b, s = audio_bs.shape
    hop, win = cfg.hop_length, cfg.win_length
    t = 1 + s // hop
    n_chunks = -(-t // chunk)
    # Blocks of g samples: frame i is blocks [i * hop / g, (i * hop + win) / g).
    g = math.gcd(hop, win)
    hop_b, win_b = hop // g, win // g
    left = cfg.n_fft // 2 - (cfg.n_fft - win) // 2  # centring pad up to the window's support
    total = -(-((n_chunks * chunk - 1) * hop + win) // g) * g
    right = total - left - s  # < 0 when the last samples reach no frame (hop > window / 2)
    audio_bs = audio_bs[:, : s + min(right, 0)]
    blocks = jnp.pad(audio_bs, ((0, 0), (left, max(right, 0)))).reshape(b, total // g, g)
    if n_chunks == 1:
        return log_mel_of_frames(_frames_of_blocks(blocks, t, hop_b, win_b), cfg)
    span = hop_b * (chunk - 1) + win_b

    def one_chunk(i: jax.Array) -> jax.Array:
        blk = jax.lax.dynamic_slice_in_dim(blocks, i * chunk * hop_b, span, axis=1)
        return log_mel_of_frames(_frames_of_blocks(blk, chunk, hop_b, win_b), cfg)

    out_nbcf = jax.lax.map(one_chunk, jnp.arange(n_chunks))
    return jnp.moveaxis(out_nbcf, 0, 1).reshape(b, n_chunks * chunk, -1)[:, :t]


def log_mel(audio_bs: jax.Array, cfg: LogMelConfig = LogMelConfig()) -> jax.Array:
    """Natural-log mel power spectrogram.

    Args:
      audio_bs: (B, S) float32 waveform in [-1, 1].
    Returns:
      (B, T, num_mel_bins) float32 with T = 1 + S // hop_length; equals
      log(librosa.feature.melspectrogram(center=True, pad_mode="constant") + log_floor).
    """
    audio_bs = audio_bs.astype(jnp.float32)
    b, s = audio_bs.shape
    blockable = cfg.win_length // math.gcd(cfg.hop_length, cfg.win_length) <= 32
    if not (isinstance(b, int) and isinstance(s, int)):
        # Symbolic shapes (an exported model): framing + windowed DFT as one strided
        # convolution with constant padding (ONNX Conv). No gather (jax2onnx's gather
        # lowering breaks on constrained symbolic dims), no FFT (jax2onnx cannot lower an
        # RFFT with a symbolic batch), no symbolic pad widths (ONNX Pad needs constants).
        left = cfg.n_fft // 2 - (cfg.n_fft - cfg.win_length) // 2  # as _log_mel_chunked
        spec = jax.lax.conv_general_dilated(
            audio_bs[..., None],
            _dft_matrix(cfg)[:, None, :],
            window_strides=(cfg.hop_length,),
            padding=[(left, cfg.win_length - left)],  # T = 1 + S // hop frames
            dimension_numbers=("NWC", "WIO", "NWC"),
            precision="highest",
        )
        return _log_mel_of_spectrum(spec, cfg)
    if not blockable:
        # A hop/window without a usable common block: gather the frames (n_fft wide)
        # and keep their window's support.
        lpad = (cfg.n_fft - cfg.win_length) // 2
        frames = frame_signal(audio_bs, cfg.n_fft, cfg.hop_length)
        return log_mel_of_frames(frames[..., lpad : lpad + cfg.win_length], cfg)
    t = 1 + s // cfg.hop_length
    cpu_chunk = min(t, max(1, _CPU_FRAMES_PER_CHUNK // max(b, 1)))
    return jax.lax.platform_dependent(
        audio_bs,
        cpu=functools.partial(_log_mel_chunked, cfg=cfg, chunk=cpu_chunk),
        default=functools.partial(_log_mel_chunked, cfg=cfg, chunk=t),
    )


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


def reference_log_mel(audio: np.ndarray, cfg: LogMelConfig) -> np.ndarray:
    """(S,) waveform -> (1 + S // hop, M) raw log-mel of the run's front end (librosa's
    mel power equals `log_mel`'s; on the host: no compilation per length)."""
    power = librosa.feature.melspectrogram(
        y=np.asarray(audio, np.float32),
        sr=cfg.sample_rate,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        n_mels=cfg.num_mel_bins,
        fmin=cfg.fmin,
        fmax=cfg.fmax,
        center=True,
        pad_mode="constant",
    )
    return np.log(power.T.astype(np.float64) + cfg.log_floor)
