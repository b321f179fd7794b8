"""SpecAugment on device (Park et al., 2019): frequency and time masks, per utterance.

Masks are built with iota comparisons (no scatter), so they are cheap inside the
jitted step and shard along the batch like everything else.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
