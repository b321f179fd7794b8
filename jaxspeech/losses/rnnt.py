"""RNN-T (transducer) loss in JAX: exact log-likelihood over the T x (U+1) lattice.

Pure functions:

- `rnnt_lattice_logprobs` runs the joiner over the lattice a chunk of frames at a time and
  keeps, per (t, u), only the two log-probabilities the loss needs: blank, and the next
  label y_{u+1}. A chunk's (B, Tc, U+1, V) logits are reduced by one fused log-sum-exp and
  never stored: the chunk is rematerialized (`jax.checkpoint`) in the backward pass, so the
  float32 (B, T, U+1, V) log-softmax is never held at once, forward or backward.
- `rnnt_loss_from_logprobs` is the forward (alpha) recursion over anti-diagonals
  n = t + u: every cell of a diagonal depends only on the previous diagonal, so one
  `lax.scan` step updates all u at once (T + U sequential steps instead of T x U).
  Its gradient (a custom VJP) is a second recursion over the diagonals in reverse that
  keeps only the alphas, instead of the several per-step residuals of autodiff.
- `rnnt_pruned_loss` (k2's pruned RNN-T): an additive "simple" joiner's exact loss
  (`rnnt_simple_logprobs`, no 4-D tensor at all, and its (B, T, V) acoustic logits only a
  chunk of frames at a time) locates, per frame, a window of R lattice rows holding most
  alignments (`rnnt_prune_ranges`); the full joiner runs only on those (B, T, R) cells and
  an alpha recursion over the windows themselves sums the alignments that stay inside.

Two implementations of the recursions: kernel="xla" (the `lax.scan`s here; the CPU path
and the reference) and kernel="pallas" (`jaxspeech.losses.kernels.rnnt`: each recursion
one kernel launch, the gradient in closed form from alpha and beta; interpreted, slowly,
off the GPU). The joiner and its log-softmax are XLA either way.

Conventions (Graves 2012): alpha(0, 0) = 0; alpha(t, u) = logaddexp(alpha(t-1, u) +
blank(t-1, u), alpha(t, u-1) + label(t, u-1)); -log P(y | x) = -(alpha(T-1, U) +
blank(T-1, U)), with T and U the utterance's own frame and label counts.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxspeech.losses.chunks import map_frame_chunks
from jaxspeech.losses.kernels import common as kernels
from jaxspeech.losses.kernels import rnnt as rnnt_kernel

# A finite stand-in for log(0), shared with the kernels (defined there, as they are
# imported here): -inf would make logaddexp's gradient 0/0 = NaN where both arguments are
# impossible; this stays finite and far below any reachable log-probability.
LOG_ZERO = rnnt_kernel.LOG_ZERO

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
    u1 = pred_bud.shape[1]
    # The label that follows each lattice row; the last row has none (masked below).
    next_bu = jnp.pad(labels_bu, ((0, 0), (0, u1 - labels_bu.shape[1])))[:, None, :, None]

    def one_chunk(enc_chunk_btd: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = joiner(enc_chunk_btd[:, :, None, :], pred_bud[:, None, :, :])
        logits = logits.astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)  # (B, Tc, U+1)
        blank = logits[..., blank_id] - lse
        label = jnp.take_along_axis(logits, jnp.broadcast_to(next_bu, (*lse.shape, 1)), -1)
        return blank, label[..., 0] - lse

    blank, label = map_frame_chunks(one_chunk, (enc_btd,), frames_per_chunk)
    return blank, label.at[:, :, -1].set(LOG_ZERO)


def _skew(x_btu: jax.Array) -> jax.Array:
    """(B, T, U+1) -> (T+U+1, B, U+1) with out[n, b, u] = x[b, n - 1 - u, u], the value at
    the frame one before cell u of anti-diagonal n (LOG_ZERO outside [0, T)).

    A shear by reshape, not a gather: row u of the padded (B, U+1, W) array, read with row
    length W - 1, starts u places later. A gather would need (B, T+U+1, U+1, 3) int32
    indices, and its gradient a scatter with the same indices: 3x the array itself.
    """
    b, t, u1 = x_btu.shape
    width = t + 1 + u1  # one LOG_ZERO column before frame 0, U+1 after frame T-1
    x_but = jnp.pad(x_btu.swapaxes(1, 2), ((0, 0), (0, 0), (1, u1)), constant_values=LOG_ZERO)
    flat = x_but.reshape(b, u1 * width)[:, : u1 * (width - 1)]
    # Row u now holds padded column m - u at position m: out[u, m] = x[m - 1 - u, u].
    return flat.reshape(b, u1, width - 1).transpose(2, 0, 1)


def _alpha_recursion(blank_nbu: jax.Array, label_nbu: jax.Array) -> jax.Array:
    """(T+U, B, U+1) alpha of every anti-diagonal, from the skewed log-probabilities."""
    _, b, u1 = blank_nbu.shape
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
    _, alphas = jax.lax.scan(step, alpha0, (blank_nbu[1:-1], label_nbu[1:-1]))
    return jnp.concatenate([alpha0[None], alphas], axis=0)


def rnnt_loss_from_logprobs(
    blank_btu: jax.Array,
    label_btu: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
    *,
    kernel: str = "xla",
) -> jax.Array:
    """(B,) -log P(y | x) by the alpha recursion over anti-diagonals.

    The gradient is the occupation, computed by a second recursion over the anti-diagonals
    in reverse (a custom VJP): autodiff through the forward scan would store several
    (T+U, B, U+1) residuals per operation of a step; this stores only the alphas. Reverse
    mode only (no jvp, no second derivatives).

    Args:
      blank_btu, label_btu: (B, T, U+1) log-probabilities (`rnnt_lattice_logprobs`).
      frames_b: (B,) valid frames, 1 <= T_b <= T.
      label_len_b: (B,) label counts, 0 <= U_b <= U.
      kernel: "xla" (the scans here) or "pallas" (`jaxspeech.losses.kernels.rnnt`; the
        same values and gradients).
    """
    blank, label = blank_btu.astype(jnp.float32), label_btu.astype(jnp.float32)
    if kernels.use_pallas(kernel):
        return rnnt_kernel.lattice_nll(blank, label, frames_b, label_len_b)
    return _nll(blank, label, frames_b, label_len_b)


@jax.custom_vjp
def _nll(
    blank_btu: jax.Array, label_btu: jax.Array, frames_b: jax.Array, label_len_b: jax.Array
) -> jax.Array:
    return _loss_forward(blank_btu, label_btu, frames_b, label_len_b)[0]


def _loss_forward(
    blank_btu: jax.Array, label_btu: jax.Array, frames_b: jax.Array, label_len_b: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    b = blank_btu.shape[0]
    # Cell u of diagonal n is (t, u) = (n - u, u). It is entered from (t-1, u) by a blank
    # emitted at (n - 1 - u, u), and from (t, u-1) by label u-1 emitted at (n - u, u - 1),
    # i.e. at (n - 1 - k, k) for k = u - 1: both read the same skewed layout.
    alphas = _alpha_recursion(_skew(blank_btu), _skew(label_btu))
    rows = jnp.arange(b)
    final_alpha = alphas[frames_b - 1 + label_len_b, rows, label_len_b]
    final_blank = blank_btu[rows, frames_b - 1, label_len_b]
    return -(final_alpha + final_blank), (blank_btu, label_btu, frames_b, label_len_b, alphas)


def _loss_backward(
    residuals: tuple[jax.Array, ...], g_b: jax.Array
) -> tuple[jax.Array, jax.Array, None, None]:
    """d(-log P)/d log-probs. With c_n[u] = d log P / d alpha(n - u, u), the arc from cell
    (t, u) to a successor s carries c_s * exp(alpha(t, u) + arc log-prob - alpha_s): the
    posterior probability of the arc, which is its log-prob's gradient and flows back into
    c(t, u). Everything is a probability in [0, 1] (alpha_s >= alpha(t, u) + arc log-prob),
    so no exp() can overflow, and cells that no path to the final cell visits get exact
    zeros."""
    blank_btu, label_btu, frames_b, label_len_b, alphas = residuals
    b, _, u1 = blank_btu.shape
    blank_nbu, label_nbu = _skew(blank_btu), _skew(label_btu)
    final_n = frames_b - 1 + label_len_b  # the final cell's diagonal
    final_bu = jnp.arange(u1)[None, :] == label_len_b[:, None]

    def step(
        carry: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, ...]
    ) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
        c_next, alpha_next = carry  # diagonal n + 1
        n, alpha_bu, blank_bu, label_bu = xs  # alpha of diagonal n, arcs into n + 1
        d_blank = c_next * jnp.exp(alpha_bu + blank_bu - alpha_next)
        d_label = jnp.pad(
            c_next[:, 1:] * jnp.exp(alpha_bu[:, :-1] + label_bu[:, :-1] - alpha_next[:, 1:]),
            ((0, 0), (0, 1)),
        )
        c = d_blank + d_label + jnp.where(final_bu & (n == final_n)[:, None], 1.0, 0.0)
        return (c, alpha_bu), (d_blank, d_label)

    last = alphas.shape[0] - 1  # diagonal T+U-1
    c_last = jnp.where(final_bu & (final_n == last)[:, None], 1.0, 0.0)
    xs = (jnp.arange(last), alphas[:-1], blank_nbu[1:-1], label_nbu[1:-1])
    _, (d_blank_nbu, d_label_nbu) = jax.lax.scan(step, (c_last, alphas[-1]), xs, reverse=True)
    # Back to (B, T, U+1): the transpose of the skew (diagonals 0 and T+U read padding).
    zero = jnp.zeros((1, b, u1), jnp.float32)
    _, unskew = jax.vjp(_skew, blank_btu)
    (d_blank,) = unskew(jnp.concatenate([zero, d_blank_nbu, zero], axis=0))
    (d_label,) = unskew(jnp.concatenate([zero, d_label_nbu, zero], axis=0))
    d_blank = d_blank.at[jnp.arange(b), frames_b - 1, label_len_b].add(1.0)  # final blank
    scale = -g_b[:, None, None]
    return scale * d_blank, scale * d_label, None, None


_nll.defvjp(_loss_forward, _loss_backward)


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
    kernel: str = "xla",
) -> tuple[jax.Array, jax.Array]:
    """Per-utterance RNN-T negative log-likelihood and a validity mask.

    Args: as `rnnt_lattice_logprobs`, plus enc_len_b (B,) valid frames, label_len_b
      (B,) label counts and the recursion's `kernel` (`rnnt_loss_from_logprobs`).
    Returns:
      loss_b: (B,) float32, 0 where invalid.
      valid_b: (B,) bool: at least one frame and a finite loss. Unlike CTC, any label
        sequence fits any number of frames >= 1 (labels need no frames of their own).
    """
    blank, label = rnnt_lattice_logprobs(
        joiner, enc_btd, pred_bud, labels_bu, blank_id=blank_id, frames_per_chunk=frames_per_chunk
    )
    frames = jnp.maximum(enc_len_b, 1)
    loss = rnnt_loss_from_logprobs(blank, label, frames, label_len_b, kernel=kernel)
    valid = (enc_len_b >= 1) & jnp.isfinite(loss) & (loss < -0.5 * LOG_ZERO)
    return jnp.where(valid, loss, 0.0), valid


# ----------------------------------------------------------------------------------------
# Pruned RNN-T (Kuang et al., 2022, "Pruned RNN-T for fast, memory-efficient ASR
# training"). A cheap "simple" joiner, logits = am[t] + lm[u], gives a lattice whose exact
# loss needs no (B, T, U+1, V) tensor. Its occupation probabilities say which few label
# positions each frame's alignments pass through; the full joiner is then run only on a
# window of R rows per frame, and every cell outside the windows is impossible.
# ----------------------------------------------------------------------------------------


def rnnt_simple_logprobs(
    am_btv: jax.Array,
    lm_buv: jax.Array,
    labels_bu: jax.Array,
    *,
    blank_id: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Blank and next-label log-probabilities of the additive ("simple") joiner.

    logits[b, t, u, :] = am[b, t, :] + lm[b, u, :], log-normalized over V. The normalizer
    log sum_v exp(am[t, v] + lm[u, v]) is a (B, T, V) x (B, V, U+1) matmul of the two
    exponentiated halves, each shifted by its own max so that exp() stays in (0, 1]: the
    (B, T, U+1, V) sum is never formed. If the two halves put their mass on disjoint
    tokens the products can underflow; the sum is floored at the smallest normal float
    so its log stays finite (the simple loss only steers the pruning).

    Args:
      am_btv: (B, T, V) acoustic part of the logits (encoder side).
      lm_buv: (B, U+1, V) label-context part (predictor side; row u: after u labels).
      labels_bu: (B, U) int32 label ids (padding arbitrary past each label length).
      blank_id: the blank's index in the vocabulary.
    Returns:
      blank_btu, label_btu: (B, T, U+1) float32, as `rnnt_lattice_logprobs` (the last
        column of label_btu is LOG_ZERO).
    """
    am = am_btv.astype(jnp.float32)
    lm = lm_buv.astype(jnp.float32)
    b, t, _ = am.shape
    u = labels_bu.shape[1]
    # The shifts cancel in the normalized result, so autodiff may treat them as constants
    # (the log-sum-exp's gradient, the softmax, does not depend on them).
    am_max = jax.lax.stop_gradient(jnp.max(am, axis=-1, keepdims=True))  # (B, T, 1)
    lm_max = jax.lax.stop_gradient(jnp.max(lm, axis=-1, keepdims=True))  # (B, U+1, 1)
    # HIGHEST: a softmax statistic; TPUs would otherwise multiply in bfloat16.
    sums = jnp.einsum(
        "btv,buv->btu",
        jnp.exp(am - am_max),
        jnp.exp(lm - lm_max),
        precision=jax.lax.Precision.HIGHEST,
    )
    lse = jnp.log(sums + jnp.finfo(jnp.float32).tiny) + am_max + lm_max.swapaxes(1, 2)
    blank = am[:, :, blank_id, None] + lm[:, None, :, blank_id] - lse
    am_label = jnp.take_along_axis(am, jnp.broadcast_to(labels_bu[:, None, :], (b, t, u)), 2)
    lm_label = jnp.take_along_axis(lm[:, :u], labels_bu[:, :, None], 2)[..., 0]  # (B, U)
    label = jnp.pad(am_label + lm_label[:, None, :], ((0, 0), (0, 0), (0, 1))) - lse
    return blank, label.at[:, :, -1].set(LOG_ZERO)


