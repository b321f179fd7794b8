"""Attention primitives shared by the Conformer's attention modules: the choice of kernel,
rotary position embeddings, and the fused (cuDNN flash) attention call.

Shapes: B batch, Tq queries, Tk keys, H heads, K head dim.

Why a choice of kernel: XLA's attention materializes the (B, H, Tq, Tk) scores and
probabilities in memory and runs several kernels a layer each way; cuDNN's fused
attention (`jax.nn.dot_product_attention(implementation="cudnn")`) keeps them on chip
(measured on one H200 at (64, 400, 8, 64): 0.76 ms fwd+bwd without a bias against 1.61 ms
for XLA; 1.3-1.6 ms with a (B, H, T, T) bias). cuDNN's flash attention takes only 16-bit
inputs and head dims that are multiples of 8 up to 128, and has no dropout on the
attention probabilities, so "auto" picks it only where it applies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspeech.parallel.rules import trace_platform

ATTENTION_IMPLS = ("auto", "cudnn", "xla")
POSITION_ENCODINGS = ("rel", "rope")
ROPE_BASE = 10000.0  # RoFormer's (Su et al., 2021), as NeMo's and LLaMA's


def cudnn_supports(dtype: jnp.dtype, head_dim: int) -> str | None:
    """Why cuDNN's fused attention cannot run this attention, or None if it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN fused attention needs bfloat16 or float16 compute, not {jnp.dtype(dtype)}"
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN fused attention needs a head dim, a multiple of 8 up to 128, not {head_dim}"
    return None


def resolve_attention(impl: str, dtype: jnp.dtype, head_dim: int) -> str:
    """ "auto" | "cudnn" | "xla" -> the kernel that runs: "cudnn" or "xla".

    "auto" is cuDNN when the traced mesh's devices (else jax's default backend) are GPUs
    and cuDNN supports the shape and dtype, XLA otherwise (CPU, TPU, float32 compute,
    head dims cuDNN lacks). An explicit "cudnn" it cannot run is a ValueError (validation
    reports it before any work).
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, got {impl!r}")
    if impl == "xla":
        return "xla"
    why_not = cudnn_supports(dtype, head_dim)
    if impl == "cudnn":
        if why_not:
            raise ValueError(f"attention='cudnn': {why_not}")
        return "cudnn"
    return "cudnn" if why_not is None and trace_platform() in ("gpu", "cuda") else "xla"


def rotate(x_bthk: jax.Array, positions_t: jax.Array, base: float = ROPE_BASE) -> jax.Array:
    """Rotary position embedding: (B, T, H, K) -> (B, T, H, K), K even.

    Feature pairs (i, i + K/2) turn by the angle position * base^(-2i/K) (the half-split
    layout of GPT-NeoX), so q_i . k_j depends on the positions only through i - j: the
    scores need no (B, H, T, T) relative-position bias, which is what lets a fused kernel
    run them. Computed in float32, returned in x's dtype.
    """
    k = x_bthk.shape[-1]
    half = k // 2
    inv = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / k)  # (K/2,)
    ang = positions_t.astype(jnp.float32)[:, None] * inv[None, :]  # (T, K/2)
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x = x_bthk.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_bthk.dtype)


def _pad_time(x: jax.Array, axis: int, to: int) -> jax.Array:
    """x zero-padded along `axis` to length `to`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, pad)


def fused_attention(
    q_bqhk: jax.Array,
    k_bshk: jax.Array,
    v_bshk: jax.Array,
    mask: jax.Array,
    *,
    scale: float,
    bias_bhqs: jax.Array | None = None,
    implementation: str = "cudnn",
) -> jax.Array:
    """cuDNN flash attention: softmax(scale * q.k + bias) v -> (B, Tq, H, K).

    mask: (B, Tk) valid keys that form a prefix (a length mask: passed as sequence
    lengths, so no bias is built), or (B, Tq, Tk) query x key (e.g. chunked attention;
    cuDNN folds it into a bias). A row with no valid key attends its first key instead of
    returning NaN (XLA's masked softmax gives such rows uniform weights; both are padding).
    Odd lengths are padded by one frame (a masked key, a dropped query): jax's training
    rule refuses odd sequence lengths for cuDNN (it sees a bias in the placeholder it
    passes when there is none), and 16 s of audio at x4 subsampling is 399 frames.
    `implementation="xla"` runs the same wrapping on XLA's attention (what tests check on
    a CPU).
    """
    tq, tk = q_bqhk.shape[1], k_bshk.shape[1]
    eq, ek = tq + tq % 2, tk + tk % 2
    q, k, v = _pad_time(q_bqhk, 1, eq), _pad_time(k_bshk, 1, ek), _pad_time(v_bshk, 1, ek)
    bias = None
    if bias_bhqs is not None:
        bias = _pad_time(_pad_time(bias_bhqs, 2, eq), 3, ek)
    if mask.ndim == 2:
        lengths = jnp.maximum(jnp.sum(mask, axis=-1, dtype=jnp.int32), 1)
        out = jax.nn.dot_product_attention(
            q,
            k,
            v,
            bias=bias,
            scale=scale,
            key_value_seq_lengths=lengths,
            implementation=implementation,
        )
        return out[:, :tq]
    mask = _pad_time(_pad_time(mask, 1, eq), 2, ek)
    first = jax.lax.broadcasted_iota(jnp.int32, mask.shape, 2) == 0
    mask = mask | (first & ~jnp.any(mask, axis=-1, keepdims=True))
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask[:, None], scale=scale, implementation=implementation
    )
    return out[:, :tq]
