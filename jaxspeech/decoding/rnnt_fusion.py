"""RNN-T modified beam search with a word LM fused in, driven from the host.

The same search as `decoding.rnnt.rnnt_modified_beam_search` (one label or blank per frame
and hypothesis, K best of K x V candidates, equal label sequences merged by log-add-exp
into the best of them), with hypotheses ranked by acoustic + LM score (`decoding.lm.Fusion`)
and the final ones by their whole fused score. An n-gram LM's state lives on the host
(KenLM), so this loop runs on the host, one utterance at a time, and calls the model for the
joint and the predictor once per frame each, on all K hypotheses at once.

The model enters as a `PredictorBeam` of three functions over an opaque device carry
(predictor state and projected output of K rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from jaxspeech.decoding.lm import Fusion


@dataclasses.dataclass(frozen=True)
class PredictorBeam:
    """The model side of the search.

    init(k) -> carry: k rows whose history is "blank" (start of sequence).
    logp(carry, enc_d) -> (k, V) float log-softmax of the joint of frame enc_d (D,) with
      each row's predictor output.
    advance(carry, src_k, tokens_k, label_k) -> carry: row r becomes row src_k[r], stepped
      with tokens_k[r] where label_k[r].
    """

    init: Callable[[int], Any]
    logp: Callable[[Any, np.ndarray], np.ndarray]
    advance: Callable[[Any, np.ndarray, np.ndarray, np.ndarray], Any]


class Hypothesis(NamedTuple):
    tokens: list[int]
    score: float  # acoustic log-prob + fused LM score
    frames: list[int]  # the frame each token was emitted at


def rnnt_beam_search_fused(
    enc_td: np.ndarray,
    length: int,
    model: PredictorBeam,
    fusion: Fusion,
    *,
    beam: int = 4,
    blank_id: int = 0,
) -> list[Hypothesis]:
    """Fused modified beam search over the first `length` frames of enc_td (T, D).

    Returns:
      The live hypotheses, best first.
    """
    k = beam
    carry = model.init(k)
    seqs: list[tuple[int, ...]] = [()] * k
    frames: list[tuple[int, ...]] = [()] * k
    acoustic = np.where(np.arange(k) == 0, 0.0, -np.inf)  # one live hypothesis at first
    ctxs = [fusion.start()] * k
    starts = np.array(fusion.words.starts_word)  # labels that begin a word
    for t in range(int(length)):
        logp_kv = np.asarray(model.logp(carry, enc_td[t]), np.float64)
        vocab = logp_kv.shape[1]
        lm_k = np.array([c.score for c in ctxs])
        # A word-starting label completes the hypothesis' word: the LM scores it.
        done_k = np.array([fusion.word_done(c) for c in ctxs]) if starts.any() else lm_k
        lm_kv = np.where(starts[None, :vocab], done_k[:, None], lm_k[:, None])
        cand_kv = acoustic[:, None] + logp_kv
        rank = (cand_kv + lm_kv).ravel()
        top = np.argsort(-rank, kind="stable")[:k]
        src, tok = top // vocab, top % vocab
        is_label = tok != blank_id
        new_seqs = [
            seqs[s] + (int(v),) if lab else seqs[s] for s, v, lab in zip(src, tok, is_label)
        ]
        frames = [frames[s] + (t,) if lab else frames[s] for s, lab in zip(src, is_label)]
        new_acoustic = cand_kv.ravel()[top]
        live = np.isfinite(rank[top])
        # Merge equal sequences into the first (best) of them, as the device search does.
        first: dict[tuple[int, ...], int] = {}
        for r, q in enumerate(new_seqs):
            if not live[r]:
                continue
            if q in first:
                f = first[q]
                new_acoustic[f] = np.logaddexp(new_acoustic[f], new_acoustic[r])
                live[r] = False
            else:
                first[q] = r
        new_acoustic = np.where(live, new_acoustic, -np.inf)
        ctxs = [
            fusion.extend(ctxs[s], int(v)) if lab else ctxs[s]
            for s, v, lab in zip(src, tok, is_label)
        ]
        carry = model.advance(carry, src.astype(np.int32), tok.astype(np.int32), is_label)
        seqs, acoustic = new_seqs, new_acoustic
    total = acoustic + np.array([fusion.finish(c) for c in ctxs])
    order = [r for r in np.argsort(-total, kind="stable") if np.isfinite(total[r])]
    return [Hypothesis(list(seqs[r]), float(total[r]), list(frames[r])) for r in order]
