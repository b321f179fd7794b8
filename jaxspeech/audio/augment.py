"""SpecAugment on device (Park et al., 2019): frequency and time masks, per utterance.

Masks are built with iota comparisons (no scatter), so they are cheap inside the
jitted step and shard along the batch like everything else.

The host-side section at the end (speed, noise, reverb on waveforms) is plain numpy
for the Grain workers.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft
import soundfile
import soxr


def _band_masks(
    key: jax.Array, num: int, max_width_b: jax.Array, extent_b: jax.Array, size: int
) -> jax.Array:
    """(B, size) bool: True inside any of `num` random bands per row.

    Each band has width ~ U[0, max_width] and start ~ U[0, extent - width], so it
    lies inside the row's valid extent.
    """
    b = extent_b.shape[0]
    k_w, k_s = jax.random.split(key)
    u_w = jax.random.uniform(k_w, (b, num))
    u_s = jax.random.uniform(k_s, (b, num))
    width = jnp.floor(u_w * (max_width_b[:, None].astype(jnp.float32) + 1.0))
    width = jnp.minimum(width, extent_b[:, None].astype(jnp.float32))
    start = jnp.floor(u_s * (extent_b[:, None] - width + 1.0))
    pos = jnp.arange(size, dtype=jnp.float32)[None, None, :]
    inside = (pos >= start[..., None]) & (pos < (start + width)[..., None])
    return jnp.any(inside, axis=1)


def spec_augment(
    key: jax.Array,
    feats_btf: jax.Array,
    lengths_b: jax.Array,
    *,
    num_freq_masks: int = 2,
    freq_mask_width: int = 27,
    num_time_masks: int = 10,
    time_mask_max_ratio: float = 0.05,
) -> jax.Array:
    """Zero random frequency bands and time spans of normalized features.

    Args:
      key: PRNG key (fold in step and host before calling).
      feats_btf: (B, T, F) normalized features (0 = mean, so masking to 0 is neutral).
      lengths_b: (B,) int valid frames; time masks stay inside them and each is at
        most `time_mask_max_ratio * length` long (adaptive masking, Park et al. 2020).
    Returns:
      (B, T, F) masked features.
    """
    b, t, f = feats_btf.shape
    k_f, k_t = jax.random.split(key)
    keep = jnp.ones((b, t, f), dtype=bool)
    if num_freq_masks > 0 and freq_mask_width > 0:
        fmask = _band_masks(
            k_f, num_freq_masks, jnp.full((b,), freq_mask_width), jnp.full((b,), f), f
        )
        keep &= ~fmask[:, None, :]
    if num_time_masks > 0 and time_mask_max_ratio > 0:
        max_w = jnp.floor(lengths_b.astype(jnp.float32) * time_mask_max_ratio)
        tmask = _band_masks(k_t, num_time_masks, max_w, lengths_b, t)
        keep &= ~tmask[:, :, None]
    return jnp.where(keep, feats_btf, 0.0)


def warp_positions(alpha_b: jax.Array, num_bins: int, boundary: float = 0.8) -> jax.Array:
    """(B,) warp factors -> (B, F) source bin of each output bin (piecewise linear).

    Output bin f reads the input at f * alpha up to a knee, then a straight line that
    keeps the top bin in place (Jaitly & Hinton's VTLP), so no band leaves the range.
    The knee is at `boundary * (F - 1)`, lowered for alpha > 1 so the source stays
    inside the spectrum.
    """
    top = float(num_bins - 1)
    alpha = alpha_b.astype(jnp.float32)[:, None]
    knee = boundary * top * jnp.minimum(1.0, 1.0 / alpha)
    pos = jnp.arange(num_bins, dtype=jnp.float32)[None, :]
    upper = knee * alpha + (pos - knee) * (top - knee * alpha) / (top - knee)
    return jnp.where(pos <= knee, pos * alpha, upper)


def freq_warp(
    key: jax.Array, feats_btf: jax.Array, max_ratio: float, boundary: float = 0.8
) -> jax.Array:
    """Vocal tract length perturbation on log-mel features, one warp factor per utterance.

    alpha ~ U[1 - max_ratio, 1 + max_ratio]; each output bin is the linear
    interpolation of the input at `warp_positions`. Simulates speakers with other
    formant frequencies, the main thing that tells the demo corpus' voices apart.
    Written as a (B, F, F) interpolation matrix and one batched matmul: no gather,
    and the cost (F^2 per frame) is tiny next to the encoder.

    Args:
      key: PRNG key.
      feats_btf: (B, T, F) log-mel features (before normalization).
      max_ratio: largest relative warp, e.g. 0.1.
    Returns:
      (B, T, F) warped features.
    """
    b, _, f = feats_btf.shape
    alpha = jax.random.uniform(key, (b,), minval=1.0 - max_ratio, maxval=1.0 + max_ratio)
    src = jnp.clip(warp_positions(alpha, f, boundary), 0.0, f - 1.0)  # (B, F_out)
    lo = jnp.clip(jnp.floor(src), 0.0, f - 2.0)
    frac = src - lo
    bins = jnp.arange(f, dtype=jnp.float32)[None, None, :]  # input bins
    interp = (bins == lo[..., None]) * (1.0 - frac[..., None]) + (bins == lo[..., None] + 1.0) * (
        frac[..., None]
    )  # (B, F_out, F_in)
    return jnp.einsum("btf,bgf->btg", feats_btf, interp.astype(feats_btf.dtype))


# --------------------------------------------------------------------------------------
# Host-side waveform augmentation (numpy; Grain workers)
#
# Everything below runs on the host, one utterance at a time, inside Grain worker
# processes, before batching: speed changes the number of samples (so it cannot live in
# the fixed-shape jitted step), and noise/reverb are cheap per utterance with numpy,
# scipy and soxr. No jax here: workers must not touch an accelerator.
# --------------------------------------------------------------------------------------

SPEED_OF_SOUND = 343.0  # m/s in air at ~20 °C.


def speed_perturbed_length(num_samples: int, factor: float) -> int:
    """Exact length of `speed_perturb(audio, factor, ...)` for `len(audio) == num_samples`.

    floor(N / factor + 0.5), i.e. rounding halves up, which is what soxr produces
    (Python's `round` rounds halves to even and would disagree, e.g. N=2, factor=0.8).
    The loader calls this to plan batch shapes before any audio is decoded.
    """
    if factor <= 0:
        raise ValueError(f"speed factor must be > 0, got {factor}")
    return int(math.floor(num_samples / factor + 0.5))


def speed_perturb(audio: np.ndarray, factor: float, sample_rate: int) -> np.ndarray:
    """Kaldi/sox-style `speed` perturbation: tempo and pitch change together.

    Reading the samples as if they had been recorded at `sample_rate * factor` and
    resampling to `sample_rate` makes the signal play `factor` times faster: a tone of f Hz
    becomes f * factor Hz and the duration becomes N / factor.

    Args:
      audio: (N,) float32 waveform.
      factor: speed factor > 0, e.g. 0.9 or 1.1.
      sample_rate: the waveform's sample rate in Hz (unchanged on output).
    Returns:
      (speed_perturbed_length(N, factor),) float32 waveform.
    """
    audio = np.asarray(audio, dtype=np.float32)
    target = speed_perturbed_length(audio.shape[0], factor)
    if factor == 1.0:
        return audio.copy()
    out = soxr.resample(audio, sample_rate * factor, sample_rate).astype(np.float32, copy=False)
    # soxr's length has matched `target` in every case we tried; pad/trim anyway so the
    # loader's planned shape holds even if a future soxr rounds differently.
    if out.shape[0] > target:
        out = out[:target]
    elif out.shape[0] < target:
        out = np.pad(out, (0, target - out.shape[0]))
    return out


def colored_noise(rng: np.random.Generator, num_samples: int, exponent: float) -> np.ndarray:
    """Gaussian noise with power spectral density ∝ 1 / f**exponent, shaped in the FFT domain.

    exponent 0 is white, 1 pink, 2 brown. White Gaussian noise is transformed, each bin's
    amplitude scaled by f**(-exponent / 2) (power is amplitude squared) with the DC bin
    zeroed, and transformed back.

    Args:
      rng: numpy generator (the only source of randomness).
      num_samples: N, output length.
      exponent: spectral slope; the log-log PSD has slope -exponent.
    Returns:
      (N,) float32, zero mean, unit RMS (all zeros for N < 2, where that is impossible).
    """
    if num_samples < 2:
        return np.zeros(num_samples, dtype=np.float32)
    # FFT at a fast size, then crop: lengths like 14545 (prime factors 5, 2909) would
    # otherwise make the transform many times slower. A crop keeps the spectrum's shape.
    n_fft = scipy.fft.next_fast_len(num_samples, real=True)
    spec = scipy.fft.rfft(rng.standard_normal(n_fft, dtype=np.float32))
    freqs = np.arange(spec.shape[0], dtype=np.float32)
    gain = np.zeros_like(freqs)
    gain[1:] = freqs[1:] ** (-0.5 * exponent)
    noise = scipy.fft.irfft(spec * gain, n=n_fft)[:num_samples].astype(np.float64)
    noise -= noise.mean()
    rms = np.sqrt(np.mean(noise**2))
    if rms == 0.0:
        return np.zeros(num_samples, dtype=np.float32)
    return (noise / rms).astype(np.float32)


def mix_at_snr(audio: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """Add `noise` scaled so that 10 * log10(P_audio / P_noise) == snr_db (P = mean square).

    Args:
      audio: (N,) float32 signal.
      noise: (N,) noise, same length (crop or tile it first, see `crop_or_tile`).
      snr_db: target signal-to-noise ratio in dB.
    Returns:
      (N,) float32 mixture; the audio unchanged (a copy) if either input is silent, since
      no scale reaches the target then and dividing by zero would give NaN.
    """
    if audio.shape != noise.shape:
        raise ValueError(f"audio {audio.shape} and noise {noise.shape} must have the same shape")
    # float64 power sums: float32 accumulation over minutes of audio loses digits.
    x = np.asarray(audio, dtype=np.float64)
    n = np.asarray(noise, dtype=np.float64)
    p_signal = np.mean(x**2) if x.size else 0.0
    p_noise = np.mean(n**2) if n.size else 0.0
    if p_signal == 0.0 or p_noise == 0.0:
        return np.array(audio, dtype=np.float32)
    scale = np.sqrt(p_signal / (p_noise * 10.0 ** (snr_db / 10.0)))
    return (x + scale * n).astype(np.float32)


def crop_or_tile(noise: np.ndarray, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """(N,) float32: a random window of a longer `noise`, or `noise` tiled to N samples.

    Tiling starts at a random offset too, so short noises do not always begin the same way.
    """
    noise = np.asarray(noise, dtype=np.float32)
    length = noise.shape[0]
    if length == 0:
        raise ValueError("cannot crop or tile an empty noise signal")
    if length >= num_samples:
        start = int(rng.integers(0, length - num_samples + 1))
        return noise[start : start + num_samples].copy()
    start = int(rng.integers(0, length))
    return noise[(start + np.arange(num_samples)) % length]


def _image_sources(
    room: np.ndarray, source: np.ndarray, max_order: int
) -> tuple[np.ndarray, np.ndarray]:
    """Image-source positions of a shoebox room and their reflection counts.

    Along one axis of length L, image index i sits at i * L + s for even i and
    (i + 1) * L - s for odd i, and reached the microphone after |i| wall reflections
    (Allen & Berkley, 1979). The 3-D images are all index triples.

    Args:
      room: (3,) room dimensions in metres.
      source: (3,) source position inside the room.
      max_order: keep images with at most this many reflections in total.
    Returns:
      (K, 3) image positions, (K,) int reflection counts.
    """
    idx = np.arange(-max_order, max_order + 1)
    ix, iy, iz = np.meshgrid(idx, idx, idx, indexing="ij")
    ijk = np.stack([ix.ravel(), iy.ravel(), iz.ravel()], axis=1)  # (M, 3)
    order = np.abs(ijk).sum(axis=1)
    ijk, order = ijk[order <= max_order], order[order <= max_order]
    even = ijk % 2 == 0
    pos = np.where(even, ijk * room + source, (ijk + 1) * room - source)
    return pos, order


def _sample_positions(
    rng: np.random.Generator, room: np.ndarray, wall_margin: float, min_distance: float
) -> tuple[np.ndarray, np.ndarray]:
    """(3,) source and (3,) microphone, each `wall_margin` from the walls, min_distance apart.

    Rejection sampling; after 100 tries (only possible in rooms barely larger than the
    margins) the last draw is used rather than looping forever.
    """
    margin = np.minimum(wall_margin, room / 4.0)
    for _ in range(100):
        src = rng.uniform(margin, room - margin)
        mic = rng.uniform(margin, room - margin)
        if np.linalg.norm(src - mic) >= min_distance:
            break
    return src, mic


def _fractional_delays(
    delay_k: np.ndarray, amp_k: np.ndarray, length: int, sinc_half_width: int
) -> np.ndarray:
    """(length,) float64 sum of K images of amplitude `amp_k` (K,) at fractional delays
    `delay_k` (K,) samples: every image spreads over 2 * half taps of a Hann-windowed sinc
    (taps outside [0, length) are dropped)."""
    taps = np.arange(-sinc_half_width + 1, sinc_half_width + 1)
    where = np.floor(delay_k)[:, None].astype(np.int64) + taps  # (K, taps)
    offset = where - delay_k[:, None]
    weight = np.sinc(offset) * 0.5 * (1.0 + np.cos(np.pi * offset / sinc_half_width))
    ok = (where >= 0) & (where < length)
    return np.bincount(where[ok], weights=(amp_k[:, None] * weight)[ok], minlength=length)


def _add_late_tail(
    rng: np.random.Generator,
    rir: np.ndarray,
    join: float,
    d0: float,
    volume: float,
    rt60: float,
    sample_rate: int,
) -> None:
    """Add (in place) the late tail of `simulate_rir` to the (L,) `rir` from sample `join` on,
    in the same units (images scaled by 4 pi d0 so that the direct path is 1): Gaussian noise
    of energy per sample c / (4 pi V fs) * 10**(-6 t / RT60), t from emission."""
    length = rir.shape[0]
    start = int(np.ceil(join))
    if start < length:
        t = (np.arange(start, length) / sample_rate) + d0 / SPEED_OF_SOUND
        level = 4.0 * np.pi * d0 * np.sqrt(SPEED_OF_SOUND / (4.0 * np.pi * volume * sample_rate))
        rir[start:] += level * 10.0 ** (-3.0 * t / rt60) * rng.standard_normal(length - start)


def simulate_rir(
    rng: np.random.Generator,
    sample_rate: int,
    *,
    rt60_range: tuple[float, float] = (0.2, 0.8),
    room_range: tuple[tuple[float, float, float], tuple[float, float, float]] = (
        (3.0, 3.0, 2.5),
        (10.0, 8.0, 4.0),
    ),
    max_order: int = 3,
    wall_margin: float = 0.5,
    min_distance: float = 0.5,
    sinc_half_width: int = 8,
) -> np.ndarray:
    """Room impulse response of a random shoebox room, source and microphone.

    Early part: the image-source method up to `max_order` reflections, every wall with the
    reflection coefficient beta = sqrt(1 - alpha) where alpha is the absorption that gives
    the sampled RT60 by Sabine's formula RT60 = 0.161 V / (S alpha). Each image arrives
    after distance / c with amplitude beta**order / distance, placed at its fractional
    delay with a Hann-windowed sinc (rounding to whole samples would put a comb on the
    spectrum).

    Late part: images above `max_order` are missing, so from the earliest arrival of an
    order `max_order + 1` image on, exponentially decaying Gaussian noise replaces them.
    Its envelope is the diffuse-field energy of the image model, c / (4 pi V) per second
    times 10**(-6 t / RT60) in the images' own units, so it continues the early part at
    the same expected level and reaches -60 dB at RT60. Early images arriving after that
    point are dropped: the tail already stands for them.

    We write this in numpy rather than depend on pyroomacoustics: it is a heavy
    dependency for a few dozen lines, and we need a plausible bank of RIRs for
    augmentation, not acoustics research.

    Args:
      rng: numpy generator (room, positions, RT60 and tail noise all come from it).
      sample_rate: Hz.
      rt60_range: RT60 in seconds, uniform.
      room_range: (low, high) room dimensions (x, y, z) in metres, each uniform.
      max_order: largest number of reflections computed exactly.
      wall_margin: minimum distance of source and microphone from any wall, metres.
      min_distance: minimum source–microphone distance, metres.
      sinc_half_width: taps on each side of a fractional delay.
    Returns:
      (round(RT60 * sample_rate),) float32 RIR, direct path at index 0 with value 1. In
      about 1 room in 20, reflections that arrive together sum to a later peak above 1
      (as they would in a real room), so use index 0, not the argmax, to align.
    """
    room = rng.uniform(room_range[0], room_range[1])
    rt60 = float(rng.uniform(rt60_range[0], rt60_range[1]))
    src, mic = _sample_positions(rng, room, wall_margin, min_distance)
    volume = float(np.prod(room))
    surface = 2.0 * float(room[0] * room[1] + room[0] * room[2] + room[1] * room[2])
    # Sabine's alpha exceeds 1 for RT60s a room of this size cannot reach; clip to anechoic.
    alpha = min(0.161 * volume / (surface * rt60), 1.0)
    beta = np.sqrt(1.0 - alpha)
    length = max(int(round(rt60 * sample_rate)), 1)

    pos, order = _image_sources(room, src, max_order + 1)
    dist = np.linalg.norm(pos - mic, axis=1)
    d0 = float(np.linalg.norm(src - mic))
    delay = (dist - d0) / SPEED_OF_SOUND * sample_rate  # samples after the direct path
    join = float(delay[order == max_order + 1].min())  # early part complete up to here
    keep = (order <= max_order) & (delay < min(join, length))
    delay, amp = delay[keep], beta ** order[keep] * (d0 / dist[keep])  # direct path: 1

    rir = _fractional_delays(delay, amp, length, sinc_half_width)
    _add_late_tail(rng, rir, join, d0, volume, rt60, sample_rate)
    # Sinc tails of reflections arriving within a few samples can add to index 0.
    return (rir / rir[0]).astype(np.float32)


def reverberate(audio: np.ndarray, rir: np.ndarray, direct_index: int | None = None) -> np.ndarray:
    """Convolve with a room impulse response, keeping timing and level.

    Output sample n is the full convolution at n + p, where p is the RIR's direct-path
    peak: the speech does not shift in time, so the transcript's alignment and the planned
    length stay valid. The result is scaled back to the input's RMS, so reverberant
    utterances are not louder than dry ones.

    Args:
      audio: (N,) float32 waveform.
      rir: (L,) impulse response.
      direct_index: p, where the direct path is when the caller knows it (0 for
        `simulate_rir`, where coinciding reflections can add up to a taller peak a few
        milliseconds later); None takes the largest |value|, right for measured RIRs.
    Returns:
      (N,) float32 reverberant waveform (a copy of a silent input).
    """
    audio = np.asarray(audio, dtype=np.float32)
    n = audio.shape[0]
    if n == 0:
        return audio.copy()
    rir = np.asarray(rir, dtype=np.float32)
    peak = int(np.argmax(np.abs(rir))) if direct_index is None else direct_index
    # Imported here: scipy.signal takes ~1.6 s to import (scipy.stats with it), which
    # every process that imports the models (training, evaluation, export) would pay.
    import scipy.signal

    wet = scipy.signal.oaconvolve(audio, rir)[peak : peak + n].astype(np.float64)
    rms_in = np.sqrt(np.mean(audio.astype(np.float64) ** 2))
    rms_out = np.sqrt(np.mean(wet**2))
    if rms_in == 0.0 or rms_out == 0.0:
        return audio.copy()
    return (wet * (rms_in / rms_out)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class WaveformAugmentConfig:
    """Host-side waveform augmentation settings; the defaults do nothing."""

    speeds: tuple[float, ...] = (1.0,)  # e.g. (0.9, 1.0, 1.1), chosen uniformly.
    noise_prob: float = 0.0  # chance of adding noise to an utterance.
    snr_db: tuple[float, float] = (5.0, 20.0)  # SNR range in dB, uniform.
    noise_files: tuple[str, ...] = ()  # audio files; empty -> generated colored noise.
    noise_exponents: tuple[float, ...] = (0.0, 1.0, 2.0)  # colored noise 1/f^e, uniform.
    reverb_prob: float = 0.0  # chance of convolving with a simulated RIR.
    num_rirs: int = 64  # size of the simulated RIR bank.
    rt60: tuple[float, float] = (0.2, 0.8)  # RT60 range of the bank in seconds.
    seed: int = 0  # seeds the RIR bank, so every worker and every resume builds the same one.

    def __post_init__(self):
        # Configs often arrive as lists (ml_collections, JSON); store tuples so the
        # dataclass stays hashable and immutable.
        for name in ("speeds", "snr_db", "noise_exponents", "rt60"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "noise_files", tuple(str(p) for p in self.noise_files))
        if not self.speeds or any(s <= 0 for s in self.speeds):
            raise ValueError(f"speeds must be a non-empty tuple of factors > 0, got {self.speeds}")
        for name in ("noise_prob", "reverb_prob"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        if len(self.snr_db) != 2 or self.snr_db[0] > self.snr_db[1]:
            raise ValueError(f"snr_db must be an ordered (low, high) pair, got {self.snr_db}")
        if len(self.rt60) != 2 or not 0.0 < self.rt60[0] <= self.rt60[1]:
            raise ValueError(f"rt60 must be an ordered (low, high) pair > 0, got {self.rt60}")
        if self.reverb_prob > 0 and self.num_rirs < 1:
            raise ValueError(f"num_rirs must be >= 1 when reverb_prob > 0, got {self.num_rirs}")
        if self.noise_prob > 0 and not self.noise_files and not self.noise_exponents:
            raise ValueError("noise_prob > 0 needs noise_files or noise_exponents")

    @property
    def enabled(self) -> bool:
        """Whether any augmentation can change an utterance."""
        return any(s != 1.0 for s in self.speeds) or self.noise_prob > 0 or self.reverb_prob > 0


def _load_noise(path: str, sample_rate: int) -> np.ndarray:
    """(N,) float32 mono noise at `sample_rate` from an audio file (channels averaged)."""
    data, file_rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if file_rate != sample_rate:
        mono = soxr.resample(mono, file_rate, sample_rate)
    if mono.shape[0] == 0:
        raise ValueError(f"noise file {path} contains no samples")
    if not np.isfinite(mono).all():  # one NaN would make every noisy utterance's loss NaN
        raise ValueError(f"noise file {path} has NaN or infinite samples")
    return np.ascontiguousarray(mono, dtype=np.float32)


class WaveformAugmenter:
    """Speed, reverb and noise for one utterance at a time, driven by a config and an rng.

    The RIR bank and the noise files are built on first use, not in __init__, and are
    dropped when pickled: the object travels cheaply to each Grain worker, and each worker
    builds its own (identical, since the bank is seeded by `cfg.seed`) copy.
    """

    def __init__(self, cfg: WaveformAugmentConfig, sample_rate: int):
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
        # Check the files now, in the main process, so a typo fails before workers start.
        for path in cfg.noise_files:
            if not os.path.isfile(path):
                raise ValueError(f"noise file not found: {path}")
        self.cfg = cfg
        self.sample_rate = sample_rate
        self._rirs: list[np.ndarray] | None = None
        self._noises: list[np.ndarray] | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_rirs"] = None
        state["_noises"] = None
        return state

    @property
    def rirs(self) -> list[np.ndarray]:
        """The simulated RIR bank, `cfg.num_rirs` of (L_i,) float32."""
        if self._rirs is None:
            rng = np.random.default_rng(self.cfg.seed)
            self._rirs = [
                simulate_rir(rng, self.sample_rate, rt60_range=self.cfg.rt60)
                for _ in range(self.cfg.num_rirs)
            ]
        return self._rirs

    @property
    def noises(self) -> list[np.ndarray]:
        """The noise files as (N_i,) float32 mono at the augmenter's sample rate."""
        if self._noises is None:
            self._noises = [_load_noise(p, self.sample_rate) for p in self.cfg.noise_files]
        return self._noises

    def choose_speed(self, rng: np.random.Generator) -> float:
        """One of `cfg.speeds`, uniformly; the loader plans the length with it."""
        return float(self.cfg.speeds[int(rng.integers(len(self.cfg.speeds)))])

    def _noise(self, rng: np.random.Generator, num_samples: int) -> np.ndarray:
        if self.cfg.noise_files:
            noise = self.noises[int(rng.integers(len(self.noises)))]
            return crop_or_tile(noise, num_samples, rng)
        exponents = self.cfg.noise_exponents
        return colored_noise(rng, num_samples, exponents[int(rng.integers(len(exponents)))])

    def __call__(
        self, audio: np.ndarray, rng: np.random.Generator, speed: float = 1.0
    ) -> np.ndarray:
        """Augment one utterance.

        Args:
          audio: (N,) float32 waveform at `sample_rate`.
          rng: numpy generator; the same state gives the same output.
          speed: factor chosen earlier by the loader (see `choose_speed`).
        Returns:
          (speed_perturbed_length(N, speed),) float32 waveform.
        """
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D (N,), got shape {audio.shape}")
        out = speed_perturb(audio, speed, self.sample_rate)
        # Room first, then noise: a microphone records the reverberant speech plus noise
        # arriving at it, so the noise is not itself smeared by this speaker's room.
        if self.cfg.reverb_prob > 0 and rng.random() < self.cfg.reverb_prob:
            rir = self.rirs[int(rng.integers(len(self.rirs)))]
            out = reverberate(out, rir, direct_index=0)  # simulate_rir puts it at 0
        if self.cfg.noise_prob > 0 and rng.random() < self.cfg.noise_prob:
            snr = float(rng.uniform(*self.cfg.snr_db))
            out = mix_at_snr(out, self._noise(rng, out.shape[0]), snr)
        return out
