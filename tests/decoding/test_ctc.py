import itertools

import numpy as np
import pytest

from jaxspeech.decoding.ctc import (
    collapse,
    collapse_with_frames,
    ctc_align,
    ctc_beam_search_batch,
    ctc_prefix_beam_search,
    greedy_ids,
)


def test_ctc_greedy_collapse():
    ids = np.array([[0, 1, 1, 0, 1, 2, 2, 0], [3, 3, 3, 0, 0, 0, 0, 0]])
    assert collapse(ids, np.array([8, 2])) == [[1, 1, 2], [3]]
    assert collapse(ids, np.array([0, 8])) == [[], [3]]


def test_greedy_ids_is_argmax():
    logits = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(greedy_ids(logits)), logits.argmax(-1))


# ---------------------------------------------------------------- prefix beam search


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _brute_force(logprobs_tv: np.ndarray, blank: int = 0) -> dict[tuple[int, ...], float]:
    """log P(sequence) for every label sequence: sum over all V^T paths that collapse to it."""
    t, v = logprobs_tv.shape
    probs: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(v), repeat=t):
        seq, prev = [], None
        for s in path:
            if s != prev and s != blank:
                seq.append(s)
            prev = s
        p = np.exp(sum(logprobs_tv[i, s] for i, s in enumerate(path)))
        probs[tuple(seq)] = probs.get(tuple(seq), 0.0) + p
    return {k: float(np.log(p)) for k, p in probs.items()}


@pytest.mark.parametrize(
    "seed,t,v,scale,blank",
    [(0, 5, 3, 1.0, 0), (1, 6, 3, 3.0, 0), (2, 4, 4, 0.3, 0), (3, 5, 4, 5.0, 2), (4, 6, 3, 0.0, 1)],
)
def test_prefix_beam_search_equals_brute_force(seed, t, v, scale, blank):
    # scale: 0 = perfectly flat, < 1 flat, > 1 peaked.
    rng = np.random.default_rng(seed)
    lp = _log_softmax(scale * rng.standard_normal((t, v)))
    want = _brute_force(lp, blank)
    # beam >= V (no token pruning) and >= the number of label sequences: the search is exact.
    nbest = ctc_prefix_beam_search(lp, t, beam=len(want) + v, blank_id=blank)
    assert len(nbest) == len(want)
    for seq, logp in nbest:
        np.testing.assert_allclose(logp, want[tuple(seq)], atol=1e-9, rtol=0)
    best_seq, best_logp = nbest[0]
    assert np.isclose(best_logp, max(want.values()), atol=1e-9)
    assert want[tuple(best_seq)] == max(want.values())
    np.testing.assert_allclose(np.logaddexp.reduce([s for _, s in nbest]), 0.0, atol=1e-9)


def test_prefix_beam_search_small_beam_is_a_lower_bound_and_sorted():
    rng = np.random.default_rng(5)
    lp = _log_softmax(2.0 * rng.standard_normal((6, 4)))
    want = _brute_force(lp)
    nbest = ctc_prefix_beam_search(lp, 6, beam=3)
    assert len(nbest) == 3
    scores = [s for _, s in nbest]
    assert scores == sorted(scores, reverse=True)
    # A pruned search only ever sums a subset of a sequence's paths.
    for seq, logp in nbest:
        assert logp <= want[tuple(seq)] + 1e-9


def test_prefix_beam_search_beam1_on_peaked_equals_greedy():
    rng = np.random.default_rng(6)
    b, t, v = 4, 12, 6
    # Peaked: one frame-wise winner far ahead (incl. repeats with and without blanks between).
    ids = rng.integers(0, v, (b, t))
    ids[0, :6] = [1, 1, 0, 1, 2, 2]
    logits = rng.standard_normal((b, t, v)) + 12.0 * np.eye(v)[ids]
    lp = _log_softmax(logits)
    lengths = np.array([12, 9, 1, 0])
    want = collapse(ids, lengths)
    assert ctc_beam_search_batch(lp, lengths, beam=1) == want
    assert ctc_beam_search_batch(lp, lengths, beam=4) == want
    assert ctc_prefix_beam_search(lp[3], 0) == [([], 0.0)]


