"""HiFi-GAN's discriminators (Kong et al., 2020): multi-period and multi-scale, Flax NNX.

Multi-period (MPD): for each period p (2, 3, 5, 7, 11) the waveform, reflect-padded to a
multiple of p, is viewed as (S / p, p) and judged by (K, 1) 2-D convolutions, which see
samples p apart. Multi-scale (MSD): 1-D grouped convolutions over the waveform and over
its 2x and 4x average-pooled versions.

Every sub-discriminator returns its layers' feature maps, the last being the score map
(as the paper's feature-matching loss uses every layer, the score's too), each with the
bool mask of its valid positions, for the masked losses of `jaxspeech.vocoder.losses`.
Each convolution zeroes its invalid input positions first (`hifigan.MaskedConv`), so a
row's valid features equal those of the row alone, unpadded.

Omitted from the paper: weight normalization (every layer but the first scale's) and
spectral normalization (the first scale's). Both reparametrize the kernels to steady the
adversarial game; without them the discriminator is the same family of functions, and a
trainer can add a gradient penalty or a lower learning rate if it proves unstable.

Shapes: B batch, S samples, L positions of a layer, P period, C channels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.layers import Dtype
from jaxspeech.vocoder.hifigan import LRELU_SLOPE, MaskedConv

PERIODS = (2, 3, 5, 7, 11)
# The paper's channel widths; (kernel, stride, groups) per layer of a scale discriminator.
PERIOD_CHANNELS = (32, 128, 512, 1024, 1024)
SCALE_CHANNELS = (128, 128, 256, 512, 1024, 1024, 1024)
SCALE_LAYERS = (
    (15, 1, 1),
    (41, 2, 4),
    (41, 2, 16),
    (41, 4, 16),
    (41, 4, 16),
    (41, 1, 16),
    (5, 1, 1),
)
# A small discriminator for CPU runs (~0.33 M parameters; the paper's, the defaults: 70.7 M).
DEMO_DISCRIMINATOR = dict(
    period_channels=(8, 16, 32, 64, 64), scale_channels=(16, 16, 32, 64, 64, 64, 64)
)


class Features(NamedTuple):
    """One sub-discriminator's output: feature maps (B, L, [P,] C) float32, the last the
    (B, L, [P,] 1) score map, and their bool masks (B, L, [1,] 1) of valid positions."""

    maps: list[jax.Array]
    masks: list[jax.Array]


def prefix_mask(length_b: jax.Array, size: int, ndim: int) -> jax.Array:
    """(B,) valid lengths -> (B, size, 1, ...) bool mask with `ndim` dimensions."""
    mask = jax.lax.broadcasted_iota(jnp.int32, (1, size), 1) < length_b[:, None]
    return mask.reshape(mask.shape + (1,) * (ndim - 2))


def strided_length(length_b: jax.Array, stride: int) -> jax.Array:
    """Valid positions after a 'same' convolution of `stride`: ceil(L / stride)."""
    return -(-length_b // stride)


def period_view(
    audio_bs: jax.Array, length_b: jax.Array, period: int
) -> tuple[jax.Array, jax.Array]:
    """(B, S) waveforms, (B,) valid lengths -> (B, ceil(S / P), P) and (B,) valid rows.

    Each row is reflect-padded from its own end up to a multiple of P (the paper pads the
    unpadded waveform so), the rest zeroed: row b holds its samples 0 .. L_b - 1, then
    samples L_b - 2, L_b - 3, ... until ceil(L_b / P) * P, then zeros. Needs L_b >= P.
    """
    b, s = audio_bs.shape
    rows = -(-s // period)  # static: room for the longest valid length, S
    n = rows * period
    i = jax.lax.broadcasted_iota(jnp.int32, (1, n), 1)
    length = length_b[:, None].astype(jnp.int32)
    source = jnp.where(i < length, i, 2 * (length - 1) - i)
    rows_b = strided_length(length_b.astype(jnp.int32), period)
    inside = (i < rows_b[:, None] * period) & (source >= 0)
    padded = jnp.pad(audio_bs, ((0, 0), (0, n - s)))
    x = jnp.where(inside, jnp.take_along_axis(padded, jnp.clip(source, 0, n - 1), axis=1), 0.0)
    return x.reshape(b, rows, period), rows_b


def _stack(
    convs: Sequence[MaskedConv], post: MaskedConv, x: jax.Array, length_b: jax.Array
) -> Features:
    """Conv -> leaky ReLU for each of `convs`, then `post`; every output kept, masked."""
    maps, masks = [], []
    for conv in list(convs) + [post]:
        x = conv(x, prefix_mask(length_b, x.shape[1], x.ndim))
        length_b = strided_length(length_b, conv.stride)
        mask = prefix_mask(length_b, x.shape[1], x.ndim)
        if conv is not post:
            x = jax.nn.leaky_relu(x, LRELU_SLOPE)
        maps.append(x.astype(jnp.float32))
        masks.append(mask)
    return Features(maps, masks)


class PeriodDiscriminator(nnx.Module):
    """(B, S) waveform, (B,) lengths -> `Features` of the (B, S / P, P) view: (5, 1)
    convolutions, stride (3, 1) but the last, then a (3, 1) score convolution."""

    def __init__(self, period: int, channels: Sequence[int], *, dtype: Dtype, rngs: nnx.Rngs):
        ins = (1,) + tuple(channels[:-1])
        strides = (3,) * (len(channels) - 1) + (1,)
        self.convs = nnx.List(
            MaskedConv(i, o, 5, stride=st, spatial=2, dtype=dtype, rngs=rngs)
            for i, o, st in zip(ins, channels, strides)
        )
        self.post = MaskedConv(channels[-1], 1, 3, spatial=2, dtype=dtype, rngs=rngs)
        self.period = period

    def __call__(self, audio_bs: jax.Array, length_b: jax.Array) -> Features:
        x, rows_b = period_view(audio_bs, length_b, self.period)
        return _stack(self.convs, self.post, x[..., None], rows_b)


class ScaleDiscriminator(nnx.Module):
    """(B, S) waveform, (B,) lengths -> `Features`: grouped 1-D convolutions (`layers` of
    (kernel, stride, groups); groups shrink to divide narrow channel widths), then a
    3-tap score convolution."""

    def __init__(
        self,
        channels: Sequence[int],
        layers: Sequence[tuple[int, int, int]] = SCALE_LAYERS,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if len(channels) != len(layers):
            raise ValueError(f"{len(channels)} scale channels for {len(layers)} layers")
        ins = (1,) + tuple(channels[:-1])
        self.convs = nnx.List(
            MaskedConv(i, o, k, stride=st, groups=math.gcd(g, i, o), dtype=dtype, rngs=rngs)
            for i, o, (k, st, g) in zip(ins, channels, layers)
        )
        self.post = MaskedConv(channels[-1], 1, 3, dtype=dtype, rngs=rngs)

    def __call__(self, audio_bs: jax.Array, length_b: jax.Array) -> Features:
        return _stack(self.convs, self.post, audio_bs[..., None], length_b)


def average_pool(audio_bs: jax.Array, length_b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The paper's AvgPool1d(4, stride 2, padding 2) of the valid samples (zeros counted,
    as PyTorch's count_include_pad): (B, S) -> (B, S // 2 + 1), lengths L // 2 + 1."""
    x = jnp.where(prefix_mask(length_b, audio_bs.shape[1], 2), audio_bs, 0.0)
    summed = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 4), (1, 2), ((0, 0), (2, 2)))
    return summed / 4.0, length_b // 2 + 1


class HiFiGANDiscriminator(nnx.Module):
    """Multi-period + multi-scale discriminators: (B, S) waveform, (B,) valid lengths ->
    one `Features` per sub-discriminator (len(periods) + scales of them)."""

    def __init__(
        self,
        *,
        periods: Sequence[int] = PERIODS,
        period_channels: Sequence[int] = PERIOD_CHANNELS,
        scales: int = 3,
        scale_channels: Sequence[int] = SCALE_CHANNELS,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.periods = nnx.List(
            PeriodDiscriminator(p, period_channels, dtype=dtype, rngs=rngs) for p in periods
        )
        self.scales = nnx.List(
            ScaleDiscriminator(scale_channels, dtype=dtype, rngs=rngs) for _ in range(scales)
        )

    def __call__(self, audio_bs: jax.Array, length_b: jax.Array) -> list[Features]:
        out = [d(audio_bs, length_b) for d in self.periods]
        for i, d in enumerate(self.scales):
            if i:
                audio_bs, length_b = average_pool(audio_bs, length_b)
            out.append(d(audio_bs, length_b))
        return out
