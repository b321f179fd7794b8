"""LM shallow fusion in CTC prefix beam search and RNN-T modified beam search, against
brute force over every label sequence with the fused score computed directly from the text."""

import math

import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.decoding import search
from jaxspeech.decoding.ctc import ctc_prefix_beam_search
from jaxspeech.decoding.lm import Fusion, NgramLM, TokenWords
from jaxspeech.decoding.rnnt_fusion import PredictorBeam, rnnt_beam_search_fused
from tests.decoding.test_ctc import _brute_force, _log_softmax
from tests.decoding.test_rnnt import (
    _enc,
    _model,
    _modified_beam_ref,
    _modified_beam_sequences,
    _params,
)

CHAR_PIECES = ["<blank>", "<unk>", "a", "b", " "]
SPM_PIECES = ["<blank>", "<unk>", "\u2581a", "b", "\u2581b"]


class BigramLM:
    """A word bigram table with add-one smoothing; the state is the previous word."""

    def __init__(self, favoured: dict[tuple[str, str], float]):
        self.favoured = favoured

    def _logp(self, prev: str, word: str) -> float:
        weights = {w: 1.0 for w in ("a", "b", "ab", "ba", "aa", "bb", "<unk>", "</s>")}
        for (p, w), extra in self.favoured.items():
            if p == prev:
                weights[w] = weights.get(w, 1.0) + extra
        total = sum(weights.values())
        return math.log(weights.get(word, 0.5) / total)

    def begin(self):
        return "<s>"

    def score(self, state, word):
        return self._logp(state, word), word

    def end(self, state):
        return self._logp(state, "</s>")


def _text(pieces, seq, sentencepiece):
    out = ""
    for t in seq:
        p = pieces[t]
        if sentencepiece and p.startswith("\u2581"):
            out += " " + p[1:]
        else:
            out += p
    return out


def _fused_score(lm, pieces, seq, weight, bonus, sentencepiece=False):
    """The LM part of a label sequence's fused score, from its text: every word, then </s>."""
    prev, score = lm.begin(), 0.0
    for word in _text(pieces, seq, sentencepiece).split():
        score += weight * lm.score(prev, word)[0] + bonus
        prev = word
    return score + weight * lm.end(prev)


LM = BigramLM({("<s>", "ab"): 20.0, ("ab", "b"): 8.0, ("b", "</s>"): 5.0})


def test_token_words_from_char_and_sentencepiece_pieces():
    char = TokenWords.from_pieces(CHAR_PIECES, sentencepiece=False)
    assert char.starts_word == (False, False, False, False, True)
    assert char.text == ("", "<unk>", "a", "b", "")
    spm = TokenWords.from_pieces(SPM_PIECES, sentencepiece=True)
    assert spm.starts_word == (False, False, True, False, True)
    assert spm.text == ("", "<unk>", "a", "b", "b")


