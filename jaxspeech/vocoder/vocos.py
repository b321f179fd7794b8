"""Vocos's generator (Siuzdyk, 2023): log-mel frames -> STFT magnitude and phase per frame
-> inverse STFT, in Flax NNX.

(B, T, M) log-mel -> masked conv (K 7) -> LayerNorm -> L ConvNeXt blocks -> LayerNorm ->
linear head -> per frame n_fft / 2 + 1 log-magnitudes and phases -> complex spectrum
mag * (cos p, sin p) -> inverse STFT (hop = the features' hop, n_fft = 4 * hop, Hann) ->
(B, T * hop) audio in [-1, 1]. Every layer runs at the frame rate (100 frames/s at 16 kHz):
the upsampling HiFi-GAN learns with transposed convolutions (and pays for at the sample
rate) is the fixed inverse STFT here, so training and inference cost an order of magnitude
less, which is what a few minutes of CPU can train (configs/vocoder.py).

ConvNeXt block (Liu et al., 2022, as Vocos's 1-D one): x + gamma * W2 gelu(W1 LN(dwconv_7(x))),
gamma a per-channel layer scale starting at 1 / L. The phase is predicted as an angle and
used through (cos p, sin p), so no phase-wrapping loss is needed; the magnitude is exp of
the prediction, clipped at 1e2 (Vocos's clip; done on the log so the gradient stays finite).

With `mel_prior` (the front end's settings; config.vocoder.vocos_mel_prior), the head's
log-magnitude is a residual over FreeV's prior (Lv et al., 2024): the power spectrum the
filterbank's pseudo-inverse gives back from the input mel (`magnitude_prior`, the estimate
Griffin-Lim starts from), so the network learns the phase and what the mel's band averages
lost, not the spectral envelope the mel already holds: a fixed matmul per frame, no
parameters. Copy synthesis fits far better (held-out log-mel L1 after 1,000 demo steps
0.376 against 0.648), but through FastSpeech2 a faithful inverter keeps its smoothed
frames: the demo leaves it off (docs/results/tts.md, "A magnitude prior").

The inverse STFT is written without FFT ops, so that jax2onnx converts it (the export,
`vocoder.generator`): the inverse real DFT is a matmul with a fixed (2 (n_fft / 2 + 1),
n_fft) cos / sin basis (times the synthesis window), then overlap-add of the frames as
n_fft / hop shifted sums of hop-long chunks, divided by the window-sum-square envelope of
the valid frames, and the centre trim (frames are centred on t * hop, as the front end's:
`jaxspeech.audio.features.log_mel`), so T frames give T * hop samples. It equals
`librosa.istft(center=True)` (tests/tts/test_vocos.py).

Padding: the convolution zeroes the frames past a row's valid length first (as
`hifigan.MaskedConv`), every other layer is per frame, and the inverse STFT zeroes those
frames' spectra and normalizes by the valid frames' envelope alone, so a row's valid output
equals that of the row alone, unpadded; samples past the valid frames are 0.

Shapes: B batch, T frames, S samples, M mel bins, D channels, F frequency bins
(n_fft / 2 + 1), N n_fft, R n_fft / hop.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.audio import features
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.models.layers import Dense, Dtype, LayerNorm, depthwise_conv1d, logical_init
from jaxspeech.vocoder.hifigan import MaskedConv, zero

MAX_LOG_MAGNITUDE = math.log(1e2)  # Vocos clips the magnitude at 1e2
WINDOW_OVERLAP = 4  # n_fft = 4 * hop (Vocos's 1024 / 256): 4 frames cover every sample
# A size for CPU demos (configs/vocoder.py): 0.76 M parameters, yet its forward and backward
# pass costs a tenth of HiFi-GAN's DEMO_GENERATOR's (0.23 M parameters, every layer at the
# sample rate): 30 ms vs 350 ms for 4 segments of 8192 samples on the loaded 2-core VM.
DEMO_GENERATOR = dict(dim=128, intermediate_dim=384, layers=6)


def hann_window(n: int) -> np.ndarray:
    """(N,) float64 periodic Hann window (torch.hann_window's, librosa's "hann")."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


def inverse_dft_basis(n_fft: int, window: np.ndarray) -> np.ndarray:
    """(2F, N) float32: [Re X ; Im X] (B, T, 2F) @ basis = the windowed inverse real DFT of
    every frame, x[n] = w[n] / N sum_k c_k (Re X_k cos(2 pi k n / N) - Im X_k sin(...)),
    c_k = 1 at DC and Nyquist, 2 between (the conjugate half); the imaginary parts of DC
    and Nyquist drop out (their sines are 0), as numpy's irfft ignores them."""
    f = n_fft // 2 + 1
    angle = 2 * np.pi * np.outer(np.arange(f), np.arange(n_fft)) / n_fft  # (F, N)
    c = np.full((f, 1), 2.0)
    c[0] = c[-1] = 1.0  # n_fft even: the last bin is Nyquist
    basis = np.concatenate([c * np.cos(angle), -c * np.sin(angle)]) / n_fft
    return (basis * window[None, :]).astype(np.float32)


