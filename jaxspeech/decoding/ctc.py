"""CTC decoding.

Greedy: jitted batched argmax on device, collapse on the host.
Prefix beam search: on the host in numpy, one utterance at a time, vectorized per frame,
optionally with a word n-gram LM fused in (`decoding.lm.Fusion`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxspeech.decoding.lm import Fusion


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


class _Beam(NamedTuple):
    """The prefixes kept after a frame, with P parallel entries each (scores in float64, so
    long utterances don't drift)."""

    prefixes: list[tuple[int, ...]]  # P label sequences
    pb: np.ndarray  # (P,) log-prob of the paths that collapse to the prefix and end in blank
    pnb: np.ndarray  # (P,) the same for the paths that end in the prefix's last label
    last: np.ndarray  # (P,) last label of each prefix, -1 for the empty prefix
    ctxs: list  # P LM contexts (with fusion; else None each)
    lm: np.ndarray  # (P,) LM score of each prefix's complete words (0 without fusion)


def _initial_beam(fusion: Fusion | None) -> _Beam:
    """The beam before the first frame: the empty prefix alone, with log-prob 0."""
    pb = np.zeros(1)
    pnb = np.full(1, -np.inf)
    last = np.full(1, -1)
    ctxs = [fusion.start()] if fusion else [None]
    return _Beam([()], pb, pnb, last, ctxs, np.zeros(1))


def _extension_tokens(
    lp_v: np.ndarray, n_top: int, blank_id: int, prune_logp: float | None
) -> np.ndarray:
    """(C,) the labels that may extend prefixes at a frame with (V,) log-probs `lp_v`: its
    `n_top` most probable tokens (all when n_top = V) less blank and, with `prune_logp`, less
    those below it."""
    vocab = lp_v.shape[0]
    if n_top < vocab:
        cand = np.argpartition(-lp_v, n_top - 1)[:n_top]
    else:
        cand = np.arange(vocab)
    cand = cand[cand != blank_id]
    if prune_logp is not None:
        cand = cand[lp_v[cand] >= prune_logp]
    return cand


def _frame_scores(
    hyps: _Beam,
    lp_v: np.ndarray,
    cand_c: np.ndarray,
    blank_id: int,
    fusion: Fusion | None,
    starts_word_v: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One frame's scores for the P prefixes of `hyps` and their C extensions by `cand_c`.

    Returns:
      stay_pb, stay_pnb: (P,) each prefix unchanged, ending in blank / in its last label.
      ext_pc: (P, C) prefix i extended by label cand[c] (which ends in that label).
      lm_pc: (P, C) the LM score of the complete words of each extension.
    """
    tot = np.logaddexp(hyps.pb, hyps.pnb)
    stay_pb = tot + lp_v[blank_id]
    stay_pnb = np.where(hyps.last >= 0, hyps.pnb + lp_v[np.maximum(hyps.last, 0)], -np.inf)
    ext_pc = np.where(cand_c[None, :] == hyps.last[:, None], hyps.pb[:, None], tot[:, None])
    ext_pc = ext_pc + lp_v[cand_c][None, :]
    # A word-starting label completes the prefix's current word: the LM scores it.
    lm_pc = np.broadcast_to(hyps.lm[:, None], ext_pc.shape)
    if fusion and starts_word_v[cand_c].any():
        done = np.array([fusion.word_done(c) for c in hyps.ctxs])
        lm_pc = np.where(starts_word_v[cand_c][None, :], done[:, None], lm_pc)
    return stay_pb, stay_pnb, ext_pc, lm_pc


def _fold_existing(
    prefixes: list[tuple[int, ...]],
    cand_c: np.ndarray,
    col_of_v: np.ndarray,
    stay_pnb: np.ndarray,
    ext_pc: np.ndarray,
) -> None:
    """An extension can land on a prefix already in the beam ("a" + "b" = "ab"): fold those
    into that prefix's (P,) `stay_pnb` and set them to -inf in the (P, C) `ext_pc` (both in
    place), so that every remaining extension is a new, distinct prefix. `col_of_v` (V,): all
    -1, a scratch token -> column map (left all -1 again)."""
    col_of_v[cand_c] = np.arange(cand_c.size)
    index = {p: i for i, p in enumerate(prefixes)}
    for j, q in enumerate(prefixes):
        if q and col_of_v[q[-1]] >= 0:
            i = index.get(q[:-1])
            if i is not None:
                c = col_of_v[q[-1]]
                stay_pnb[j] = np.logaddexp(stay_pnb[j], ext_pc[i, c])
                ext_pc[i, c] = -np.inf
    col_of_v[cand_c] = -1


def _best_candidates(scores_n: np.ndarray, beam: int) -> np.ndarray:
    """Indices of the (up to) `beam` best of the (N,) `scores_n`, best first (ties in index
    order), without the impossible (-inf) ones unless all are."""
    k = min(beam, scores_n.size)
    sel = np.argpartition(-scores_n, k - 1)[:k]
    sel = sel[np.argsort(-scores_n[sel], kind="stable")]
    finite = np.isfinite(scores_n[sel])
    return sel[finite] if finite.any() else sel[:1]


def _next_beam(
    hyps: _Beam,
    sel: np.ndarray,
    cand_c: np.ndarray,
    stay_pb: np.ndarray,
    stay_pnb: np.ndarray,
    ext_pc: np.ndarray,
    lm_pc: np.ndarray,
    fusion: Fusion | None,
) -> _Beam:
    """The beam of the selected candidates `sel`: indices into the P unchanged prefixes, then
    the (P, C) extensions in row-major order (`_frame_scores`' arrays)."""
    n_pref = len(hyps.prefixes)
    new_prefixes, new_pb, new_pnb, new_last, new_ctxs, new_lm = [], [], [], [], [], []
    for s in sel:
        if s < n_pref:
            new_prefixes.append(hyps.prefixes[s])
            new_pb.append(stay_pb[s])
            new_pnb.append(stay_pnb[s])
            new_last.append(hyps.last[s])
            new_ctxs.append(hyps.ctxs[s])
            new_lm.append(hyps.lm[s])
        else:
            i, c = divmod(int(s) - n_pref, cand_c.size)
            tok = int(cand_c[c])
            new_prefixes.append(hyps.prefixes[i] + (tok,))
            new_pb.append(-np.inf)
            new_pnb.append(ext_pc[i, c])
            new_last.append(tok)
            new_ctxs.append(fusion.extend(hyps.ctxs[i], tok) if fusion else None)
            new_lm.append(lm_pc[i, c])
    pb, pnb, last, lm = (np.array(x) for x in (new_pb, new_pnb, new_last, new_lm))
    return _Beam(new_prefixes, pb, pnb, last, new_ctxs, lm)


def _ranked(hyps: _Beam, fusion: Fusion | None) -> list[tuple[list[int], float]]:
    """The final beam's (label sequence, score) pairs, best first; with `fusion` the score
    includes the LM's whole-sequence score (`Fusion.finish`)."""
    tot = np.logaddexp(hyps.pb, hyps.pnb)
    if fusion:
        tot = tot + np.array([fusion.finish(c) for c in hyps.ctxs])
    order = np.argsort(-tot, kind="stable")
    return [(list(hyps.prefixes[i]), float(tot[i])) for i in order]


def ctc_prefix_beam_search(
    logprobs_tv: np.ndarray,
    length: int,
    *,
    beam: int = 8,
    blank_id: int = 0,
    prune_logp: float | None = None,
    fusion: Fusion | None = None,
) -> list[tuple[list[int], float]]:
    """CTC prefix beam search for one utterance, with optional LM shallow fusion.

    Args:
      logprobs_tv: (T, V) log-probabilities (already log-softmaxed).
      length: number of valid frames; frames from `length` on are ignored.
      beam: number of prefixes kept after each frame.
      blank_id: the blank label.
      prune_logp: if given, a token may extend a prefix at frame t only if its log-prob there is
        at least `prune_logp`.
      fusion: a word LM; prefixes are then ranked by their acoustic score plus the LM score
        of their complete words (`Fusion.extend`), and the final ones by their whole fused
        score (`Fusion.finish`).

    Each prefix carries two log-probabilities: of all paths so far that collapse to it and end in
    blank (`pb`) or in its last label (`pnb`). A repeated label therefore extends a prefix only
    from `pb` (paths ending in blank); from `pnb` it stays the same prefix.

    Pruning (what keeps V of a few thousand cheap): at each frame only the `beam` most probable
    tokens (and, with `prune_logp`, only those above it) may *extend* prefixes; blank and the
    repeat of a prefix's own last label, which never create new prefixes, are always scored.
    With `beam >= V`, no `prune_logp` and a beam wide enough to hold every prefix the search is
    exact: each returned score is log P(sequence) summed over all of its CTC paths.

    With fusion the same holds for the fused score: a beam that holds every prefix returns
    the sequence maximizing log P(sequence) + the LM's score of its words.

    Returns:
      Up to `beam` (label sequence, score) pairs, best first; the score is log P(sequence),
      plus the fused LM score with `fusion`.
    """
    lp_tv = np.asarray(logprobs_tv, np.float64)[: int(length)]
    num_frames, vocab = lp_tv.shape
    n_top = min(beam, vocab)
    hyps = _initial_beam(fusion)
    starts_word = np.array(fusion.words.starts_word if fusion else [False] * vocab)
    col_of = np.full(vocab, -1)  # token -> column in this frame's extension matrix
    for t in range(num_frames):
        lp = lp_tv[t]
        cand = _extension_tokens(lp, n_top, blank_id, prune_logp)
        stay_pb, stay_pnb, ext_pc, lm_pc = _frame_scores(
            hyps, lp, cand, blank_id, fusion, starts_word
        )
        _fold_existing(hyps.prefixes, cand, col_of, stay_pnb, ext_pc)
        stay_tot = np.logaddexp(stay_pb, stay_pnb)
        scores = np.concatenate([stay_tot + hyps.lm, (ext_pc + lm_pc).ravel()])
        sel = _best_candidates(scores, beam)
        hyps = _next_beam(hyps, sel, cand, stay_pb, stay_pnb, ext_pc, lm_pc, fusion)
    return _ranked(hyps, fusion)


def ctc_beam_search_batch(
    logprobs_btv: np.ndarray,
    lengths_b: np.ndarray,
    *,
    beam: int = 8,
    blank_id: int = 0,
    prune_logp: float | None = None,
    fusion: Fusion | None = None,
) -> list[list[int]]:
    """Best prefix-beam-search hypothesis of each row of (B, T, V) log-probs (host loop)."""
    logprobs_btv = np.asarray(logprobs_btv)
    kw = dict(beam=beam, blank_id=blank_id, prune_logp=prune_logp, fusion=fusion)
    return [
        ctc_prefix_beam_search(lp_tv, int(n), **kw)[0][0]
        for lp_tv, n in zip(logprobs_btv, np.asarray(lengths_b))
    ]


def collapse_with_frames(
    ids_bt: np.ndarray, lengths_b: np.ndarray, blank_id: int = 0
) -> list[tuple[list[int], list[int]]]:
    """`collapse`, with the frame where each kept label starts: [(labels, frames)] per row."""
    out = []
    for row, n in zip(np.asarray(ids_bt), np.asarray(lengths_b)):
        row = row[: int(n)]
        keep = np.ones(row.shape, bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank_id
        out.append((row[keep].tolist(), np.flatnonzero(keep).tolist()))
    return out


def ctc_align(logprobs_tv: np.ndarray, labels: list[int], blank_id: int = 0) -> list[int]:
    """The frame where each label starts on the most probable CTC path of `labels`
    (Viterbi over the 2U+1 blank-interleaved states), for decoders that give labels
    without times (prefix beam search).

    Raises:
      ValueError: the labels need more frames than there are (no path).
    """
    lp = np.asarray(logprobs_tv, np.float64)
    num_frames, u = lp.shape[0], len(labels)
    if u == 0:
        return []
    ext = np.full(2 * u + 1, blank_id)
    ext[1::2] = labels
    s = ext.size
    # A state may be entered from itself, the one before, or two before when that skips a
    # blank between two different labels.
    skip = np.zeros(s, bool)
    skip[3::2] = ext[3::2] != ext[1:-2:2]
    score = np.full(s, -np.inf)
    if num_frames:
        score[:2] = lp[0, ext[:2]]
    back = np.zeros((num_frames, s), np.int8)  # 0 stay, 1 from s-1, 2 from s-2
    for t in range(1, num_frames):
        prev1 = np.concatenate([[-np.inf], score[:-1]])
        prev2 = np.where(skip, np.concatenate([[-np.inf, -np.inf], score[:-2]]), -np.inf)
        cand = np.stack([score, prev1, prev2])
        back[t] = cand.argmax(axis=0)
        score = cand.max(axis=0) + lp[t, ext]
    end = s - 1 if score[s - 1] >= score[s - 2] else s - 2
    if not np.isfinite(score[end]):
        raise ValueError(f"{u} labels cannot be aligned to {num_frames} frames")
    starts = [0] * u
    state = end
    for t in range(num_frames - 1, -1, -1):
        step = back[t, state] if t > 0 else 0
        if state % 2 == 1 and (t == 0 or step != 0):
            starts[state // 2] = t  # the path enters this label's state at frame t
        state -= step
    return starts
