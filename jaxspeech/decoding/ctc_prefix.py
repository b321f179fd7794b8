"""CTC prefix scores for joint CTC/attention decoding (Watanabe et al. 2017, "Hybrid
CTC/attention architecture for end-to-end speech recognition", Algorithm 2; ESPnet's
`CTCPrefixScore`), batched over hypotheses and candidate labels, jitted.

A hypothesis' CTC state is its prefix g's forward variables over the frames: r[t, 0] the
log-probability of the paths over frames 0..t that collapse to g and end in g's last
label, r[t, 1] of those that end in blank. From them, for a candidate label c, the prefix
score psi(g + c) = log P(g + c is a prefix of the output | x) (the probability of every
path whose collapse starts with g + c), and for <eos> psi(g + <eos>) = log P(g | x), the
whole sequence's probability. The beam search adds psi(h) - psi(g) to a hypothesis h that
extends g: its CTC score is then psi(h), never a sum of per-label guesses.

Shapes: N hypotheses, C candidates per hypothesis, T frames, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def initial_state(logp_btv: jax.Array, utt_n: jax.Array, blank_id: int) -> jax.Array:
    """(B, T, V) log-probs, (N,) each hypothesis' utterance -> (N, T, 2) the state of the
    empty prefix: no path ends in a label, and the all-blank path over frames 0..t has
    log-prob sum(logp[:t + 1, blank])."""
    blank = jnp.cumsum(logp_btv[utt_n, :, blank_id].astype(jnp.float32), axis=1)
    return jnp.stack([jnp.full_like(blank, NEG_INF), blank], axis=-1)


@functools.partial(jax.jit, static_argnames=("blank_id", "eos_id"))
def prefix_scores(
    r_nt2: jax.Array,
    last_n: jax.Array,
    logp_btv: jax.Array,
    utt_n: jax.Array,
    len_n: jax.Array,
    cand_nc: jax.Array,
    *,
    blank_id: int,
    eos_id: int,
) -> tuple[jax.Array, jax.Array]:
    """Prefix scores of each hypothesis' prefix extended by each of its candidates.

    Args:
      r_nt2: (N, T, 2) the prefixes' states (`initial_state` for the empty prefix).
      last_n: (N,) each prefix's last label, -1 for the empty prefix.
      logp_btv: (B, T, V) the utterances' CTC log-probs.
      utt_n: (N,) each hypothesis' utterance (a row of logp_btv).
      len_n: (N,) its valid frames (frames from len on are ignored).
      cand_nc: (N, C) candidate labels; `eos_id` asks for the whole prefix's probability.

    Returns:
      psi_nc: (N, C) log P(prefix + candidate is a prefix of the output), or log P(output =
        prefix) for <eos>; -inf where impossible (more labels than frames allow).
      r_nct2: (N, C, T, 2) the states of the extended prefixes (garbage for <eos> and for
        frames from len on: never read).
    """
    t_max = logp_btv.shape[1]
    # The candidates' log-probs, gathered straight from the utterances' rows (no (N, T, V)
    # copy: V may be thousands of pieces).
    frames = jnp.arange(t_max)[None, :, None]
    x_ntc = logp_btv[utt_n[:, None, None], frames, cand_nc[:, None, :]].astype(jnp.float32)
    blank_nt = logp_btv[utt_n, :, blank_id].astype(jnp.float32)
    r_n, r_b = r_nt2[..., 0], r_nt2[..., 1]
    # phi[t]: the paths over frames 0..t after which the candidate may start a new label:
    # those ending in blank, and those ending in the prefix's last label unless the
    # candidate repeats it (a repeat needs a blank between).
    same_nc = cand_nc == last_n[:, None]
    phi_nct = jnp.logaddexp(
        r_b[:, None, :], jnp.where(same_nc[..., None], NEG_INF, r_n[:, None, :])
    )
    empty_n = last_n < 0
    start_nc = jnp.where(empty_n[:, None], x_ntc[:, 0, :], NEG_INF)  # the label at frame 0

    def frame(carry, inputs):
        rn, rb = carry
        phi_prev, x_t, blank_t = inputs
        rn_t = jnp.logaddexp(rn, phi_prev) + x_t
        rb_t = jnp.logaddexp(rn, rb) + blank_t[:, None]
        return (rn_t, rb_t), (rn_t, rb_t)

    xs = (
        jnp.moveaxis(phi_nct[..., :-1], -1, 0),
        jnp.moveaxis(x_ntc[:, 1:], 1, 0),
        jnp.moveaxis(blank_nt[:, 1:], 1, 0),
    )
    init = (start_nc, jnp.full_like(start_nc, NEG_INF))
    _, (rn_tnc, rb_tnc) = jax.lax.scan(frame, init, xs)
    rn_nct = jnp.concatenate([start_nc[..., None], jnp.moveaxis(rn_tnc, 0, -1)], axis=-1)
    rb_nct = jnp.concatenate([init[1][..., None], jnp.moveaxis(rb_tnc, 0, -1)], axis=-1)
    # psi: the candidate's first frame is t (after phi[t - 1]), at any valid frame.
    enter_nct = jnp.concatenate(
        [start_nc[..., None], phi_nct[..., :-1] + jnp.moveaxis(x_ntc[:, 1:], 1, 2)], axis=-1
    )
    valid_t = jnp.arange(t_max)[None, None, :] < len_n[:, None, None]
    psi_nc = jax.nn.logsumexp(jnp.where(valid_t, enter_nct, NEG_INF), axis=-1)
    # <eos>: every path over the valid frames that collapses to the prefix itself.
    end = jnp.clip(len_n - 1, 0, t_max - 1)
    at_end = jnp.take_along_axis(r_nt2, end[:, None, None], axis=1)[:, 0]  # (N, 2)
    whole_n = jnp.logaddexp(at_end[:, 0], at_end[:, 1])
    whole_n = jnp.where(len_n > 0, whole_n, jnp.where(empty_n, 0.0, NEG_INF))
    psi_nc = jnp.where(cand_nc == eos_id, whole_n[:, None], psi_nc)
    return psi_nc, jnp.stack([rn_nct, rb_nct], axis=-1)
