"""CTC loss with infeasible targets and non-finite values masked out and counted.

optax.ctc_loss returns a large *finite* value for targets that cannot be
aligned to the frames (labels plus the blanks forced between repeats exceed the
frames), so feasibility is checked explicitly here rather than by isinf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def required_frames(labels_bu: jax.Array, label_len_b: jax.Array) -> jax.Array:
    """(B,) minimum frames a CTC alignment needs: U plus one blank per adjacent repeat."""
    u = labels_bu.shape[1]
    valid = jnp.arange(u)[None, :] < label_len_b[:, None]
    repeat = (labels_bu[:, 1:] == labels_bu[:, :-1]) & valid[:, 1:]
    return label_len_b + jnp.sum(repeat, axis=1)


def ctc_loss(
    logits_btv: jax.Array,
    logit_len_b: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    *,
    blank_id: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance negative log-likelihood and a validity mask.

    Args:
      logits_btv: (B, T, V) unnormalized logits (float32).
      logit_len_b: (B,) valid frames.
      labels_bu: (B, U) int32 label ids (padding arbitrary past label_len).
      label_len_b: (B,) label counts.
    Returns:
      loss_b: (B,) float32, 0 where invalid.
      valid_b: (B,) bool: feasible alignment and finite loss.
    """
    t = logits_btv.shape[1]
    u = labels_bu.shape[1]
    logit_pad = (jnp.arange(t)[None, :] >= logit_len_b[:, None]).astype(jnp.float32)
    label_pad = (jnp.arange(u)[None, :] >= label_len_b[:, None]).astype(jnp.float32)
    loss = optax.ctc_loss(
        logits_btv.astype(jnp.float32), logit_pad, labels_bu, label_pad, blank_id=blank_id
    )
    feasible = required_frames(labels_bu, label_len_b) <= logit_len_b
    valid = feasible & jnp.isfinite(loss)
    return jnp.where(valid, loss, 0.0), valid
