"""Attention decoding (jaxspeech.decoding.attention, ctc_prefix, attention_device) against
brute force: CTC prefix scores against the sum over every CTC path; the beam search, with
a beam that holds every hypothesis, against the best of every label sequence under the
same score (attention, CTC prefix scores, LM fusion, length normalization, the <eos>
threshold); attention rescoring against its formula; the decoder's cached device step
against its whole-prefix forward pass."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.decoding import attention, attention_device, ctc_prefix
from jaxspeech.decoding.lm import Fusion, TokenWords
from jaxspeech.models.decoder import AttentionDecoder
from tests.decoding.test_lm_fusion import CHAR_PIECES, BigramLM

EOS = 0  # the decoder's <sos>/<eos> is the CTC blank (jaxspeech.models.decoder.SOS_EOS)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _collapse(path) -> tuple[int, ...]:
    out, prev = [], None
    for s in path:
        if s != prev and s != 0:
            out.append(int(s))
        prev = s
    return tuple(out)


def _ctc_outputs(lp_tv: np.ndarray) -> dict[tuple[int, ...], float]:
    """Every output label sequence -> its log-probability, summed over all V^T paths."""
    probs: dict[tuple[int, ...], float] = {}
    t, v = lp_tv.shape
    for path in itertools.product(range(v), repeat=t):
        y = _collapse(path)
        probs[y] = np.logaddexp(probs.get(y, -np.inf), sum(lp_tv[i, s] for i, s in enumerate(path)))
    return probs


def _prefix_logp(outputs: dict, prefix: tuple[int, ...]) -> float:
    terms = [p for y, p in outputs.items() if y[: len(prefix)] == prefix]
    return float(np.logaddexp.reduce(terms)) if terms else -np.inf


@pytest.mark.parametrize("seed", [0, 1])
def test_prefix_scores_equal_the_sum_over_every_ctc_path(seed):
    rng = np.random.default_rng(seed)
    t, v, valid = 6, 4, 5  # the last frame is padding
    lp = _log_softmax(rng.normal(size=(t, v)) * 2)
    outputs = _ctc_outputs(lp[:valid])
    prefixes = [(), (1,), (2, 2), (3, 1, 3)]
    logp, utt, n = jnp.asarray(lp[None]), jnp.zeros(1, jnp.int32), jnp.array([valid])
    for prefix in prefixes:
        r, last = ctc_prefix.initial_state(logp, utt, 0), jnp.array([-1])
        for tok in prefix:  # walk the states along the prefix
            _, r_new = ctc_prefix.prefix_scores(
                r, last, logp, utt, n, jnp.array([[tok]]), blank_id=0, eos_id=EOS
            )
            r, last = r_new[:, 0], jnp.array([tok])
        cand = jnp.array([[0, 1, 2, 3]])
        psi, _ = ctc_prefix.prefix_scores(r, last, logp, utt, n, cand, blank_id=0, eos_id=EOS)
        want = [outputs.get(prefix, -np.inf)] + [
            _prefix_logp(outputs, prefix + (c,)) for c in (1, 2, 3)
        ]
        np.testing.assert_allclose(np.asarray(psi[0]), want, atol=1e-4)


class TableAttention:
    """A stand-in decoder: each prefix's next-label log-probs drawn from its own seed (V
    labels, <eos> = 0), rows tracked like the real cache (`attention.AttentionScorer`)."""

    def __init__(self, rows: int, vocab: int, seed: int, beam: int, peak: float = 1.5):
        self.rows, self.vocab, self.seed, self.beam, self.peak = rows, vocab, seed, beam, peak
        self.steps = 0

    def logp(self, prefix: tuple[int, ...], utt: int = 0) -> np.ndarray:
        rng = np.random.default_rng([self.seed, utt, len(prefix), *prefix])
        return _log_softmax(rng.normal(size=self.vocab) * self.peak)

    def _out(self):
        return np.stack([self.logp(p, n // self.beam) for n, p in enumerate(self.prefixes)]), None

    def start(self):
        self.prefixes = [()] * self.rows
        return self._out()

    def step(self, src, tokens, pos):
        self.steps += 1
        self.prefixes = [self.prefixes[s] + (int(t),) for s, t in zip(src, tokens)]
        assert all(len(p) == pos for p in self.prefixes)
        return self._out()


def _brute_force(att, lp_tv, frames, options, fusion, max_len, utt=0):
    """The best (labels, score) over every label sequence of up to max_len labels."""
    w = options.ctc_weight
    outputs = _ctc_outputs(lp_tv[:frames]) if w > 0 else {}
    best = (None, -np.inf)
    labels = range(1, att.vocab)
    for n in range(max_len + 1):
        for y in itertools.product(labels, repeat=n):
            a = sum(att.logp(y[:i], utt)[y[i]] for i in range(n))
            end = att.logp(y, utt)
            if options.eos_threshold > 0 and n < max_len:
                if end[EOS] < options.eos_threshold * np.delete(end, EOS).max():
                    continue  # <eos> not allowed here: y cannot end
            a += end[EOS]
            c = outputs.get(y, -np.inf) if w > 0 else 0.0
            lm = attention.lm_score(list(y), fusion)
            score = (1 - w) * a + w * c + lm
            if options.length_norm:
                score /= n + 1
            if score > best[1]:
                best = (list(y), score)
    return best


def _fusion(weight=0.8, bonus=0.5):
    lm = BigramLM({("<s>", "ab"): 5.0, ("ab", "b"): 4.0})
    return Fusion(lm, TokenWords.from_pieces(CHAR_PIECES, sentencepiece=False), weight, bonus)


@pytest.mark.parametrize(
    "ctc_weight,length_norm,eos_threshold,with_lm",
    [
        (0.0, False, 0.0, False),  # attention alone
        (0.3, False, 0.0, False),  # joint CTC/attention
        (0.5, True, 0.0, True),  # with length normalization and the LM (bonus > 0)
        (0.3, True, 1.2, False),  # the <eos> threshold
        (0.0, True, 1.2, True),
    ],
)
def test_a_beam_holding_every_hypothesis_returns_the_brute_force_best(
    ctc_weight, length_norm, eos_threshold, with_lm
):
    vocab, frames = len(CHAR_PIECES), (4, 3)  # two utterances of different lengths
    beam = (vocab - 1) ** max(frames)  # every prefix of up to 4 labels fits
    rng = np.random.default_rng(7)
    lp = _log_softmax(rng.normal(size=(2, max(frames), vocab)) * 2)
    opts = attention.SearchOptions(
        beam=beam,
        ctc_weight=ctc_weight,
        length_norm=length_norm,
        eos_threshold=eos_threshold,
        max_len_ratio=1.0,
        pre_beam=vocab,
    )
    fusion = _fusion() if with_lm else None
    att = TableAttention(2 * beam, vocab, seed=3, beam=beam)
    ctc = None
    if ctc_weight > 0:
        ctc = attention_device.CTCPrefixScorer(lp, np.array(frames), beam, blank_id=0, eos=EOS)
    got = attention.beam_search(att, ctc, np.array(frames), opts, eos=EOS, fusion=fusion)
    for b, n in enumerate(frames):
        want_labels, want_score = _brute_force(att, lp[b], n, opts, fusion, n, utt=b)
        assert got[b][0].labels == want_labels, (b, got[b][0], want_labels, want_score)
        assert got[b][0].score == pytest.approx(want_score, abs=1e-4)


def test_end_detection_stops_early_and_keeps_the_best_of_the_same_search_run_to_the_end():
    vocab, frames, beam = len(CHAR_PIECES), np.array([40]), 3
    results = {}
    for ratio in (0.0, 1.0):  # 0: end detection; 1: up to 40 labels, no end detection
        att = TableAttention(beam, vocab, seed=5, beam=beam, peak=4.0)  # a confident model
        opts = attention.SearchOptions(
            beam=beam, ctc_weight=0.0, eos_threshold=0, max_len_ratio=ratio
        )
        results[ratio] = (attention.beam_search(att, None, frames, opts, eos=EOS)[0], att.steps)
    (detected, steps), (full, full_steps) = results[0.0], results[1.0]
    assert detected[0] == full[0]
    assert steps <= full_steps
    assert [h.score for h in full] == sorted((h.score for h in full), reverse=True)


def _ended(length: int, score: float) -> attention.Hypothesis:
    return attention.Hypothesis([1] * length, None, score, score, 0.0, 0.0)


def test_end_detection_fires_once_the_last_three_lengths_ended_far_behind_the_best():
    opts = attention.SearchOptions(length_norm=False)
    far = [_ended(4, -2.0), _ended(10, -13.0), _ended(11, -14.0), _ended(12, -12.5)]

    def stop(ended, step, o=opts):  # running hypotheses at -1.0; no exact bound
        return attention._should_stop(ended, -1.0, step, 40, False, o)

    assert stop(far, 12)
    assert not stop(far, 13)  # nothing ended at 13 labels: keep going
    assert not stop(far[:2] + far[3:], 12)  # nor at 11
    assert not stop(far[:3] + [_ended(12, -11.0)], 12)  # 12 labels ended within the margin
    assert not stop(far, 12, attention.SearchOptions(max_len_ratio=1.0))  # no end detection
    # The exact bound: no running hypothesis can catch up with the best ended one.
    assert attention._should_stop(far[:1], -3.0, 5, 40, True, opts)
    assert not attention._should_stop(far[:1], -1.0, 5, 40, True, opts)


def test_rescoring_ranks_the_n_best_by_the_weighted_scores():
    fusion = _fusion()
    nbest = [
        [
            ([2, 3], -1.0 + attention.lm_score([2, 3], fusion)),
            ([2], -1.5 + attention.lm_score([2], fusion)),
        ],
        [],
    ]
    att_table = {(2, 3): -4.0, (2,): -0.5}

    def att_scores(utt, labels):
        assert list(utt) == [0, 0]
        return np.array([att_table[tuple(y)] for y in labels])

    for w, want in ((0.9, [2, 3]), (0.1, [2])):
        best = attention.rescore(nbest, att_scores, w, fusion)
        assert best[0].labels == want
        ctc = -1.0 if want == [2, 3] else -1.5
        lm = attention.lm_score(want, fusion)
        assert best[0].score == pytest.approx(w * ctc + (1 - w) * att_table[tuple(want)] + lm)
        assert best[1].labels == []


class _Holder(nnx.Module):
    def __init__(self, scan: bool):
        self.decoder = AttentionDecoder(
            vocab_size=5,
            enc_dim=8,
            dim=16,
            num_layers=2,
            num_heads=2,
            dropout=0.0,
            scan_layers=scan,
            rngs=nnx.Rngs(0),
        )


@pytest.mark.parametrize("scan", [False, True])
def test_the_cached_device_step_and_teacher_scores_equal_the_whole_prefix_pass(scan):
    holder = _Holder(scan)
    graphdef, params, rest = nnx.split(holder, nnx.Param, ...)
    device = attention_device.DecoderOnDevice(graphdef, params, rest)
    enc = np.asarray(jax.random.normal(jax.random.key(1), (2, 7, 8)))
    enc_len = np.array([7, 4], np.int32)
    beam, prefix = 2, [3, 1, 4]
    scorer = device.scorer(enc, enc_len, beam, max_len=5)
    logp, align = scorer.start()
    total = np.zeros(2 * beam)
    for pos, tok in enumerate(prefix, start=1):
        total += logp[:, tok]
        logp, align = scorer.step(np.arange(2 * beam), np.full(2 * beam, tok), pos)
    total += logp[:, EOS]
    assert align.shape == (2 * beam, 7) and np.allclose(align.sum(-1), 1, atol=1e-5)
    assert np.all(align[beam:, 4:] < 1e-6)  # the second utterance's padded frames
    teacher = device.teacher_scores(enc, enc_len, np.array([0, 1]), [prefix, prefix])
    np.testing.assert_allclose(total[::beam], teacher, atol=1e-4)
    # The whole-prefix forward pass, as training computes it.
    inputs = jnp.array([[EOS, *prefix]] * 2)
    full = jax.nn.log_softmax(holder.decoder(inputs, jnp.asarray(enc), jnp.asarray(enc_len)))
    targets = [*prefix, EOS]
    want = [sum(float(full[b, i, t]) for i, t in enumerate(targets)) for b in range(2)]
    np.testing.assert_allclose(teacher, want, atol=1e-4)
    assert not math.isnan(teacher.sum())
