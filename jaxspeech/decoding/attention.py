"""Decoding with the attention decoder (`model.head = "ctc+aed"` or `"aed"`): the host half.

- `beam_search`: attention beam search, one step per output label for a whole batch of
  utterances at once (the decoder runs on all B * beam hypotheses in one call), with
  length normalization, an end-of-sentence threshold, and optionally the joint CTC prefix
  score (one-pass joint CTC/attention decoding: Watanabe et al. 2017, ESPnet's default)
  and word n-gram LM shallow fusion (`decoding.lm.Fusion`, as the CTC and RNN-T beams).
- `rescore`: attention rescoring of a CTC prefix beam's n-best (WeNet's two-pass
  decoding): the decoder scores every hypothesis by teacher forcing, in one batch.

The model's side (the decoder's cached step, the CTC prefix scorer) comes through small
interfaces (`AttentionScorer`, `CTCScorer`), so the search is tested with exact stand-ins
against brute force (tests/decoding/test_attention_search.py); `decoding.attention_device`
runs them on a device.

A hypothesis' score: (1 - w) * log P_att(prefix) + w * log P_ctc(prefix is a prefix of the
output) + the LM's fused score of its complete words, w = the CTC weight; when it ends
(<eos>): the attention's log P(<eos> | prefix), the CTC's log P(output = prefix) and the
LM's end of sentence complete it, and with length normalization the sum is divided by
the number of labels + 1 (<eos>).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from jaxspeech.decoding.lm import Fusion

# End detection (with max_len_ratio = 0): an utterance's search stops once, for each of
# the last END_LENGTHS lengths, the best hypothesis that ended at that length scored
# END_MARGIN (natural log) or more below the best ended one: longer ones will not win.
# ESPnet's criterion for its maxlenratio = 0, with its constants.
END_LENGTHS, END_MARGIN = 3, 10.0
# The joint decoding's CTC weight with a CTC head (ESPnet's decoding default) and the
# end-of-sentence threshold (Chiu et al. 2018's); config.decoding overrides both.
CTC_WEIGHT, EOS_THRESHOLD = 0.3, 1.5


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How `beam_search` ranks and stops (config.decoding's keys of the same names).

    beam: hypotheses kept per utterance after each label.
    ctc_weight: w in [0, 1] (0: attention and LM alone; needs a CTC scorer when > 0).
    length_norm: rank ended hypotheses by score / (labels + 1).
    eos_threshold: <eos> may end a hypothesis only where its attention log-prob is at
      least eos_threshold times the best other label's (log-probs are <= 0, so a
      threshold of 1.5 admits <eos> up to 1.5x less likely in log terms; Chiu et al.
      2018); 0 = always. A hypothesis at the maximum length always may.
    max_len_ratio: at most ceil(ratio * frames) labels, no end detection; 0 = at most
      `frames` labels, with end detection (`END_LENGTHS`).
    pre_beam: labels per hypothesis scored each step (the attention's best, <eos> always
      among them); 0 = ceil(1.5 * beam) (ESPnet's pre-beam).
    """

    beam: int = 4
    ctc_weight: float = CTC_WEIGHT
    length_norm: bool = True
    eos_threshold: float = EOS_THRESHOLD
    max_len_ratio: float = 0.0
    pre_beam: int = 0


