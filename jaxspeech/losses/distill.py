"""Soft-target (knowledge distillation) losses against a teacher's per-frame posteriors.

The teacher's posteriors are stored as the top-k tokens per frame (index + log-probability),
so the full distribution over the vocabulary is reconstructed before the loss: the mass the
top-k leave over is either spread uniformly over the other tokens ("spread") or dropped and
the top-k renormalized ("drop").

Zero-probability tokens are -inf in log space. Every sum of the form q * log q or q * log p
is written so that 0 * log 0 = 0 and no NaN reaches the value or the student's gradient:
padded frames are replaced by harmless values *before* any arithmetic, since masking a NaN
afterwards with jnp.where still lets it into the gradient.

`rest`, `kind` and `temperature` are Python values (static under jit): they are checked
eagerly and pick the computation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Log of the per-token mass given to the tokens outside the top-k when the top-k already
# sum to 1 in float32 ("spread" with nothing left over), so their log is finite instead of
# -inf. exp(-87) ~ 1.6e-38 sits just above the smallest normal float32 (1.18e-38, log -87.34,
# whose float32 log rounds down and exps back to a subnormal): subnormals may be flushed to
# zero on accelerators. V of them (< 1e-34) are far below the ~6e-8 a float32 sum near 1 can
# resolve, so the floor never carries visible mass.
LOG_PROB_FLOOR = -87.0

REST_MODES = ("spread", "drop")
LOSS_KINDS = ("kl", "ce")


def _float_dtype(x: jax.Array) -> jnp.dtype:
    """At least float32: bf16/f16 inputs are upcast, float64 (tests under x64) is kept."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _log_normalize(logp: jax.Array) -> jax.Array:
    """Renormalize log-probabilities over the last axis. A frame that is all -inf stays
    all -inf (zero mass, loss 0) instead of becoming -inf - -inf = NaN."""
    lse = jax.nn.logsumexp(logp, axis=-1, keepdims=True)
    return logp - jnp.where(jnp.isfinite(lse), lse, 0.0)


def topk_log_probs(
    indices_btk: jax.Array,
    log_probs_btk: jax.Array,
    vocab_size: int,
    rest: str = "spread",
) -> jax.Array:
    """The teacher's per-frame log-distribution over the vocabulary from its top-k.

    Args:
      indices_btk: (B, T, k) int token ids, unique within a frame (repeats only in
        padding frames, where whichever duplicate wins does not matter). They must lie in
        [0, vocab_size): that cannot be checked under jit, the targets job that writes
        them guarantees it.
      log_probs_btk: (B, T, k) teacher log-probabilities of those tokens.
      vocab_size: V.
      rest: "spread": the top-k keep their probabilities and the rest
        r = max(0, 1 - sum p) is shared equally by the V - k other tokens (each at least
        exp(LOG_PROB_FLOOR), so their log is finite); "drop": the top-k renormalized to
        sum 1, the others -inf.
    Returns:
      (B, T, V) log-probabilities (at least float32).
    """
    if rest not in REST_MODES:
        raise ValueError(f"rest must be one of {REST_MODES}, got {rest!r}")
    b, t, k = indices_btk.shape
    logp = log_probs_btk.astype(_float_dtype(log_probs_btk))
    if rest == "spread":
        left = jnp.maximum(1.0 - jnp.sum(jnp.exp(logp), axis=-1, keepdims=True), 0.0)
        # k == V leaves no other token: every entry is overwritten by the scatter below,
        # the max() only keeps the division defined.
        fill = jnp.maximum(jnp.log(left) - np.log(max(vocab_size - k, 1)), LOG_PROB_FLOOR)
    else:
        logp = _log_normalize(logp)
        fill = jnp.full((b, t, 1), -jnp.inf, logp.dtype)
    out = jnp.broadcast_to(fill, (b, t, vocab_size))
    bi = jnp.arange(b)[:, None, None]
    ti = jnp.arange(t)[None, :, None]
    return out.at[bi, ti, indices_btk].set(logp)


