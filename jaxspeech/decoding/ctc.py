"""CTC decoding.

Greedy: jitted batched argmax on device, collapse on the host.
Prefix beam search: on the host in numpy, one utterance at a time, vectorized per frame.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def greedy_ids(logits_btv: jax.Array) -> jax.Array:
    """(B, T, V) -> (B, T) int32 best label per frame (jit-friendly)."""
    return jnp.argmax(logits_btv, axis=-1).astype(jnp.int32)


def collapse(ids_bt: np.ndarray, lengths_b: np.ndarray, blank_id: int = 0) -> list[list[int]]:
    """Merge repeats, then drop blanks, within each row's valid frames."""
    out = []
    for row, n in zip(np.asarray(ids_bt), np.asarray(lengths_b)):
        row = row[: int(n)]
        if row.size == 0:
            out.append([])
            continue
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank_id
        out.append(row[keep].tolist())
    return out


def ctc_prefix_beam_search(
    logprobs_tv: np.ndarray,
    length: int,
    *,
    beam: int = 8,
    blank_id: int = 0,
    prune_logp: float | None = None,
) -> list[tuple[list[int], float]]:
    """CTC prefix beam search for one utterance.

    Args:
      logprobs_tv: (T, V) log-probabilities (already log-softmaxed).
      length: number of valid frames; frames from `length` on are ignored.
      beam: number of prefixes kept after each frame.
      blank_id: the blank label.
      prune_logp: if given, a token may extend a prefix at frame t only if its log-prob there is
        at least `prune_logp`.

    Each prefix carries two log-probabilities: of all paths so far that collapse to it and end in
    blank (`pb`) or in its last label (`pnb`). A repeated label therefore extends a prefix only
    from `pb` (paths ending in blank); from `pnb` it stays the same prefix.

    Pruning (what keeps V of a few thousand cheap): at each frame only the `beam` most probable
    tokens (and, with `prune_logp`, only those above it) may *extend* prefixes; blank and the
    repeat of a prefix's own last label, which never create new prefixes, are always scored.
    With `beam >= V`, no `prune_logp` and a beam wide enough to hold every prefix the search is
    exact: each returned score is log P(sequence) summed over all of its CTC paths.

    Returns:
      Up to `beam` (label sequence, log P(sequence)) pairs, best first.
    """
    lp_tv = np.asarray(logprobs_tv, np.float64)[: int(length)]
    num_frames, vocab = lp_tv.shape
    n_top = min(beam, vocab)
    # The beam: prefixes (tuples) and parallel arrays, float64 so long utterances don't drift.
    prefixes: list[tuple[int, ...]] = [()]
    pb = np.zeros(1)
    pnb = np.full(1, -np.inf)
    last = np.full(1, -1)  # last label of each prefix, -1 for the empty prefix
    col_of = np.full(vocab, -1)  # token -> column in this frame's extension matrix
    for t in range(num_frames):
        lp = lp_tv[t]
        if n_top < vocab:
            cand = np.argpartition(-lp, n_top - 1)[:n_top]
        else:
            cand = np.arange(vocab)
        cand = cand[cand != blank_id]
        if prune_logp is not None:
            cand = cand[lp[cand] >= prune_logp]
        tot = np.logaddexp(pb, pnb)
        stay_pb = tot + lp[blank_id]
        stay_pnb = np.where(last >= 0, pnb + lp[np.maximum(last, 0)], -np.inf)
        # ext_pc[i, c]: prefix i extended by label cand[c] (which ends in that label).
        ext_pc = np.where(cand[None, :] == last[:, None], pb[:, None], tot[:, None])
        ext_pc = ext_pc + lp[cand][None, :]
        # An extension can land on a prefix already in the beam ("a" + "b" = "ab"): fold those
        # into that prefix's pnb so that every remaining extension is a new, distinct prefix.
        col_of[cand] = np.arange(cand.size)
        index = {p: i for i, p in enumerate(prefixes)}
        for j, q in enumerate(prefixes):
            if q and col_of[q[-1]] >= 0:
                i = index.get(q[:-1])
                if i is not None:
                    c = col_of[q[-1]]
                    stay_pnb[j] = np.logaddexp(stay_pnb[j], ext_pc[i, c])
                    ext_pc[i, c] = -np.inf
        col_of[cand] = -1
        stay_tot = np.logaddexp(stay_pb, stay_pnb)
        scores = np.concatenate([stay_tot, ext_pc.ravel()])
        k = min(beam, scores.size)
        sel = np.argpartition(-scores, k - 1)[:k]
        sel = sel[np.argsort(-scores[sel], kind="stable")]
        finite = np.isfinite(scores[sel])
        sel = sel[finite] if finite.any() else sel[:1]
        n_pref = len(prefixes)
        new_prefixes, new_pb, new_pnb, new_last = [], [], [], []
        for s in sel:
            if s < n_pref:
                new_prefixes.append(prefixes[s])
                new_pb.append(stay_pb[s])
                new_pnb.append(stay_pnb[s])
                new_last.append(last[s])
            else:
                i, c = divmod(int(s) - n_pref, cand.size)
                tok = int(cand[c])
                new_prefixes.append(prefixes[i] + (tok,))
                new_pb.append(-np.inf)
                new_pnb.append(ext_pc[i, c])
                new_last.append(tok)
        prefixes = new_prefixes
        pb, pnb, last = np.array(new_pb), np.array(new_pnb), np.array(new_last)
    tot = np.logaddexp(pb, pnb)
    order = np.argsort(-tot, kind="stable")
    return [(list(prefixes[i]), float(tot[i])) for i in order]


def ctc_beam_search_batch(
    logprobs_btv: np.ndarray,
    lengths_b: np.ndarray,
    *,
    beam: int = 8,
    blank_id: int = 0,
    prune_logp: float | None = None,
) -> list[list[int]]:
    """Best prefix-beam-search hypothesis of each row of (B, T, V) log-probs (host loop)."""
    logprobs_btv = np.asarray(logprobs_btv)
    return [
        ctc_prefix_beam_search(lp_tv, int(n), beam=beam, blank_id=blank_id, prune_logp=prune_logp)[
            0
        ][0]
        for lp_tv, n in zip(logprobs_btv, np.asarray(lengths_b))
    ]