def _loss_and_occupation(
    blank_btu: jax.Array,
    label_btu: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
    kernel: str = "xla",
) -> tuple[jax.Array, jax.Array]:
    """(-log P (B,), occupation (B, T, U+1)) from one forward and one backward recursion.

    The occupation of a cell is the posterior probability that the alignment passes
    through it: d log P / d(its blank and label log-probs), summed (a visited cell is left
    by exactly one arc). That is also the loss's gradient, so the loss takes it as is: a
    first-order term that is zero in value carries it to the log-probs, instead of a second
    backward pass through the recursion (second derivatives of the loss are not supported).
    No gradient flows through the occupation itself.
    """

    def loss(blank: jax.Array, label: jax.Array) -> jax.Array:
        return rnnt_loss_from_logprobs(blank, label, frames_b, label_len_b, kernel=kernel)

    sg = jax.lax.stop_gradient
    loss_b, pullback = jax.vjp(loss, sg(blank_btu), sg(label_btu))
    # An utterance whose loss is not finite must not poison its windows or gradients.
    d_blank, d_label = (jnp.where(jnp.isfinite(d), d, 0.0) for d in pullback(jnp.ones_like(loss_b)))
    first_order = (blank_btu - sg(blank_btu)) * d_blank + (label_btu - sg(label_btu)) * d_label
    return loss_b + jnp.sum(first_order, axis=(1, 2)), -(d_blank + d_label)