class AttentionScorer(Protocol):
    """The decoder over B utterances' hypotheses, rows n = b * beam + k (N = B * beam)."""

    def start(self) -> tuple[np.ndarray, np.ndarray | None]:
        """-> (N, V) log-probs of the first label after <sos>, and (N, T) attention weights
        over the frames (or None)."""

    def step(
        self, src_n: np.ndarray, tokens_n: np.ndarray, pos: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Row n now extends row src_n[n]'s prefix by tokens_n[n] (at position `pos`) ->
        the same as `start` for the extended prefixes."""


class CTCScorer(Protocol):
    """CTC prefix scores of the same rows (`decoding.ctc_prefix`)."""

    def start(self) -> None:
        """Every row's prefix is empty."""

    def score(self, cand_nc: np.ndarray) -> np.ndarray:
        """(N, C) candidate labels -> (N, C) prefix scores psi of each prefix + candidate
        (for <eos>: of the prefix as the whole output)."""

    def keep(self, src_n: np.ndarray, col_n: np.ndarray) -> None:
        """Row n now holds row src_n[n]'s prefix extended by its candidate col_n[n] of the
        last `score`."""


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """An ended hypothesis: its labels, their frames (from the attention weights; None
    without them), its ranking score, and the score's parts (unnormalized)."""

    labels: list[int]
    frames: list[int] | None
    score: float
    att: float
    ctc: float
    lm: float


def max_lengths(frames_b: np.ndarray, options: SearchOptions, with_ctc: bool) -> np.ndarray:
    """(B,) encoder frames -> (B,) the most labels a hypothesis may have: `frames` (CTC
    cannot emit more labels than frames), or ceil(max_len_ratio * frames) when set."""
    frames_b = np.asarray(frames_b, np.int64)
    if options.max_len_ratio <= 0:
        return frames_b
    limit = np.maximum(1, np.ceil(options.max_len_ratio * frames_b)).astype(np.int64)
    return np.minimum(limit, frames_b) if with_ctc else limit


@dataclasses.dataclass
class _Rows:
    """The N running hypotheses (host side); an inactive row has prefix None."""

    prefixes: list[tuple[int, ...] | None]
    frames: list[tuple[int, ...] | None]
    att: np.ndarray  # (N,) attention log-prob of the prefix
    ctc: np.ndarray  # (N,) CTC prefix score psi of the prefix
    lm: np.ndarray  # (N,) fused LM score of its complete words
    ctxs: list  # N LM contexts (None without fusion)

    @classmethod
    def initial(cls, n: int, beam: int, fusion: Fusion | None) -> _Rows:
        first = np.arange(n) % beam == 0  # one empty hypothesis per utterance
        ctx = fusion.start() if fusion else None
        return cls(
            [() if f else None for f in first],
            [() if f else None for f in first],
            np.zeros(n),
            np.zeros(n),
            np.zeros(n),
            [ctx] * n,
        )

    @classmethod
    def empty(cls, n: int) -> _Rows:
        return cls([None] * n, [None] * n, np.zeros(n), np.zeros(n), np.zeros(n), [None] * n)

    def active(self) -> np.ndarray:
        return np.array([p is not None for p in self.prefixes])


def _candidates(att_nv: np.ndarray, width: int, eos: int) -> np.ndarray:
    """(N, V) log-probs -> (N, C) the `width` best labels other than <eos>, then <eos>
    (always a candidate: it is what ends a hypothesis)."""
    scores = att_nv.copy()
    scores[:, eos] = -np.inf
    width = min(width, scores.shape[1] - 1)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :width]
    return np.concatenate([top, np.full((len(top), 1), eos)], axis=1)


def _lm_scores(rows: _Rows, cand_nc: np.ndarray, fusion: Fusion | None) -> np.ndarray:
    """(N, C) the fused LM score of each extension's complete words: unchanged, or with
    the current word scored when the candidate starts a new word, or the whole sentence's
    for <eos> (the last column)."""
    lm_nc = np.repeat(rows.lm[:, None], cand_nc.shape[1], axis=1)
    if fusion is None:
        return lm_nc
    starts = np.array(fusion.words.starts_word)[cand_nc]
    for n, ctx in enumerate(rows.ctxs):
        if rows.prefixes[n] is None:
            continue
        if starts[n, :-1].any():
            lm_nc[n, :-1] = np.where(starts[n, :-1], fusion.word_done(ctx), rows.lm[n])
        lm_nc[n, -1] = fusion.finish(ctx)
    return lm_nc


def _allowed(
    att_nv: np.ndarray, cand_nc: np.ndarray, at_max_n: np.ndarray, eos: int, threshold: float
) -> np.ndarray:
    """(N, C) which extensions may be taken: only <eos> at the maximum length; <eos>
    elsewhere only past the end-of-sentence threshold (`SearchOptions`)."""
    ok = np.ones(cand_nc.shape, bool)
    ok[at_max_n, :-1] = False
    if threshold > 0:
        others = att_nv.copy()
        others[:, eos] = -np.inf
        ok[:, -1] = (att_nv[:, eos] >= threshold * others.max(axis=1)) | at_max_n
    return ok


