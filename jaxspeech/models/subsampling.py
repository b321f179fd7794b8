"""Convolutional time subsampling: x4 (two 3x3 stride-2 convolutions, as in ESPnet/NeMo) or
x8 (a third one, as in ESPnet's Conv2dSubsampling8).

Each convolution is written as patch extraction (9 strided slices) plus one
matmul: identical values to `lax.conv`, and on XLA:CPU the backward pass is
several times faster than a stock 2-D convolution's (DESIGN.md, speed facts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.audio.features import floor_div
from jaxspeech.models.layers import Dense, Dtype, dense_init, logical_init

SUBSAMPLING_FACTORS = (4, 8)


def conv_out_length(length: jax.Array | int, kernel: int = 3, stride: int = 2) -> jax.Array | int:
    """Output length of a VALID convolution."""
    return floor_div(length - kernel, stride) + 1


def subsampled_length(length: jax.Array | int, factor: int) -> jax.Array | int:
    """Frames out of `factor` = 4 or 8 subsampling (2 or 3 VALID 3x3 stride-2 convolutions);
    <= 0 when the input is shorter than the receptive field."""
    for _ in range(_num_convs(factor)):
        length = conv_out_length(length)
    return length


def receptive_field(factor: int) -> int:
    """Input frames behind one output frame: 7 (x4) or 15 (x8). Output frame t reads input
    frames factor * t .. factor * t + receptive_field - 1."""
    return 1 + sum(2 * 2**i for i in range(_num_convs(factor)))


def _num_convs(factor: int) -> int:
    if factor not in SUBSAMPLING_FACTORS:
        raise ValueError(f"subsampling factor must be one of {SUBSAMPLING_FACTORS}, got {factor!r}")
    return {4: 2, 8: 3}[factor]


def patches_3x3_s2(x_btfc: jax.Array) -> jax.Array:
    """(B, T, F, C) -> (B, T', F', 9C) patches of a VALID 3x3 stride-2 convolution."""
    b, t, f, c = x_btfc.shape
    t2, f2 = conv_out_length(t), conv_out_length(f)
    # lax.slice, not x[:, i:stop:2]: with a symbolic T, jnp indexing lowers a strided
    # slice to a gather.
    cols = [
        jax.lax.slice(
            x_btfc, (0, i, j, 0), (b, i + 2 * (t2 - 1) + 1, j + 2 * (f2 - 1) + 1, c), (1, 2, 2, 1)
        )
        for i in range(3)
        for j in range(3)
    ]
    return jnp.concatenate(cols, axis=-1)


class Conv2dSubsampling(nnx.Module):
    """(B, T, F) features -> (B, ~T/factor, D) with ReLU after each convolution.

    Parameters w1, b1, w2, b2 (+ w3, b3 for x8), out: the x4 tree is unchanged from the
    original x4-only module, so its checkpoints load.
    """

    def __init__(
        self,
        num_features: int,
        channels: int,
        dim: int,
        *,
        factor: int = 4,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        n = _num_convs(factor)
        init = logical_init(dense_init(), ("conv", "channels"))
        bias = logical_init(nnx.initializers.zeros, ("channels",))
        self.w1 = nnx.Param(init(rngs.params(), (9, channels)))
        self.b1 = nnx.Param(bias(rngs.params(), (channels,)))
        self.w2 = nnx.Param(init(rngs.params(), (9 * channels, channels)))
        self.b2 = nnx.Param(bias(rngs.params(), (channels,)))
        if n == 3:
            self.w3 = nnx.Param(init(rngs.params(), (9 * channels, channels)))
            self.b3 = nnx.Param(bias(rngs.params(), (channels,)))
        f_out = subsampled_length(num_features, factor)
        if f_out < 1:
            raise ValueError(f"{num_features} features are too few for x{factor} subsampling")
        self.out = Dense(channels * f_out, dim, ("channels", "embed"), dtype=dtype, rngs=rngs)
        self.factor = factor
        self.receptive_field = receptive_field(factor)
        self.dtype = dtype

    def __call__(self, x_btf: jax.Array, lengths_b: jax.Array) -> tuple[jax.Array, jax.Array]:
        dt = self.dtype
        h = x_btf[..., None].astype(dt)
        layers = [(self.w1, self.b1), (self.w2, self.b2)]
        if self.factor == 8:
            layers.append((self.w3, self.b3))
        for w, b in layers:
            h = jax.nn.relu(patches_3x3_s2(h) @ w[...].astype(dt) + b[...].astype(dt))
        b, t, f, c = h.shape
        out = self.out(h.reshape(b, t, f * c))
        return out, subsampled_length(lengths_b, self.factor)


class Conv2dSubsampling4(Conv2dSubsampling):
    """x4 subsampling (kept for existing imports)."""

    def __init__(self, num_features: int, channels: int, dim: int, *, dtype: Dtype, rngs: nnx.Rngs):
        super().__init__(num_features, channels, dim, factor=4, dtype=dtype, rngs=rngs)