def _ranges_from_occupation(
    occupation_btu: jax.Array, frames_b: jax.Array, label_len_b: jax.Array, prune_range: int
) -> jax.Array:
    """(B, T) int32 window starts: see `rnnt_prune_ranges`."""
    _, t, u1 = occupation_btu.shape
    r = max(1, min(prune_range, u1))
    # Occupation of every window [s, s + r), s = 0 .. U+1-r, from one cumulative sum.
    csum = jnp.cumsum(jnp.pad(occupation_btu, ((0, 0), (0, 0), (1, 0))), axis=-1)
    start = jnp.argmax(csum[..., r:] - csum[..., : u1 + 1 - r], axis=-1).astype(jnp.int32)
    # The highest start whose window still lies inside the utterance's own rows 0..U_b; it
    # is also the start the last frame must have, so that its window holds (T_b-1, U_b).
    last = jnp.maximum(label_len_b.astype(jnp.int32) - r + 1, 0)[:, None]  # (B, 1)
    frame = jnp.arange(t, dtype=jnp.int32)[None, :]
    start = jnp.where(frame < frames_b[:, None] - 1, start, last)
    # Non-decreasing: lower each start to the smallest start of any later frame (which also
    # brings every start down to at most `last`).
    start = jax.lax.cummin(start, axis=1, reverse=True)
    # No gap: s_{t+1} - s_t <= r - 1, so the top row of frame t's window reaches frame
    # t+1's bottom row. With slack_t = (r-1) t - s_t that is "slack non-decreasing", made so
    # the same way (which only raises starts, never above `last`); clipping slack at 0 puts
    # frame 0's window at row 0 and keeps the constraint (k2's _adjust_pruning_lower_bound).
    slack = (r - 1) * frame - start
    slack = jnp.maximum(jax.lax.cummin(slack, axis=1, reverse=True), 0)
    return (r - 1) * frame - slack