@pytest.mark.parametrize("pieces,spm", [(CHAR_PIECES, False), (SPM_PIECES, True)])
def test_fusion_scores_words_as_the_text_reads(pieces, spm):
    fusion = Fusion(LM, TokenWords.from_pieces(pieces, sentencepiece=spm), 0.7, 1.5)
    rng = np.random.default_rng(0)
    for _ in range(30):
        seq = rng.integers(1, len(pieces), size=rng.integers(0, 8)).tolist()
        ctx = fusion.start()
        for tok in seq:
            # What a word-starting label gives is the score once the word is complete.
            starter = next(i for i, start in enumerate(fusion.words.starts_word) if start)
            assert fusion.word_done(ctx) == fusion.extend(ctx, starter).score
            ctx = fusion.extend(ctx, tok)
        want = _fused_score(LM, pieces, seq, 0.7, 1.5, spm)
        np.testing.assert_allclose(fusion.finish(ctx), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed,t,scale", [(0, 5, 1.0), (1, 6, 2.0), (2, 5, 0.3)])
@pytest.mark.parametrize("pieces,spm", [(CHAR_PIECES, False), (SPM_PIECES, True)])
def test_ctc_fused_beam_search_equals_brute_force(seed, t, scale, pieces, spm):
    v = len(pieces)
    lp = _log_softmax(scale * np.random.default_rng(seed).standard_normal((t, v)))
    acoustic = _brute_force(lp)
    fusion = Fusion(LM, TokenWords.from_pieces(pieces, sentencepiece=spm), 0.8, 0.5)
    want = {s: a + _fused_score(LM, pieces, s, 0.8, 0.5, spm) for s, a in acoustic.items()}
    nbest = ctc_prefix_beam_search(lp, t, beam=len(want) + v, fusion=fusion)
    assert len(nbest) == len(want)
    for seq, score in nbest:
        np.testing.assert_allclose(score, want[tuple(seq)], atol=1e-9, rtol=0)
    assert tuple(nbest[0][0]) == max(want, key=want.get)


def test_ctc_fusion_with_weight_zero_is_the_plain_search():
    rng = np.random.default_rng(5)
    lp = _log_softmax(1.5 * rng.standard_normal((12, len(CHAR_PIECES))))
    words = TokenWords.from_pieces(CHAR_PIECES, sentencepiece=False)
    plain = ctc_prefix_beam_search(lp, 12, beam=3)
    zero = ctc_prefix_beam_search(lp, 12, beam=3, fusion=Fusion(LM, words, 0.0, 0.0))
    assert [s for s, _ in zero] == [s for s, _ in plain]
    np.testing.assert_allclose([x for _, x in zero], [x for _, x in plain], atol=1e-12)


def test_ctc_fusion_picks_the_word_the_lm_prefers():
    # Acoustically "ab" (0.5 * 0.5) narrowly beats "ba" (0.49 * 0.49); an LM that prefers
    # the word "ba" turns the answer round, the plain search does not.
    probs = np.array([[0.01, 0, 0.5, 0.49, 0], [0.98, 0, 0.01, 0.01, 0], [0.01, 0, 0.49, 0.5, 0]])
    lp = np.log((probs + 1e-6) / (probs + 1e-6).sum(1, keepdims=True))
    words = TokenWords.from_pieces(CHAR_PIECES, sentencepiece=False)
    assert ctc_prefix_beam_search(lp, 3, beam=4)[0][0] == [2, 3]  # "ab"
    lm = BigramLM({("<s>", "ba"): 3.0})
    assert ctc_prefix_beam_search(lp, 3, beam=4, fusion=Fusion(lm, words, 1.0, 0.0))[0][0] == [
        3,
        2,
    ]


# ---------------------------------------------------------------- RNN-T


def _numpy_beam(model, blank) -> PredictorBeam:
    pred_init, pred_step, joint = model

    def rows(tree, idx):
        return tuple(x[idx] for x in tree) if isinstance(tree, tuple) else tree[idx]

    def init(k):
        return pred_step(pred_init(k), np.full((k,), blank))

    def logp(carry, enc_d):
        pred = carry[0]
        return _log_softmax(joint(np.broadcast_to(enc_d, (pred.shape[0], enc_d.shape[0])), pred))

    def advance(carry, src, tok, label):
        pred, state = rows(carry[0], src), rows(carry[1], src)
        new_pred, new_state = pred_step(state, np.where(label, tok, blank))
        keep = label.reshape(-1, *([1] * (pred.ndim - 1)))
        pick = lambda n, o: np.where(label.reshape(-1, *([1] * (n.ndim - 1))), n, o)  # noqa: E731
        if isinstance(state, tuple):
            return np.where(keep, new_pred, pred), tuple(map(pick, new_state, state))
        return np.where(keep, new_pred, pred), pick(new_state, state)

    return PredictorBeam(init, logp, advance)


def _fused_brute_force(enc_td, n, model, blank, v, lm_part, max_sym=1):
    """The best fused sequence of all alignments with up to `max_sym` labels per frame
    (`_modified_beam_sequences`), and every sequence's fused score (its summed
    probability's log plus its LM part)."""
    probs = _modified_beam_sequences(enc_td, n, model, blank, v, max_sym)
    fused = {s: np.log(p) + lm_part(s) for s, p in probs.items()}
    return max(fused, key=fused.get), fused


@pytest.mark.parametrize(
    "kind,t,max_sym", [("stateless", 4, 1), ("recurrent", 4, 1), ("recurrent", 2, 2)]
)
def test_rnnt_fused_beam_search_equals_brute_force(kind, t, max_sym):
    v, blank = len(CHAR_PIECES), 0
    model = _model(_params(3, v), kind, np, blank)
    fusion = Fusion(LM, TokenWords.from_pieces(CHAR_PIECES, sentencepiece=False), 1.0, 0.3)
    lm_part = lambda s: _fused_score(LM, CHAR_PIECES, s, 1.0, 0.3)  # noqa: E731
    # no candidate is ever cut: K >= the candidates of any expansion
    k = v * sum((v - 1) ** i for i in range(t)) if max_sym == 1 else 512
    for seed in range(2):
        enc = _enc(20 + seed, 1, t)[0].astype(np.float64)
        best, fused = _fused_brute_force(enc, t, model, blank, v, lm_part, max_sym)
        got = rnnt_beam_search_fused(
            enc, t, _numpy_beam(model, blank), fusion, beam=k, max_symbols_per_frame=max_sym
        )
        assert tuple(got[0][0]) == best
        assert len(got) == len(fused)  # every sequence, done with the last frame, once
        for seq, score, frames in got:
            np.testing.assert_allclose(score, fused[tuple(seq)], atol=1e-9, rtol=0)
            # at most max_sym labels on a frame, in order
            assert len(frames) == len(seq) and frames == sorted(frames)
            assert all(frames.count(f) <= max_sym for f in frames) and all(f < t for f in frames)


@pytest.mark.parametrize("beam,max_sym", [(2, 1), (3, 1), (3, 3)])
def test_rnnt_fusion_with_weight_zero_is_the_modified_beam_search(beam, max_sym):
    v, blank = 4, 0
    model = _model(_params(6, v), "recurrent", np, blank)
    fusion = Fusion(LM, TokenWords.from_pieces(CHAR_PIECES[:v], sentencepiece=False), 0.0, 0.0)
    enc = _enc(7, 1, 7)[0].astype(np.float64)
    got = rnnt_beam_search_fused(
        enc, 7, _numpy_beam(model, blank), fusion, beam=beam, max_symbols_per_frame=max_sym
    )
    want_seq, want_score = _modified_beam_ref(enc, 7, model, blank, v, beam, max_sym)
    assert got[0][0] == want_seq
    np.testing.assert_allclose(got[0][1], want_score, atol=1e-9, rtol=0)


# ---------------------------------------------------------------- KenLM and the config

ARPA = """\\data\\
ngram 1=5
ngram 2=3

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.30103
-0.69897\t</s>\t0
-0.5\tab\t-0.2
-0.6\tb\t-0.1

\\2-grams:
-0.1\t<s> ab
-0.2\tab b
-0.3\tb </s>

\\end\\
"""


def test_ngram_lm_scores_in_natural_log_with_backoff(tmp_path):
    path = tmp_path / "lm.arpa"
    path.write_text(ARPA)
    lm = NgramLM(str(path))
    ln10 = math.log(10)
    logp, s1 = lm.score(lm.begin(), "ab")
    np.testing.assert_allclose(logp, -0.1 * ln10, rtol=1e-6)
    logp, s2 = lm.score(s1, "b")
    np.testing.assert_allclose(logp, -0.2 * ln10, rtol=1e-6)
    np.testing.assert_allclose(lm.end(s2), -0.3 * ln10, rtol=1e-6)
    # No bigram "b ab": back off from b (-0.1) to the unigram ab (-0.5).
    np.testing.assert_allclose(lm.score(s2, "ab")[0], (-0.1 - 0.5) * ln10, rtol=1e-6)
    np.testing.assert_allclose(lm.score(s2, "zzz")[0], (-0.1 - 1.0) * ln10, rtol=1e-6)


def test_ngram_lm_errors(tmp_path):
    with pytest.raises(UserError, match="no language model file"):
        NgramLM(str(tmp_path / "missing.arpa"))
    bad = tmp_path / "bad.arpa"
    bad.write_text("not a language model\n")
    with pytest.raises(UserError, match="not an ARPA"):
        NgramLM(str(bad))
    binary = tmp_path / "model.bin"  # not KenLM's binary: read as text, not UTF-8
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)) * 4)
    with pytest.raises(UserError, match=rf"'{binary}' is not an ARPA text file .* KenLM binary"):
        NgramLM(str(binary))


def test_lm_needs_a_beam_search():
    config = ConfigDict(
        {
            "model": {"head": "ctc"},
            "decoding": {"method": "ctc_greedy", "beam": 4, "lm_path": "x.arpa"},
        }
    )
    with pytest.raises(ValueError, match="LM fusion needs one of"):
        search.uses_lm(config)
    config.decoding.method = "ctc_beam"
    assert search.uses_lm(config)
    config.decoding.method = "auto"  # with an LM: the head's beam search
    assert search.uses_lm(config) and search.decoding_method(config) == "ctc_beam"
    config.model.head = "ctc+rnnt"
    assert search.decoding_method(config) == "rnnt_beam"
    config.decoding.lm_path = ""
    assert not search.uses_lm(config)
