"""Conformer building blocks (Gulati et al., 2020) in Flax NNX.

Every parameter carries logical axis names (see `jaxspeech.parallel.rules`);
no layer names a mesh axis. Shapes: B batch, T frames, D model dim, H heads,
K head dim, M feed-forward dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.parallel.rules import constrain

Dtype = jnp.dtype


def logical_init(init: Callable, axes: Sequence[str | None]) -> Callable:
    """Wrap an initializer so the parameter carries logical axis names (sharded later)."""
    return nnx.with_partitioning(init, tuple(axes), eager_sharding=False)


def dense_init(fan_in_axes: int = 1) -> Callable:
    """Lecun-normal-like init for einsum kernels whose first `fan_in_axes` dims are inputs."""
    return nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=tuple(range(fan_in_axes)), out_axis=-1
    )


class Dense(nnx.Module):
    """y = x @ W + b with logical axes for W of shape (in, out)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        axes: tuple[str | None, str | None],
        *,
        use_bias: bool = True,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.kernel = nnx.Param(
            logical_init(dense_init(), axes)(rngs.params(), (in_features, out_features))
        )
        self.bias = (
            nnx.Param(
                logical_init(nnx.initializers.zeros, axes[1:])(rngs.params(), (out_features,))
            )
            if use_bias
            else None
        )
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis; statistics in float32 whatever the compute dtype."""

    def __init__(self, dim: int, *, dtype: Dtype = jnp.float32, eps: float = 1e-5, rngs: nnx.Rngs):
        self.scale = nnx.Param(
            logical_init(nnx.initializers.ones, ("embed",))(rngs.params(), (dim,))
        )
        self.bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (dim,))
        )
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)


class FeedForward(nnx.Module):
    """LN -> D x M -> swish -> dropout -> M x D -> dropout (the macaron half-step FFN)."""

    def __init__(self, dim: int, hidden: int, dropout: float, *, dtype: Dtype, rngs: nnx.Rngs):
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.up = Dense(dim, hidden, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.down = Dense(hidden, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)

    def __call__(
        self, x_btd: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        h = jax.nn.silu(self.up(self.norm(x_btd)))
        h = constrain(h, ("batch", "time", "mlp"))
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return self.dropout(self.down(h), deterministic=deterministic, rngs=rngs)


def relative_sinusoids(length: int, dim: int) -> jax.Array:
    """(2T - 1, D) sinusoidal embeddings of relative distances T-1, T-2, ..., -(T-1)."""
    pos = jnp.arange(length - 1, -length, -1, dtype=jnp.float32)[:, None]
    inv = jnp.exp(jnp.arange(0, dim, 2, dtype=jnp.float32) * (-math.log(10000.0) / dim))
    ang = pos * inv[None, :]
    return jnp.stack([jnp.sin(ang), jnp.cos(ang)], axis=-1).reshape(2 * length - 1, dim)


def rel_shift(scores_bhtr: jax.Array) -> jax.Array:
    """(B, H, T, 2T-1) scores over relative distances -> (B, H, T, T) over key positions.

    out[..., i, j] = in[..., i, T - 1 - i + j], i.e. the score of distance i - j,
    done with a pad and two reshapes (Transformer-XL) instead of a gather.
    """
    b, h, t, r = scores_bhtr.shape
    padded = jnp.pad(scores_bhtr, ((0, 0), (0, 0), (0, 0), (1, 0)))  # (B, H, T, 2T)
    shifted = padded.reshape(b, h, r + 1, t)[:, :, 1:].reshape(b, h, t, r)
    return shifted[..., :t]


class RelPositionAttention(nnx.Module):
    """Multi-head self-attention with relative positional encoding (Transformer-XL style).

    score(i, j) = (q_i + u) . k_j + (q_i + v) . W_p p(i - j), as in ESPnet's and
    NeMo's Conformer `rel_pos` attention.
    """

    def __init__(self, dim: int, num_heads: int, dropout: float, *, dtype: Dtype, rngs: nnx.Rngs):
        if dim % num_heads:
            raise ValueError(f"model dim {dim} is not divisible by num_heads {num_heads}")
        k = dim // num_heads
        init = logical_init(dense_init(), ("embed", "heads", "kv"))
        self.wq = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wk = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wv = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wpos = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wo = nnx.Param(
            logical_init(dense_init(2), ("heads", "kv", "embed"))(
                rngs.params(), (num_heads, k, dim)
            )
        )
        bias = logical_init(nnx.initializers.zeros, ("heads", "kv"))
        self.pos_bias_u = nnx.Param(bias(rngs.params(), (num_heads, k)))
        self.pos_bias_v = nnx.Param(bias(rngs.params(), (num_heads, k)))
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)
        self.dtype = dtype
        self.dim = dim

    def __call__(
        self, x_btd: jax.Array, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        dt = self.dtype
        t = x_btd.shape[1]
        x = self.norm(x_btd)
        q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(dt))
        q, k, v = (constrain(a, ("batch", "time", "heads", "kv")) for a in (q, k, v))
        p = jnp.einsum(
            "rd,dhk->rhk", relative_sinusoids(t, self.dim).astype(dt), self.wpos[...].astype(dt)
        )
        scale = 1.0 / math.sqrt(q.shape[-1])
        ac = jnp.einsum("bthk,bshk->bhts", q + self.pos_bias_u[...].astype(dt), k)
        bd = rel_shift(jnp.einsum("bthk,rhk->bhtr", q + self.pos_bias_v[...].astype(dt), p))
        scores = (ac.astype(jnp.float32) + bd.astype(jnp.float32)) * scale
        scores = jnp.where(mask_bt[:, None, None, :], scores, -1e9)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        ctx = jnp.einsum("bhts,bshk->bthk", probs, v)
        out = jnp.einsum("bthk,hkd->btd", ctx, self.wo[...].astype(dt))
        return self.dropout(out, deterministic=deterministic, rngs=rngs)


def depthwise_conv1d(
    x_btc: jax.Array, w_kc: jax.Array, b_c: jax.Array, *, block: int = 32
) -> jax.Array:
    """'Same' depthwise 1-D convolution, (B, T, C) x (K, C) -> (B, T, C), as blocked band matmuls.

    Time is cut into blocks of L frames; block n's output needs its L input frames
    plus the next K - 1 (the halo), so each block is one small matmul with a
    banded (L, L + K - 1, C) matrix built from the kernel. Why not `lax.conv`: its
    grouped-convolution forward + backward on XLA:CPU is 7-9x slower (benchmarks/depthwise_conv.py).
    Why not a sum of K shifted slices: as fast in isolation at the demo's sizes, but
    3x slower for long inputs and wide kernels (T = 750, K = 31), and inside the
    demo's scanned Conformer step this form cut the forward pass from 312 to 212 ms.
    The extra FLOPs ((L + K - 1) / K times the direct convolution's) are negligible
    next to the feed-forward matmuls, and the cost stays linear in T.
    """
    b, t, c = x_btc.shape
    ksize = w_kc.shape[0]
    pad = (ksize - 1) // 2
    # L >= K - 1 so one following block always holds the whole halo.
    length = max(min(block, t), ksize - 1)
    n = -(-t // length)
    xp = jnp.pad(x_btc, ((0, 0), (pad, (n + 1) * length - t - pad), (0, 0)))
    blocks = xp.reshape(b, n + 1, length, c)
    windows = jnp.concatenate([blocks[:, :n], blocks[:, 1:, : ksize - 1]], axis=2)
    # band[i, s, c] = w[s - i, c] where 0 <= s - i < K: output frame i of a block reads
    # window frames i .. i + K - 1.
    offset = jnp.arange(length + ksize - 1)[None, :] - jnp.arange(length)[:, None]
    inside = (offset >= 0) & (offset < ksize)
    band = jnp.where(inside[..., None], w_kc[jnp.clip(offset, 0, ksize - 1)], 0.0)
    out = jnp.einsum("bnsc,isc->bnic", windows, band.astype(x_btc.dtype))
    return out.reshape(b, n * length, c)[:, :t] + b_c


class ConvModule(nnx.Module):
    """LN -> pointwise D x 2D -> GLU -> depthwise conv -> LN -> swish -> pointwise -> dropout.

    LayerNorm replaces the paper's BatchNorm: no running statistics, no
    cross-device reductions, and padding cannot leak into the statistics.
    """

    def __init__(self, dim: int, kernel_size: int, dropout: float, *, dtype: Dtype, rngs: nnx.Rngs):
        if kernel_size % 2 == 0:
            raise ValueError(f"conv kernel size must be odd, got {kernel_size}")
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.pw1 = Dense(dim, 2 * dim, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.dw_kernel = nnx.Param(
            logical_init(dense_init(), ("conv", "embed"))(rngs.params(), (kernel_size, dim))
        )
        self.dw_bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (dim,))
        )
        self.dw_norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.pw2 = Dense(dim, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)
        self.dtype = dtype

    def __call__(
        self, x_btd: jax.Array, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        h = self.pw1(self.norm(x_btd))
        h = jax.nn.glu(h, axis=-1)
        # Zero the padding so the convolution cannot carry it into valid frames.
        h = jnp.where(mask_bt[..., None], h, 0.0)
        h = depthwise_conv1d(
            h, self.dw_kernel[...].astype(self.dtype), self.dw_bias[...].astype(self.dtype)
        )
        h = jax.nn.silu(self.dw_norm(h))
        return self.dropout(self.pw2(h), deterministic=deterministic, rngs=rngs)
