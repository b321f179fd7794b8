"""The attention decoder's loss: label-smoothed cross entropy, ESPnet's LabelSmoothingLoss.

The target distribution puts 1 - s on the reference token and spreads s evenly over the
other V - 1 tokens. As ESPnet's, the loss is the KL divergence from that distribution to
the model's (its cross entropy minus the distribution's constant entropy: the same
gradients, and 0 at the optimum, so a falling loss reads as it does for CTC).

Summed per utterance over its label_len + 1 target positions (the labels and <eos>);
the training objective divides the batch's sum by its label tokens, as it does the CTC
loss, so `ctc_weight * CTC + (1 - ctc_weight) * attention` weighs the two on one scale,
as ESPnet's joint loss does (both per utterance, over one normalizer).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _xlogx(x: float) -> float:
    """x log x with 0 log 0 = 0 (a Python float: the smoothing is a setting, not traced)."""
    return x * math.log(x) if x > 0 else 0.0


def label_smoothed_loss(
    logits_buv: jax.Array,
    targets_bu: jax.Array,
    num_targets_b: jax.Array,
    *,
    smoothing: float = 0.1,
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance label-smoothed loss (KL to the smoothed targets), summed over positions.

    Args:
      logits_buv: (B, U, V) logits (any float dtype; computed in float32).
      targets_bu: (B, U) int target ids; positions >= num_targets_b are padding (ignored).
      num_targets_b: (B,) valid target positions per row (label_len + 1 with <eos>).
      smoothing: s in [0, 1): the probability mass spread over the non-target tokens.
    Returns:
      loss_b: (B,) float32, 0 where not finite.
      ok_b: (B,) bool, the loss is finite.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing}")
    v = logits_buv.shape[-1]
    if v < 2 and smoothing > 0:
        raise ValueError("label smoothing needs a vocabulary of at least 2 tokens")
    logp = jax.nn.log_softmax(logits_buv.astype(jnp.float32), axis=-1)
    confidence = 1.0 - smoothing
    other = smoothing / (v - 1) if v > 1 else 0.0
    target_logp = jnp.take_along_axis(logp, targets_bu[..., None].astype(jnp.int32), -1)[..., 0]
    rest_logp = jnp.sum(logp, axis=-1) - target_logp
    # sum_v q_v log q_v (constant) - sum_v q_v log p_v, q the smoothed target distribution.
    neg_entropy = _xlogx(confidence) + (v - 1) * _xlogx(other)
    per_pos = neg_entropy - (confidence * target_logp + other * rest_logp)
    u = targets_bu.shape[1]
    valid = jax.lax.broadcasted_iota(jnp.int32, (1, u), 1) < num_targets_b[:, None]
    loss_b = jnp.sum(jnp.where(valid, per_pos, 0.0), axis=1)
    ok_b = jnp.isfinite(loss_b)
    return jnp.where(ok_b, loss_b, 0.0), ok_b


def joint_ctc_attention(
    ctc_b: jax.Array, attention_b: jax.Array, ctc_weight: float | jax.Array
) -> jax.Array:
    """(B,) per-utterance joint loss ctc_weight * CTC + (1 - ctc_weight) * attention."""
    return ctc_weight * ctc_b + (1.0 - ctc_weight) * attention_b
