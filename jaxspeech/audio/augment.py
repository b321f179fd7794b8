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