def _should_stop(
    ended: list[Hypothesis],
    best_running: float,
    step: int,
    max_len: int,
    exact_bound: bool,
    options: SearchOptions,
) -> bool:
    """Whether an utterance's search may stop after `step` labels with running hypotheses
    left: when none of them can beat the best ended one (`exact_bound`: every later score
    part is <= 0), or by end detection (`END_LENGTHS`; with max_len_ratio = 0)."""
    if not ended:
        return False
    best = max(h.score for h in ended)
    if exact_bound:
        # A running prefix's score only falls; normalized by at most max_len + 1 labels.
        bound = best_running / (max_len + 1) if options.length_norm else best_running
        if bound < best:
            return True
    if options.max_len_ratio > 0:
        return False
    raw = lambda h: h.att + h.ctc + h.lm  # noqa: E731 (unnormalized: parts are weighted)
    top = max(raw(h) for h in ended)
    for length in range(step, step - END_LENGTHS, -1):
        same = [raw(h) for h in ended if len(h.labels) == length]
        if not same or max(same) - top >= -END_MARGIN:
            return False
    return True


@dataclasses.dataclass
class _Step:
    """One label step's scores of the N rows' C candidates (`beam_search`)."""

    cand: np.ndarray  # (N, C) candidate labels, <eos> last
    total: np.ndarray  # (N, C) the extension's score; -inf where not allowed
    att: np.ndarray  # (N, C) its attention log-prob (unweighted)
    ctc: np.ndarray  # (N, C) its CTC prefix score (unweighted)
    lm: np.ndarray  # (N, C) its fused LM score
    frame: np.ndarray | None  # (N,) the frame each row's step attended most (or None)


@dataclasses.dataclass
class _Next:
    """The rows after a step: their hypotheses and where each came from (`AttentionScorer.
    step`'s src and tokens, `CTCScorer.keep`'s src and col)."""

    rows: _Rows
    src: np.ndarray
    col: np.ndarray
    tokens: np.ndarray

    @classmethod
    def empty(cls, n: int) -> _Next:
        zeros = lambda: np.zeros(n, np.int64)  # noqa: E731
        return cls(_Rows.empty(n), zeros(), zeros(), zeros())


def _advance(
    b: int,
    beam: int,
    step: _Step,
    rows: _Rows,
    nxt: _Next,
    ended: list[Hypothesis],
    w: float,
    options: SearchOptions,
    fusion: Fusion | None,
) -> float | None:
    """Utterance b's best `beam` extensions: those ending in <eos> join `ended`, the others
    become its rows of `nxt`. Returns the best running score (None: nothing runs on)."""
    width = step.cand.shape[1]
    block = step.total[b * beam : (b + 1) * beam].ravel()
    order = np.argsort(-block, kind="stable")[:beam]
    kept, best = 0, None
    for s in order[np.isfinite(block[order])]:
        r, c = b * beam + s // width, s % width
        labels = rows.prefixes[r]
        times = None if step.frame is None else rows.frames[r] + (int(step.frame[r]),)
        raw = float(step.total[r, c])
        if c == width - 1:  # <eos>
            score = raw / (len(labels) + 1) if options.length_norm else raw
            parts = ((1 - w) * step.att[r, c], w * step.ctc[r, c], step.lm[r, c])
            frames = None if times is None else list(times[:-1])
            ended.append(Hypothesis(list(labels), frames, score, *map(float, parts)))
            continue
        k, tok = b * beam + kept, int(step.cand[r, c])
        kept += 1
        best = raw if best is None else max(best, raw)
        nxt.src[k], nxt.col[k], nxt.tokens[k] = r, c, tok
        new = nxt.rows
        new.prefixes[k], new.frames[k] = labels + (tok,), times
        new.att[k], new.ctc[k], new.lm[k] = step.att[r, c], step.ctc[r, c], step.lm[r, c]
        new.ctxs[k] = fusion.extend(rows.ctxs[r], tok) if fusion else None
    return best