def _check(kind: str, temperature: float) -> None:
    if kind not in LOSS_KINDS:
        raise ValueError(f"kind must be one of {LOSS_KINDS}, got {kind!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def _frame_mask(length_b: jax.Array, t: int) -> jax.Array:
    return jnp.arange(t)[None, :] < length_b[:, None]


def _soft_loss(
    teacher_logq_btv: jax.Array,
    student_logits_btv: jax.Array,
    mask_bt: jax.Array,
    temperature: float,
    kind: str,
) -> jax.Array:
    """(B,) sum over masked frames of KL(q || p) or CE(q, p) at `temperature`, times
    temperature**2. Inputs must already be finite (or -inf in the teacher) at every frame."""
    logq = _log_normalize(teacher_logq_btv / temperature)
    logp = jax.nn.log_softmax(student_logits_btv / temperature, axis=-1)
    q = jnp.exp(logq)
    # 0 * log 0 = 0: a zero-mass token contributes nothing; its log is replaced by 0 before
    # the product so that neither value nor gradient sees 0 * -inf. logp is always finite.
    cross = -jnp.sum(q * logp, axis=-1)
    if kind == "kl":
        frame = jnp.sum(q * jnp.where(q > 0, logq, 0.0), axis=-1) + cross
    else:
        frame = cross
    # Soft-target gradients scale as 1 / temperature**2 (Hinton et al., 2015); multiplying
    # back keeps their size comparable across temperatures and against hard-label losses.
    return temperature**2 * jnp.sum(jnp.where(mask_bt, frame, 0.0), axis=-1)


def distill_loss(
    student_logits_btv: jax.Array,
    student_len_b: jax.Array,
    teacher_indices_btk: jax.Array,
    teacher_log_probs_btk: jax.Array,
    teacher_len_b: jax.Array,
    *,
    rest: str = "spread",
    temperature: float = 1.0,
    kind: str = "kl",
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance soft-target loss of a student against a teacher's top-k posteriors.

    Args:
      student_logits_btv: (B, T, V) unnormalized student logits.
      student_len_b: (B,) valid student frames.
      teacher_indices_btk: (B, T', k) int teacher top-k token ids (see topk_log_probs).
      teacher_log_probs_btk: (B, T', k) their log-probabilities.
      teacher_len_b: (B,) valid teacher frames. T and T' are padded sizes and may differ;
        the first min(T, T') frames are used (beyond that is padding when lengths agree).
      rest: how the mass outside the top-k is reconstructed, see topk_log_probs.
      temperature: both distributions are softened as q^(1/temperature) (renormalized);
        a Python float > 0.
      kind: "kl": KL(q || p_student); "ce": cross-entropy -sum q log p_student (KL plus
        the teacher's entropy, which has no gradient for the student).
    Returns:
      loss_b: (B,) float32 (float64 under x64 inputs): sum over frames t < student_len of
        the per-frame loss, times temperature**2; 0 where invalid.
      valid_b: (B,) bool: student and teacher frame counts agree. A mismatch means the
        targets belong to a different feature extraction; such rows get weight 0.
    """
    _check(kind, temperature)
    if rest not in REST_MODES:
        raise ValueError(f"rest must be one of {REST_MODES}, got {rest!r}")
    t = min(student_logits_btv.shape[1], teacher_log_probs_btk.shape[1])
    k = teacher_indices_btk.shape[-1]
    valid = student_len_b == teacher_len_b
    mask = _frame_mask(student_len_b, t) & valid[:, None]
    # Padding frames may hold anything (NaN, -inf, repeated or out-of-range ids); replace
    # them by a harmless frame before the math so no NaN reaches the student's gradient.
    logits = student_logits_btv[:, :t].astype(_float_dtype(student_logits_btv))
    logits = jnp.where(mask[..., None], logits, 0.0)
    tlogp = teacher_log_probs_btk[:, :t]
    tlogp = jnp.where(mask[..., None], tlogp.astype(_float_dtype(tlogp)), -np.log(k))
    tidx = jnp.where(mask[..., None], teacher_indices_btk[:, :t], jnp.arange(k))
    logq = topk_log_probs(tidx, tlogp, student_logits_btv.shape[-1], rest)
    loss = _soft_loss(logq, logits, mask, temperature, kind)
    return jnp.where(valid, loss, 0.0), valid


def full_kl(
    student_logits_btv: jax.Array,
    student_len_b: jax.Array,
    teacher_logits_btv: jax.Array,
    temperature: float = 1.0,
) -> jax.Array:
    """(B,) KL(teacher || student) against the teacher's full posteriors: the reference the
    top-k storage approximates. Same tempering, temperature**2 scaling and masking
    (frames t < student_len of the first min(T, T') frames) as distill_loss.

    Args:
      student_logits_btv: (B, T, V) unnormalized student logits.
      student_len_b: (B,) valid frames (the teacher's are assumed equal).
      teacher_logits_btv: (B, T', V) unnormalized teacher logits.
      temperature: a Python float > 0.
    """
    _check("kl", temperature)
    t = min(student_logits_btv.shape[1], teacher_logits_btv.shape[1])
    mask = _frame_mask(student_len_b, t)
    logits = student_logits_btv[:, :t].astype(_float_dtype(student_logits_btv))
    logits = jnp.where(mask[..., None], logits, 0.0)
    teacher = teacher_logits_btv[:, :t].astype(_float_dtype(teacher_logits_btv))
    teacher = jnp.where(mask[..., None], teacher, 0.0)
    return _soft_loss(jax.nn.log_softmax(teacher, axis=-1), logits, mask, temperature, "kl")