def overlap_add(frames_btn: jax.Array, hop: int) -> jax.Array:
    """(B, T, N) frames, N = R * hop, frame t starting at sample t * hop -> (B, (T - 1) *
    hop + N) their sum: chunk r of every frame is shifted r chunks later; R pads and adds."""
    b, t, n = frames_btn.shape
    r = n // hop
    chunks = frames_btn.reshape(b, t, r, hop)
    out = sum(jnp.pad(chunks[:, :, i], ((0, 0), (i, r - 1 - i), (0, 0))) for i in range(r))
    return out.reshape(b, (t + r - 1) * hop)


def istft(
    real_btf: jax.Array, imag_btf: jax.Array, mask_bt: jax.Array, *, n_fft: int, hop: int
) -> jax.Array:
    """Inverse STFT of (B, T, F) real and imaginary parts, frames centred on t * hop, Hann
    window, as librosa.istft(center=True, length=T * hop) of each row's valid frames: ->
    (B, T * hop) float32, 0 past the valid frames' samples. Frames where `mask_bt` is
    False are ignored (zeroed; the envelope counts the valid frames only)."""
    if n_fft % hop or n_fft // 2 + 1 != real_btf.shape[-1]:
        raise ValueError(f"n_fft {n_fft} must be a multiple of hop {hop} with F = n_fft/2+1")
    t = real_btf.shape[1]
    window = hann_window(n_fft)
    basis = jnp.asarray(inverse_dft_basis(n_fft, window))
    spectrum = jnp.concatenate([real_btf, imag_btf], axis=-1).astype(jnp.float32)
    frames = jnp.where(mask_bt[..., None], spectrum @ basis, 0.0)  # (B, T, N)
    # The window-sum-square envelope of the valid frames: at least w(hop)^2 = 0.25 on every
    # valid sample (the nearest frame's centre is within hop / 2 ... hop), 0 past them.
    squared = jnp.asarray((window**2).astype(np.float32))
    envelope = overlap_add(jnp.where(mask_bt[..., None], squared, 0.0), hop)
    audio = overlap_add(frames, hop)
    audio = jnp.where(envelope > 1e-3, audio / jnp.maximum(envelope, 1e-3), 0.0)
    start = n_fft // 2  # the centre padding of the analysis
    audio = jax.lax.slice_in_dim(audio, start, start + t * hop, axis=1)
    return jnp.where(jnp.repeat(mask_bt, hop, axis=1), audio, 0.0)


# The front end's settings the prior inverts (the generator's `mel_prior` argument: JSON).
PRIOR_KEYS = ("sample_rate", "n_fft", "win_length", "num_mel_bins", "fmin", "fmax", "log_floor")