def beam_search(
    att: AttentionScorer,
    ctc: CTCScorer | None,
    frames_b: np.ndarray,
    options: SearchOptions,
    *,
    eos: int,
    fusion: Fusion | None = None,
) -> list[list[Hypothesis]]:
    """Attention beam search over B utterances of (B,) encoder `frames_b` (see the module
    docstring for the score). `att` and `ctc` hold B * options.beam rows.

    With a beam that holds every hypothesis (beam and pre_beam at least the number of
    label sequences up to the maximum length), the best returned hypothesis is the one
    that maximizes the score over all label sequences (tests: brute force).

    Returns:
      Per utterance its ended hypotheses, best first (at least one: every hypothesis
      still running at the maximum length ends there).
    """
    beam, w = options.beam, float(options.ctc_weight)
    if w > 0 and ctc is None:
        raise ValueError("ctc_weight > 0 needs a CTC scorer")
    num_utts = len(frames_b)
    n = num_utts * beam
    max_len = max_lengths(frames_b, options, ctc is not None and w > 0)
    utt_n = np.arange(n) // beam
    width = options.pre_beam or math.ceil(1.5 * beam)
    exact_bound = fusion is None or fusion.word_bonus <= 0
    rows = _Rows.initial(n, beam, fusion)
    ended: list[list[Hypothesis]] = [[] for _ in range(num_utts)]
    done = np.zeros(num_utts, bool)
    att_nv, align_nt = att.start()
    if w > 0:
        ctc.start()
    for u in range(int(max_len.max(initial=0)) + 1):
        cand = _candidates(att_nv, width, eos)
        psi = ctc.score(cand) if w > 0 else np.zeros(cand.shape)
        lm_nc = _lm_scores(rows, cand, fusion)
        att_nc = rows.att[:, None] + np.take_along_axis(att_nv, cand, axis=1)
        total = (1 - w) * att_nc + w * psi + lm_nc
        ok = _allowed(att_nv, cand, u >= max_len[utt_n], eos, options.eos_threshold)
        total = np.where(ok & rows.active()[:, None], total, -np.inf)
        frame_n = align_nt.argmax(axis=1) if align_nt is not None else None
        step = _Step(cand, total, att_nc, psi, lm_nc, frame_n)
        nxt = _Next.empty(n)
        for b in np.flatnonzero(~done):
            best = _advance(b, beam, step, rows, nxt, ended[b], w, options, fusion)
            stop = best is None or _should_stop(
                ended[b], best, u, int(max_len[b]), exact_bound, options
            )
            if stop:
                done[b] = True
                nxt.rows.prefixes[b * beam : (b + 1) * beam] = [None] * beam
        rows = nxt.rows
        if done.all():
            break
        att_nv, align_nt = att.step(nxt.src, nxt.tokens, u + 1)
        if w > 0:
            ctc.keep(nxt.src, nxt.col)
    for hyps in ended:
        hyps.sort(key=lambda h: -h.score)
        if not hyps:  # nothing could end (impossible CTC prefixes only): say so, empty
            hyps.append(Hypothesis([], [] if align_nt is not None else None, -math.inf, 0, 0, 0))
    return ended


def lm_score(labels: list[int], fusion: Fusion | None) -> float:
    """The fused LM score of a whole label sequence (0 without fusion)."""
    if fusion is None:
        return 0.0
    ctx = fusion.start()
    for tok in labels:
        ctx = fusion.extend(ctx, tok)
    return fusion.finish(ctx)


def rescore(
    nbest: list[list[tuple[list[int], float]]],
    att_scores: Callable[[np.ndarray, list[list[int]]], np.ndarray],
    ctc_weight: float,
    fusion: Fusion | None = None,
) -> list[Hypothesis]:
    """Attention rescoring (WeNet): each utterance's CTC n-best, [(labels, CTC beam score
    incl. the fused LM's)], re-ranked by (1 - w) * log P_att(labels + <eos>) + w * log
    P_ctc(labels) + the LM's score. `att_scores(utt_m, labels_m)` scores M hypotheses of
    utterances utt_m (M,) in one batch -> (M,)."""
    utt = np.array([b for b, hyps in enumerate(nbest) for _ in hyps], np.int64)
    labels = [list(y) for hyps in nbest for y, _ in hyps]
    att = att_scores(utt, labels) if labels else np.zeros(0)
    best: list[Hypothesis] = []
    i = 0
    for hyps in nbest:
        cands = []
        for y, fused in hyps:
            lm = lm_score(y, fusion)
            a, c = (1 - ctc_weight) * float(att[i]), ctc_weight * (fused - lm)
            cands.append(Hypothesis(list(y), None, a + c + lm, a, c, lm))
            i += 1
        empty = Hypothesis([], None, 0.0, 0.0, 0.0, 0.0)
        best.append(max(cands, key=lambda h: h.score) if cands else empty)
    return best
