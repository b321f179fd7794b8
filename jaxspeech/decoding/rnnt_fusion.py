"""RNN-T modified beam search with a word LM fused in, driven from the host.

The same search as `decoding.rnnt.rnnt_modified_beam_search` (per expansion one label or
blank per hypothesis, K best of K x V candidates, equal label sequences merged by
log-add-exp into the best of them; up to max_symbols_per_frame expansions per frame), with
hypotheses ranked by acoustic + LM score (`decoding.lm.Fusion`) and the final ones by their
whole fused score. An n-gram LM's state lives on the host (KenLM), so this loop runs on the
host, one utterance at a time, and calls the model for the joint and the predictor once per
expansion each, on all K hypotheses at once.

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


@dataclasses.dataclass
class _Beam:
    """K hypotheses (rows) of the search: label sequences, the frame of each label,
    acoustic log-probs, LM contexts, and whether each is done with the current frame."""

    seqs: list[tuple[int, ...]]
    frames: list[tuple[int, ...]]
    acoustic: np.ndarray
    ctxs: list[Any]
    done: np.ndarray


def _expand(
    beam: _Beam, logp_kv: np.ndarray, t: int, final: bool, fusion: Fusion, blank_id: int
) -> tuple[_Beam, np.ndarray, np.ndarray, np.ndarray]:
    """One expansion on frame t: the K best of the K x V candidates by acoustic + LM score
    (a hypothesis done with the frame only stays, at the blank's index), equal sequences
    in the same state merged into the best of them. -> (beam, src_k, tok_k, is_label_k)."""
    k, vocab = logp_kv.shape
    stay_v = np.where(np.arange(vocab) == blank_id, 0.0, -np.inf)
    logp_kv = np.where(beam.done[:, None], stay_v, logp_kv)
    lm_k = np.array([c.score for c in beam.ctxs])
    starts = np.array(fusion.words.starts_word)  # labels that begin a word
    # A word-starting label completes the hypothesis' word: the LM scores it.
    done_k = np.array([fusion.word_done(c) for c in beam.ctxs]) if starts.any() else lm_k
    lm_kv = np.where(starts[None, :vocab], done_k[:, None], lm_k[:, None])
    cand_kv = beam.acoustic[:, None] + logp_kv
    rank = (cand_kv + lm_kv).ravel()
    top = np.argsort(-rank, kind="stable")[:k]
    src, tok = top // vocab, top % vocab
    is_label = tok != blank_id
    seqs = [
        beam.seqs[s] + (int(v),) if lab else beam.seqs[s] for s, v, lab in zip(src, tok, is_label)
    ]
    frames = [beam.frames[s] + (t,) if lab else beam.frames[s] for s, lab in zip(src, is_label)]
    done = ~is_label | final
    acoustic = cand_kv.ravel()[top]
    live = np.isfinite(rank[top])
    # Merge equal sequences (done with the frame or not, alike) into the first (best) of
    # them, as the device search does.
    first: dict[tuple[tuple[int, ...], bool], int] = {}
    for r, key in enumerate(zip(seqs, done.tolist())):
        if not live[r]:
            continue
        if key in first:
            f = first[key]
            acoustic[f] = np.logaddexp(acoustic[f], acoustic[r])
            live[r] = False
        else:
            first[key] = r
    ctxs = [
        fusion.extend(beam.ctxs[s], int(v)) if lab else beam.ctxs[s]
        for s, v, lab in zip(src, tok, is_label)
    ]
    acoustic = np.where(live, acoustic, -np.inf)
    return _Beam(seqs, frames, acoustic, ctxs, done), src, tok, is_label


def rnnt_beam_search_fused(
    enc_td: np.ndarray,
    length: int,
    model: PredictorBeam,
    fusion: Fusion,
    *,
    beam: int = 4,
    blank_id: int = 0,
    max_symbols_per_frame: int = 1,
) -> list[Hypothesis]:
    """Fused modified beam search over the first `length` frames of enc_td (T, D), with up
    to `max_symbols_per_frame` labels per frame (expansions of the beam per frame, as in
    `decoding.rnnt.rnnt_modified_beam_search`; a frame ends early once every hypothesis
    is done with it).

    Returns:
      The live hypotheses, best first.
    """
    k = beam
    carry = model.init(k)
    state = _Beam(
        seqs=[()] * k,
        frames=[()] * k,
        acoustic=np.where(np.arange(k) == 0, 0.0, -np.inf),  # one live hypothesis at first
        ctxs=[fusion.start()] * k,
        done=np.zeros(k, bool),
    )
    for t in range(int(length)):
        state.done = np.zeros(k, bool)
        for e in range(max_symbols_per_frame):
            if state.done.all():
                break
            logp_kv = np.asarray(model.logp(carry, enc_td[t]), np.float64)
            final = e == max_symbols_per_frame - 1
            state, src, tok, is_label = _expand(state, logp_kv, t, final, fusion, blank_id)
            carry = model.advance(carry, src.astype(np.int32), tok.astype(np.int32), is_label)
    total = state.acoustic + np.array([fusion.finish(c) for c in state.ctxs])
    order = [r for r in np.argsort(-total, kind="stable") if np.isfinite(total[r])]
    return [Hypothesis(list(state.seqs[r]), float(total[r]), list(state.frames[r])) for r in order]