@functools.lru_cache(maxsize=8)
def prior_basis(cfg: LogMelConfig, synthesis_n_fft: int) -> np.ndarray:
    """(M, F) float32: mel power (B, T, M) @ basis = the power spectrum on the inverse
    STFT's grid (F = synthesis_n_fft / 2 + 1 bins, Hann(synthesis_n_fft)) estimated from
    the front end's mel (`features.mel_filterbank(cfg)`: M filters on n_fft / 2 + 1 bins of
    a Hann(win_length) STFT). FreeV's amplitude prior (Lv et al., 2024): the filterbank's
    pseudo-inverse (the least-squares spectrum Griffin-Lim starts from), carried to the
    synthesis grid by linear interpolation in frequency, times a tone's power gain from
    the analysis window to the synthesis one ((sum of Hann(synthesis_n_fft) / sum of
    Hann(win_length))^2). Its negative lobes are folded by the caller's |.|."""
    fb = features.mel_filterbank(cfg).T.astype(np.float64)  # (M, n_fft / 2 + 1)
    pinv = np.linalg.pinv(fb)  # (n_fft / 2 + 1, M)
    nyquist = cfg.sample_rate / 2
    analysis = np.linspace(0.0, nyquist, cfg.n_fft // 2 + 1)
    synthesis = np.linspace(0.0, nyquist, synthesis_n_fft // 2 + 1)
    # (n_fft / 2 + 1, F): column f interpolates the analysis bins at synthesis bin f.
    interp = np.stack([np.interp(synthesis, analysis, row) for row in np.eye(len(analysis))])
    gain = (hann_window(synthesis_n_fft).sum() / hann_window(cfg.win_length).sum()) ** 2
    return (pinv.T @ interp * gain).astype(np.float32)


def magnitude_prior(mel_btm: jax.Array, cfg: LogMelConfig, synthesis_n_fft: int) -> jax.Array:
    """(B, T, M) raw log-mel of front end `cfg` (log of mel power + log_floor) -> (B, T, F)
    log-magnitude estimate on the synthesis grid (`prior_basis`), floored at 1e-5 in
    magnitude as FreeV's."""
    basis = jnp.asarray(prior_basis(cfg, synthesis_n_fft))
    power = jnp.exp(mel_btm.astype(jnp.float32)) - cfg.log_floor
    return 0.5 * jnp.log(jnp.maximum(jnp.abs(power @ basis), 1e-10))


class ConvNeXtBlock(nnx.Module):
    """x + gamma * W2 gelu(W1 LN(masked depthwise conv(x))): (B, T, D) -> (B, T, D)."""

    def __init__(
        self,
        dim: int,
        intermediate_dim: int,
        layer_scale: float,
        *,
        kernel_size: int = 7,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        init = logical_init(nnx.initializers.normal(0.02), ("conv", "embed"))  # Vocos's std
        self.dw_kernel = nnx.Param(init(rngs.params(), (kernel_size, dim)))
        self.dw_bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (dim,))
        )
        self.norm = LayerNorm(dim, eps=1e-6, dtype=dtype, rngs=rngs)
        self.up = Dense(dim, intermediate_dim, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.down = Dense(intermediate_dim, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        # A small layer scale: each block starts near the identity (ConvNeXt's; Vocos 1 / L).
        self.gamma = nnx.Param(
            logical_init(nnx.initializers.constant(layer_scale), ("embed",))(rngs.params(), (dim,))
        )
        self.dtype = dtype

    def __call__(self, x_btd: jax.Array, mask_bt1: jax.Array) -> jax.Array:
        h = jnp.where(mask_bt1, x_btd.astype(self.dtype), zero(self.dtype))
        # Blocked band matmuls (models.layers: 7-9x faster than a grouped lax.conv on CPU;
        # a grouped conv under a symbolic T, which the export converts).
        h = depthwise_conv1d(
            h, self.dw_kernel[...].astype(self.dtype), self.dw_bias[...].astype(self.dtype)
        )
        h = self.down(jax.nn.gelu(self.up(self.norm(h))))
        return x_btd + self.gamma[...].astype(self.dtype) * h


class VocosGenerator(nnx.Module):
    """(B, T, M) log-mel frames + (B, T) frame mask -> (B, T * hop) float32 waveform in
    [-1, 1], zero past each row's valid frames (the call contract of
    `hifigan.HiFiGANGenerator`; module docstring). Vocos's base size is dim 512,
    intermediate_dim 1536, 8 layers (~13.5 M parameters)."""

    def __init__(
        self,
        *,
        n_mels: int = 80,
        dim: int = 512,
        intermediate_dim: int = 1536,
        layers: int = 8,
        hop: int = 160,
        n_fft: int | None = None,
        kernel_size: int = 7,
        mel_prior: dict | None = None,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        n_fft = n_fft or WINDOW_OVERLAP * hop
        if n_fft % hop or n_fft % 2:
            raise ValueError(f"n_fft {n_fft} must be even and a multiple of the hop {hop}")
        self.embed = MaskedConv(n_mels, dim, kernel_size, init_std=0.02, dtype=dtype, rngs=rngs)
        self.norm = LayerNorm(dim, eps=1e-6, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List(
            ConvNeXtBlock(dim, intermediate_dim, 1.0 / layers, kernel_size=kernel_size,
                          dtype=dtype, rngs=rngs)
            for _ in range(layers)
        )  # fmt: skip
        self.final_norm = LayerNorm(dim, eps=1e-6, dtype=dtype, rngs=rngs)
        self.head = Dense(dim, n_fft + 2, ("embed", None), dtype=dtype, rngs=rngs)
        self.n_mels, self.hop, self.n_fft = n_mels, hop, n_fft
        # The front end's settings (PRIOR_KEYS): the head predicts the log-magnitude's
        # residual over FreeV's prior (`magnitude_prior`); None: the log-magnitude itself
        # (Vocos's). A frozen LogMelConfig: the graph's static data must hash.
        self.mel_prior = None if mel_prior is None else LogMelConfig(**mel_prior)

    def __call__(self, mel_btm: jax.Array, mask_bt: jax.Array) -> jax.Array:
        mask = mask_bt[..., None]
        x = self.norm(self.embed(mel_btm, mask))
        for block in self.blocks:
            x = block(x, mask)
        h = self.head(self.final_norm(x)).astype(jnp.float32)
        log_mag, phase = jnp.split(h, 2, axis=-1)  # (B, T, F) each
        if self.mel_prior is not None:
            log_mag = log_mag + magnitude_prior(mel_btm, self.mel_prior, self.n_fft)
        mag = jnp.exp(jnp.minimum(log_mag, MAX_LOG_MAGNITUDE))
        audio = istft(
            mag * jnp.cos(phase), mag * jnp.sin(phase), mask_bt, n_fft=self.n_fft, hop=self.hop
        )
        return jnp.clip(audio, -1.0, 1.0)
