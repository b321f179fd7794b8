"""Token <-> frame maps of a duration-based synthesizer (FastSpeech's length regulator).

A token n of duration d_n covers frames [e_n - d_n, e_n), e_n = d_1 + ... + d_n. Both maps
find each frame's token by counting the cumulative durations at or below t, for static
shapes and no loop over the data, so they run under jit with traced durations.
Shapes: B batch, N tokens, T frames, D channels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def frame_tokens(durations_bn: jax.Array, num_frames: int) -> tuple[jax.Array, jax.Array]:
    """(B, N) int durations -> (B, T) index of the token each frame belongs to (N for frames
    past the last token's end) and (B,) int32 total durations.

    Frame t belongs to the token n with e_{n-1} <= t < e_n: the number of tokens that end
    at or before t, so zero-duration tokens (padding, silent tokens) own no frame.
    """
    ends_bn = jnp.cumsum(durations_bn.astype(jnp.int32), axis=1)
    frames_t = jnp.arange(num_frames, dtype=jnp.int32)
    # A count of comparisons, not jnp.searchsorted: its binary search loops log2(N) times,
    # which a symbolic N (the exported model's phoneme length, `tts.artifact`)
    # cannot give; (T, N) comparisons per row are small next to the decoder.
    index_bt = jnp.sum(ends_bn[:, None, :] <= frames_t[None, :, None], axis=-1)
    return index_bt.astype(jnp.int32), ends_bn[:, -1]


def regulate(
    h_bnd: jax.Array, durations_bn: jax.Array, max_frames: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Repeat each token's vector `durations[b, n]` times along time.

    Args:
      h_bnd: (B, N, D) token vectors.
      durations_bn: (B, N) ints >= 0 (padding tokens 0).
      max_frames: static output length T.
    Returns:
      frames_btd: (B, T, D), zero past each sequence's total duration.
      frame_mask_bt: (B, T) bool, True on the frames < total duration.
      overflow_b: (B,) bool, True where the total exceeds `max_frames`; such a sequence is
        cut after its first max_frames frames (its last tokens lose frames or vanish).
    """
    if durations_bn.shape[1] == 0:
        raise ValueError("regulate needs at least one token per sequence (N >= 1)")
    n = h_bnd.shape[1]
    index_bt, total_b = frame_tokens(durations_bn, max_frames)
    mask_bt = index_bt < n
    gathered = jnp.take_along_axis(h_bnd, jnp.minimum(index_bt, n - 1)[..., None], axis=1)
    frames_btd = jnp.where(mask_bt[..., None], gathered, jnp.zeros((), h_bnd.dtype))
    return frames_btd, mask_bt, total_b > max_frames


def token_average(
    values_bt: jax.Array, durations_bn: jax.Array, weights_bt: jax.Array | None = None
) -> jax.Array:
    """(B, T) frame-level values -> (B, N) float32 per-token means over each token's frames
    (0 for a token with no frame), the token-level pitch / energy targets of FastPitch and
    ESPnet's FastSpeech2.

    weights_bt: (B, T) bool or float, optional; only weighted frames count (e.g. the voiced
    frames for pitch: FastPitch and ESPnet average F0 over voiced frames only), and a token
    whose frames all weigh 0 averages to 0. Frames past T (an overflowing total) are absent.
    """
    b, t = values_bt.shape
    n = durations_bn.shape[1]
    index_bt, _ = frame_tokens(durations_bn, t)
    weights = jnp.ones((b, t), jnp.float32) if weights_bt is None else weights_bt
    weights = weights.astype(jnp.float32)
    # Frames past the last token land in an extra segment N, which is dropped.
    segment_sum = jax.vmap(lambda x, i: jax.ops.segment_sum(x, i, num_segments=n + 1))
    sums = segment_sum(values_bt.astype(jnp.float32) * weights, index_bt)[:, :n]
    counts = segment_sum(weights, index_bt)[:, :n]
    return jnp.where(counts > 0, sums / jnp.where(counts > 0, counts, 1.0), 0.0)