def rnnt_prune_ranges(
    blank_btu: jax.Array,
    label_btu: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
    prune_range: int,
    *,
    kernel: str = "xla",
) -> jax.Array:
    """Per-frame windows of R = min(prune_range, U+1) lattice rows holding most alignments.

    Frame t keeps rows [s_t, s_t + R). s_t starts the window of R consecutive rows with the
    largest occupation probability under the given lattice (normally the simple one), then
    is adjusted so that: s_0 = 0; s_t is non-decreasing; s_{t+1} <= s_t + R - 1 (some path
    stays inside the windows); 0 <= s_t <= max(U_b - R + 1, 0) (the window lies inside the
    utterance's rows); and the last frame's window holds U_b (frames at and past T_b - 1
    start at max(U_b - R + 1, 0)). The last two can conflict only when U_b > (R-1) T_b:
    then no path fits the windows and the pruned loss is marked invalid.

    Args:
      blank_btu, label_btu: (B, T, U+1) lattice log-probabilities; no gradient flows back.
      frames_b: (B,) valid frames, 1 <= T_b <= T.
      label_len_b: (B,) label counts, 0 <= U_b <= U.
      prune_range: R, rows kept per frame (>= 2 unless U = 0).
      kernel: the recursions' implementation (`rnnt_loss_from_logprobs`).
    Returns:
      start_bt: (B, T) int32 s_t.
    """
    _, occupation = _loss_and_occupation(blank_btu, label_btu, frames_b, label_len_b, kernel)
    return _ranges_from_occupation(occupation, frames_b, label_len_b, prune_range)


