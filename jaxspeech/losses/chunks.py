"""Frame-chunked evaluation of per-frame functions (the transducer losses' joiners)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def map_frame_chunks(
    fn: Callable[..., tuple[jax.Array, ...]],
    inputs_bt: tuple[jax.Array, ...],
    frames_per_chunk: int,
) -> tuple[jax.Array, ...]:
    """fn applied to Tc = min(frames_per_chunk, T) frames of every input at a time.

    fn maps (B, Tc, ...) slices of the (B, T, ...) inputs to a tuple of (B, Tc, ...)
    outputs, frame by frame (frame t's outputs depend on frame t's inputs only); the
    result is the (B, T, ...) outputs. Each chunk is rematerialized in the backward pass
    (`jax.checkpoint`), so only one chunk's intermediates exist at a time. Chunks are
    sliced out of the inputs in place: stacking them (N, B, Tc, ...) would copy every
    input, and again its gradient. The last chunk ends at frame T, overlapping its
    predecessor when Tc does not divide T (no input padding, another copy); the overlap's
    repeated outputs are dropped, so they get no gradient.
    """
    t = inputs_bt[0].shape[1]
    tc = max(1, min(frames_per_chunk, t))
    n = -(-t // tc)

    @jax.checkpoint
    def one_chunk(start: jax.Array) -> tuple[jax.Array, ...]:
        return fn(*(jax.lax.dynamic_slice_in_dim(x, start, tc, axis=1) for x in inputs_bt))

    starts = jnp.minimum(jnp.arange(n, dtype=jnp.int32) * tc, t - tc)
    outputs = jax.lax.map(one_chunk, starts)  # each (N, B, Tc, ...)

    def unchunk(y: jax.Array) -> jax.Array:
        y = y.swapaxes(0, 1)  # (B, N, Tc, ...)
        whole = y[:, :-1].reshape(y.shape[0], (n - 1) * tc, *y.shape[3:])
        # The last chunk starts at T - Tc; its first n*Tc - T frames are repeats.
        return jnp.concatenate([whole, y[:, -1, n * tc - t :]], axis=1)

    return tuple(unchunk(y) for y in outputs)
