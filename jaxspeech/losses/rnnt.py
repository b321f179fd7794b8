"""RNN-T (transducer) loss in JAX: exact log-likelihood over the T x (U+1) lattice.

Two pieces, both pure functions:

- `rnnt_lattice_logprobs` runs the joiner over the lattice a chunk of frames at a time and
  keeps, per (t, u), only the two log-probabilities the loss needs: blank, and the next
  label y_{u+1}. A chunk's (B, Tc, U+1, V) logits are reduced by one fused log-sum-exp and
  never stored: the chunk is rematerialized (`jax.checkpoint`) in the backward pass, so the
  float32 (B, T, U+1, V) log-softmax is never held at once, forward or backward.
- `rnnt_loss_from_logprobs` is the forward (alpha) recursion over anti-diagonals
  n = t + u: every cell of a diagonal depends only on the previous diagonal, so one
  `lax.scan` step updates all u at once (T + U sequential steps instead of T x U).
  Gradients come from autodiff through the scan.

Conventions (Graves 2012): alpha(0, 0) = 0; alpha(t, u) = logaddexp(alpha(t-1, u) +
blank(t-1, u), alpha(t, u-1) + label(t, u-1)); -log P(y | x) = -(alpha(T-1, U) +
blank(T-1, U)), with T and U the utterance's own frame and label counts.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

# A finite stand-in for log(0): -inf would make logaddexp's gradient 0/0 = NaN where both
# arguments are impossible; this stays finite and far below any reachable log-probability.
LOG_ZERO = -1e30

# joiner(enc (B, Tc, 1, D), pred (B, 1, U+1, D)) -> logits (B, Tc, U+1, V)
Joiner = Callable[[jax.Array, jax.Array], jax.Array]


def rnnt_lattice_logprobs(
    joiner: Joiner,
    enc_btd: jax.Array,
    pred_bud: jax.Array,
    labels_bu: jax.Array,
    *,
    blank_id: int = 0,
    frames_per_chunk: int = 16,
) -> tuple[jax.Array, jax.Array]:
    """Blank and next-label log-probabilities over the lattice, chunk by chunk.

    Args:
      joiner: maps broadcastable encoder and predictor outputs to logits (see `Joiner`).
      enc_btd: (B, T, D) encoder output.
      pred_bud: (B, U+1, D) predictor output (row u: after u labels).
      labels_bu: (B, U) int32 label ids (padding arbitrary past each label length).
      blank_id: the blank's index in the vocabulary.
      frames_per_chunk: Tc, frames whose (B, Tc, U+1, V) logits exist at one time.
    Returns:
      blank_btu: (B, T, U+1) float32 log p(blank | t, u).
      label_btu: (B, T, U+1) float32 log p(y_{u+1} | t, u); the last column (u = U) is
        LOG_ZERO (there is no next label).
    """
    b, t, _ = enc_btd.shape
    u1 = pred_bud.shape[1]
    tc = max(1, min(frames_per_chunk, t))
    n_chunks = -(-t // tc)
    enc = jnp.pad(enc_btd, ((0, 0), (0, n_chunks * tc - t), (0, 0)))
    enc_nbtd = enc.reshape(b, n_chunks, tc, -1).swapaxes(0, 1)
    # The label that follows each lattice row; the last row has none (masked below).
    next_bu = jnp.pad(labels_bu, ((0, 0), (0, u1 - labels_bu.shape[1])))[:, None, :, None]

    @jax.checkpoint
    def one_chunk(enc_chunk_btd: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = joiner(enc_chunk_btd[:, :, None, :], pred_bud[:, None, :, :])
        logits = logits.astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)  # (B, Tc, U+1)
        blank = logits[..., blank_id] - lse
        label = jnp.take_along_axis(logits, jnp.broadcast_to(next_bu, (*lse.shape, 1)), -1)
        return blank, label[..., 0] - lse

    blank_n, label_n = jax.lax.map(one_chunk, enc_nbtd)
    blank = blank_n.swapaxes(0, 1).reshape(b, n_chunks * tc, u1)[:, :t]
    label = label_n.swapaxes(0, 1).reshape(b, n_chunks * tc, u1)[:, :t]
    label = label.at[:, :, -1].set(LOG_ZERO)
    return blank, label


def _skew(x_btu: jax.Array) -> jax.Array:
    """(B, T, U+1) -> (T+U+1, B, U+1) with out[n, b, u] = x[b, n - 1 - u, u], the value at
    the frame one before cell u of anti-diagonal n (LOG_ZERO outside [0, T))."""
    b, t, u1 = x_btu.shape
    frame = jnp.arange(t + u1)[:, None] - 1 - jnp.arange(u1)[None, :]  # (N, U+1)
    inside = (frame >= 0) & (frame < t)
    index = jnp.broadcast_to(jnp.clip(frame, 0, t - 1)[None], (b, *frame.shape))
    gathered = jnp.take_along_axis(x_btu, index, axis=1)  # (B, N, U+1)
    return jnp.where(inside[None], gathered, LOG_ZERO).swapaxes(0, 1)


def rnnt_loss_from_logprobs(
    blank_btu: jax.Array,
    label_btu: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
) -> jax.Array:
    """(B,) -log P(y | x) by the alpha recursion over anti-diagonals.

    Args:
      blank_btu, label_btu: (B, T, U+1) log-probabilities (`rnnt_lattice_logprobs`).
      frames_b: (B,) valid frames, 1 <= T_b <= T.
      label_len_b: (B,) label counts, 0 <= U_b <= U.
    """
    b, t, u1 = blank_btu.shape
    # Cell u of diagonal n is (t, u) = (n - u, u). It is entered from (t-1, u) by a blank
    # emitted at (n - 1 - u, u), and from (t, u-1) by label u-1 emitted at (n - u, u - 1),
    # i.e. at (n - 1 - k, k) for k = u - 1: both read the same skewed layout.
    blank_nbu = _skew(blank_btu.astype(jnp.float32))
    label_nbu = _skew(label_btu.astype(jnp.float32))
    alpha0 = jnp.full((b, u1), LOG_ZERO, jnp.float32).at[:, 0].set(0.0)

    def step(alpha_bu: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        blank_bu, label_bu = xs
        from_blank = alpha_bu + blank_bu
        from_label = jnp.pad(
            alpha_bu[:, :-1] + label_bu[:, :-1], ((0, 0), (1, 0)), constant_values=LOG_ZERO
        )
        # Clamp: two impossible paths must stay at the floor, not sink below it.
        new = jnp.maximum(jnp.logaddexp(from_blank, from_label), LOG_ZERO)
        return new, new

    # Diagonals 1 .. T+U-1 (the last cell (T-1, U) lies on T+U-1).
    _, alphas = jax.lax.scan(step, alpha0, (blank_nbu[1 : t + u1 - 1], label_nbu[1 : t + u1 - 1]))
    alphas = jnp.concatenate([alpha0[None], alphas], axis=0)  # (T+U, B, U+1)
    rows = jnp.arange(b)
    final_alpha = alphas[frames_b - 1 + label_len_b, rows, label_len_b]
    final_blank = blank_btu[rows, frames_b - 1, label_len_b].astype(jnp.float32)
    return -(final_alpha + final_blank)


def rnnt_loss(
    joiner: Joiner,
    enc_btd: jax.Array,
    enc_len_b: jax.Array,
    pred_bud: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    *,
    blank_id: int = 0,
    frames_per_chunk: int = 16,
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance RNN-T negative log-likelihood and a validity mask.

    Args: as `rnnt_lattice_logprobs`, plus enc_len_b (B,) valid frames and label_len_b
      (B,) label counts.
    Returns:
      loss_b: (B,) float32, 0 where invalid.
      valid_b: (B,) bool: at least one frame and a finite loss. Unlike CTC, any label
        sequence fits any number of frames >= 1 (labels need no frames of their own).
    """
    blank, label = rnnt_lattice_logprobs(
        joiner, enc_btd, pred_bud, labels_bu, blank_id=blank_id, frames_per_chunk=frames_per_chunk
    )
    frames = jnp.maximum(enc_len_b, 1)
    loss = rnnt_loss_from_logprobs(blank, label, frames, label_len_b)
    valid = (enc_len_b >= 1) & jnp.isfinite(loss) & (loss < -0.5 * LOG_ZERO)
    return jnp.where(valid, loss, 0.0), valid