def test_prefix_beam_search_ignores_padded_frames():
    rng = np.random.default_rng(7)
    lp = _log_softmax(rng.standard_normal((7, 3)))
    padded = lp.copy()
    padded[4:] = _log_softmax(rng.standard_normal((3, 3)) * 10)
    want = _brute_force(lp[:4])
    got = ctc_prefix_beam_search(padded, 4, beam=64)
    assert got == ctc_prefix_beam_search(lp[:4], 4, beam=64)
    assert np.isclose(got[0][1], max(want.values()), atol=1e-9)
    batch = np.stack([padded, lp])
    assert ctc_beam_search_batch(batch, np.array([4, 4]), beam=64) == [got[0][0]] * 2


def test_prefix_beam_search_pruning_large_vocab():
    # V = 2000 with peaked frames: top-beam / prune_logp pruning keeps the exact answer.
    rng = np.random.default_rng(8)
    t, v = 30, 2000
    ids = rng.integers(0, 5, t) * rng.integers(1, v // 5, t)
    lp = _log_softmax(rng.standard_normal((t, v)) + 15.0 * np.eye(v)[ids])
    want = collapse(ids[None], np.array([t]))[0]
    for kw in ({"beam": 4}, {"beam": 4, "prune_logp": -10.0}):
        best, _ = ctc_prefix_beam_search(lp, t, **kw)[0]
        assert best == want
    # prune_logp above every non-blank token leaves only blank / repeats: nothing new is emitted.
    assert ctc_prefix_beam_search(lp, t, beam=4, prune_logp=1.0) == [
        ([], pytest.approx(float(lp[:, 0].sum())))
    ]


# ---------------------------------------------------------------- timing


def test_collapse_with_frames_gives_each_label_its_first_frame():
    ids = np.array([[0, 1, 1, 0, 1, 2, 2, 0], [3, 3, 3, 0, 0, 0, 0, 0]])
    got = collapse_with_frames(ids, np.array([8, 2]))
    assert got == [([1, 1, 2], [1, 4, 5]), ([3], [0])]
    assert [labels for labels, _ in got] == collapse(ids, np.array([8, 2]))


def _best_path_starts(lp: np.ndarray, labels: list[int], blank: int) -> list[int] | None:
    """Brute force: the most probable of the V^T paths that collapse to `labels`, and the
    frame where each label's run starts on it."""
    t, v = lp.shape
    best, starts = -np.inf, None
    for path in itertools.product(range(v), repeat=t):
        seq, first, prev = [], [], None
        for i, s in enumerate(path):
            if s != prev and s != blank:
                seq.append(s)
                first.append(i)
            prev = s
        score = sum(lp[i, s] for i, s in enumerate(path))
        if seq == labels and score > best:
            best, starts = score, first
    return starts


@pytest.mark.parametrize("seed,t,v,blank", [(0, 5, 3, 0), (1, 6, 3, 1), (2, 6, 4, 0)])
def test_ctc_align_finds_the_best_path_of_the_labels(seed, t, v, blank):
    rng = np.random.default_rng(seed)
    lp = _log_softmax(2.0 * rng.standard_normal((t, v)))
    labels_v = [x for x in range(v) if x != blank]
    for labels in ([], [labels_v[0]], [labels_v[0], labels_v[0]], labels_v, labels_v[::-1]):
        want = _best_path_starts(lp, list(labels), blank)
        assert want is not None
        assert ctc_align(lp, list(labels), blank) == want
    with pytest.raises(ValueError, match="cannot be aligned"):
        ctc_align(lp[:2], [labels_v[0]] * 2, blank)  # a repeat needs a blank between