def _window_logprobs(
    joiner: Joiner,
    enc_btd: jax.Array,
    pred_bud: jax.Array,
    next_bu: jax.Array,
    rows_btr: jax.Array,
    blank_id: int,
) -> tuple[jax.Array, jax.Array]:
    """(B, T', R) blank and next-label log-probs of the joiner on the window cells: frame t
    of enc_btd against predictor rows rows_btr[:, t] (gathered here, so that a chunk of
    frames holds only its own (B, T', R, D) rows)."""
    # Row gathers vmapped over the batch (gathers with a batching dim), not indexed with
    # an arange over it: the SPMD partitioner keeps a batch-sharded predictor output on
    # its devices for the former and all-gathers it onto every device for the latter.
    rows = jax.vmap(lambda x, r: x[r])
    logits = joiner(enc_btd[:, :, None, :], rows(pred_bud, rows_btr)).astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)  # (B, T', R)
    next_btr = rows(next_bu, rows_btr)
    label = jnp.take_along_axis(logits, next_btr[..., None], axis=-1)[..., 0]
    return logits[..., blank_id] - lse, label - lse


def _window_loss(
    blank_btr: jax.Array,
    label_btr: jax.Array,
    start_bt: jax.Array,
    frames_b: jax.Array,
    label_len_b: jax.Array,
) -> jax.Array:
    """(B,) -log P summed over the alignments that stay inside the windows.

    The alpha recursion of `rnnt_loss_from_logprobs`, run on the windows themselves, frame
    by frame: alpha_t[r] is alpha(t, s_t + r). Cells outside every window would only hold
    LOG_ZERO, so nothing of (B, T, U+1) size is formed. Frame t's window is entered by
    blanks from frame t-1's rows (shifted by s_t - s_{t-1} <= R-1) and then climbed by
    label moves, one row at a time (R is small and static, so the climb is unrolled).
    """
    b, t, r = blank_btr.shape
    slot_r = jnp.arange(r, dtype=jnp.int32)

    def climb(entry_br: jax.Array, label_br: jax.Array) -> jax.Array:
        rows = [entry_br[:, 0]]
        for k in range(1, r):
            up = jnp.logaddexp(entry_br[:, k], rows[-1] + label_br[:, k - 1])
            rows.append(jnp.maximum(up, LOG_ZERO))  # impossible paths stay at the floor
        return jnp.stack(rows, axis=1)

    def step(alpha_br: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        blank_prev_br, label_br, shift_b = xs
        source = slot_r[None, :] + shift_b[:, None]  # frame t-1's slot below slot r
        moved = jnp.take_along_axis(alpha_br + blank_prev_br, jnp.minimum(source, r - 1), axis=1)
        new = climb(jnp.where(source < r, moved, LOG_ZERO), label_br)
        return new, new

    first = jnp.full((b, r), LOG_ZERO, jnp.float32).at[:, 0].set(0.0)  # s_0 = 0
    alpha0 = climb(first, label_btr[:, 0])
    shift_bt = jnp.diff(start_bt, axis=1)  # (B, T-1)
    xs = (blank_btr[:, :-1].swapaxes(0, 1), label_btr[:, 1:].swapaxes(0, 1), shift_bt.T)
    _, alphas = jax.lax.scan(step, alpha0, xs)
    alphas = jnp.concatenate([alpha0[None], alphas], axis=0)  # (T, B, R)
    rows = jnp.arange(b)
    last = frames_b - 1
    # The final cell (T_b-1, U_b) is outside the last window only when no path fits.
    slot = label_len_b - start_bt[rows, last]
    inside = (slot >= 0) & (slot < r)
    slot = jnp.clip(slot, 0, r - 1)
    final = alphas[last, rows, slot] + blank_btr[rows, last, slot]
    return -jnp.where(inside, final, LOG_ZERO)


def _simple_lattice(
    simple_am: Callable[[jax.Array], jax.Array],
    am_in_btd: jax.Array,
    lm_buv: jax.Array,
    labels_bu: jax.Array,
    blank_id: int,
    frames_per_chunk: int | None,
) -> tuple[jax.Array, jax.Array]:
    """The simple joiner's (B, T, U+1) blank and next-label log-probs (`rnnt_simple_logprobs`
    of am = simple_am(am_in_btd) and lm_buv), a chunk of frames at a time unless
    `frames_per_chunk` is None."""

    def simple(am_in: jax.Array) -> tuple[jax.Array, jax.Array]:
        return rnnt_simple_logprobs(simple_am(am_in), lm_buv, labels_bu, blank_id=blank_id)

    if frames_per_chunk is None:
        return simple(am_in_btd)
    return map_frame_chunks(simple, (am_in_btd,), frames_per_chunk)


def _pruned_lattice(
    joiner: Joiner,
    enc_btd: jax.Array,
    pred_bud: jax.Array,
    labels_bu: jax.Array,
    start_bt: jax.Array,
    r: int,
    blank_id: int,
    frames_per_chunk: int | None,
) -> tuple[jax.Array, jax.Array]:
    """The full joiner's (B, T, R) blank and next-label log-probs on each frame's window of
    R = `r` rows from `start_bt` (B, T) on (`_window_logprobs`), a chunk of frames at a
    time unless `frames_per_chunk` is None."""
    u1 = pred_bud.shape[1]
    # Rows of each frame's window; r <= U+1 and s_t <= U+1-r keep them inside the lattice.
    rows_btr = start_bt[:, :, None] + jnp.arange(r, dtype=jnp.int32)
    next_bu = jnp.pad(labels_bu, ((0, 0), (0, u1 - labels_bu.shape[1])))  # (B, U+1)

    def window(enc: jax.Array, rows: jax.Array) -> tuple[jax.Array, jax.Array]:
        return _window_logprobs(joiner, enc, pred_bud, next_bu, rows, blank_id)

    if frames_per_chunk is None:
        return window(enc_btd, rows_btr)
    return map_frame_chunks(window, (enc_btd, rows_btr), frames_per_chunk)


def _finite(loss_b: jax.Array) -> jax.Array:
    """(B,) bool: the loss is finite and not the stand-in for log(0) (no path)."""
    return jnp.isfinite(loss_b) & (loss_b < -0.5 * LOG_ZERO)


def rnnt_pruned_loss(
    joiner: Joiner,
    enc_btd: jax.Array,
    enc_len_b: jax.Array,
    pred_bud: jax.Array,
    simple_am: Callable[[jax.Array], jax.Array],
    am_in_btd: jax.Array,
    lm_buv: jax.Array,
    labels_bu: jax.Array,
    label_len_b: jax.Array,
    *,
    prune_range: int = 5,
    blank_id: int = 0,
    frames_per_chunk: int | None = 16,
    kernel: str = "xla",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Simple-joiner RNN-T loss and the full joiner's RNN-T loss restricted to pruned windows.

    The simple loss (logits am + lm, am = simple_am(am_in)) is exact over the whole
    lattice; its occupation picks each frame's window of R = min(prune_range, U+1) rows
    (`rnnt_prune_ranges`, no gradient through the choice). The full `joiner` then runs on
    (B, T, R) cells only: encoder frame t against predictor rows s_t .. s_t+R-1. Cells
    outside the windows are impossible, so the pruned loss sums over the alignments that
    stay inside them (all of them when R >= U+1, where it equals `rnnt_loss`). Train on a
    weighted sum of the two losses: the simple one trains am/lm, whose lattice must be
    good for the windows to be.

    Memory, chunked: nothing of (B, T, V) or (B, T, U+1, V) size is ever held. The simple
    acoustic logits exist a chunk of frames at a time (simple_am runs inside the chunk,
    rematerialized in the backward pass, as the full joiner in `rnnt_lattice_logprobs`);
    what persists is (B, T, U+1) float32 grids for the simple lattice and (B, T, R) ones
    for the pruned lattice.

    Args:
      joiner: as for `rnnt_loss`, called as joiner(enc (B, T', 1, D), pred (B, T', R, D))
        -> (B, T', R, V) logits.
      enc_btd: (B, T, D) encoder output (the joiner's input); enc_len_b: (B,) valid frames.
      pred_bud: (B, U+1, D) predictor output (row u: after u labels).
      simple_am: the simple joiner's acoustic projection, x (B, T', Din) -> (B, T', V)
        logits, frame by frame (called on chunks of am_in_btd).
      am_in_btd: (B, T, Din) its input (e.g. the encoder output before the joiner's
        projection).
      lm_buv: (B, U+1, V) the simple joiner's predictor-side logits.
      labels_bu: (B, U) int32 label ids; label_len_b: (B,) label counts.
      prune_range: R, rows of the lattice kept per frame (>= 2).
      blank_id: the blank's index in the vocabulary.
      frames_per_chunk: Tc, frames whose (B, Tc, V) simple logits and (B, Tc, R, V) joiner
        logits exist at one time (see `jaxspeech.losses.chunks.map_frame_chunks`). None
        runs each on all frames at once (as k2 does): more memory, for no reliable speed
        gain on CPU (benchmarks/README.md).
      kernel: "xla" or "pallas": the recursions of both lattices (the simple one's loss
        and occupation, the windows'), as `rnnt_loss_from_logprobs`.
    Returns:
      simple_loss_b, pruned_loss_b: (B,) float32 -log P(y | x), 0 where invalid.
      valid_b: (B,) bool: at least one frame, and both losses finite (the pruned one is
        not when U_b > (R-1) T_b: no path fits the windows).
    """
    if prune_range < 2:
        raise ValueError(f"prune_range must be >= 2 (one label move per window), got {prune_range}")
    r = min(prune_range, pred_bud.shape[1])
    frames = jnp.maximum(enc_len_b, 1)
    blank_s, label_s = _simple_lattice(
        simple_am, am_in_btd, lm_buv, labels_bu, blank_id, frames_per_chunk
    )
    simple_loss, occupation = _loss_and_occupation(blank_s, label_s, frames, label_len_b, kernel)
    start_bt = _ranges_from_occupation(occupation, frames, label_len_b, prune_range)
    blank_w, label_w = _pruned_lattice(
        joiner, enc_btd, pred_bud, labels_bu, start_bt, r, blank_id, frames_per_chunk
    )
    if kernels.use_pallas(kernel):
        u1 = pred_bud.shape[1]
        pruned_loss = rnnt_kernel.window_nll(blank_w, label_w, start_bt, frames, label_len_b, u1)
    else:
        pruned_loss = _window_loss(blank_w, label_w, start_bt, frames, label_len_b)
    valid = (enc_len_b >= 1) & _finite(simple_loss) & _finite(pruned_loss)
    return jnp.where(valid, simple_loss, 0.0), jnp.where(valid, pruned_loss, 0.0), valid
