import numpy as np
import pytest

from jaxspeech.metrics.wer import (
    ErrorCounts,
    Normalizer,
    bootstrap_interval,
    edit_distance,
    load_mapping,
    score_utterance,
)


def plain_edit_distance(a, b) -> int:
    """Textbook O(len(a) * len(b)) dynamic programme."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
    return d[-1][-1]


def test_edit_distance_matches_plain_dp():
    rng = np.random.default_rng(0)
    words = ["a", "cat", "sat", "on", "the", "mat", "dog"]
    for _ in range(300):
        a = list(rng.choice(words, rng.integers(0, 9)))
        b = list(rng.choice(words, rng.integers(0, 9)))
        assert edit_distance(a, b) == plain_edit_distance(a, b)
        assert edit_distance(" ".join(a), " ".join(b)) == plain_edit_distance(
            " ".join(a), " ".join(b)
        )


def test_error_counts_aggregate_over_utterances():
    pairs = [("the cat sat", "the cat sat"), ("a dog  ran", "a dog ran far"), ("hello", "")]
    c = ErrorCounts()
    for ref, hyp in pairs:
        c.add(ref, hyp)
    words = sum(len(r.split()) for r, _ in pairs)
    werr = sum(plain_edit_distance(r.split(), h.split()) for r, h in pairs)
    chars = sum(len(" ".join(r.split())) for r, _ in pairs)
    cerr = sum(plain_edit_distance(" ".join(r.split()), " ".join(h.split())) for r, h in pairs)
    assert (c.words, c.word_errors, c.chars, c.char_errors) == (words, werr, chars, cerr)
    assert c.wer == werr / words and c.cer == cerr / chars and c.utterances == 3


def _random_pairs(seed, n, vocab, max_len):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        a = list(rng.choice(vocab, rng.integers(0, max_len)))
        b = list(rng.choice(vocab, rng.integers(0, max_len)))
        yield " ".join(a), " ".join(b)


def test_error_types_sum_to_the_plain_distance_and_equal_jiwers():
    import jiwer

    vocab = ["a", "cat", "sat", "on", "the", "mat", "dog", "ran"]
    for ref, hyp in _random_pairs(1, 400, vocab, 9):
        s = score_utterance(ref, hyp)
        assert s["word_errors"] == plain_edit_distance(ref.split(), hyp.split())
        assert s["char_errors"] == plain_edit_distance(ref, hyp)
        assert s["word_sub"] + s["word_del"] + s["word_ins"] == s["word_errors"]
        assert s["char_sub"] + s["char_del"] + s["char_ins"] == s["char_errors"]
        if not ref:
            continue  # jiwer refuses an empty reference
        w = jiwer.process_words(ref, hyp if hyp else "")
        assert (s["word_sub"], s["word_del"], s["word_ins"]) == (
            w.substitutions,
            w.deletions,
            w.insertions,
        )
        c = jiwer.process_characters(ref, hyp if hyp else "")
        assert (s["char_sub"], s["char_del"], s["char_ins"]) == (
            c.substitutions,
            c.deletions,
            c.insertions,
        )


def test_error_counts_sum_types_and_round_trip_through_an_array():
    c = ErrorCounts()
    per = [c.add(r, h) for r, h in [("a b c", "a x c d"), ("a b", "b"), ("", "x y")]]
    assert (c.word_sub, c.word_del, c.word_ins) == (1, 1, 3)
    assert c.word_errors == sum(p["word_errors"] for p in per) == 5
    assert ErrorCounts.from_array(c.as_array()) == c


def test_normalizer_case_punctuation_and_mapping():
    norm = Normalizer(
        lowercase=True,
        remove_punctuation=True,
        mapping={"okay": "ok", "uh": "", "gonna": "going to"},
    )
    assert norm("Okay, uh... I'm GONNA say 'hello'-world!") == "ok i'm going to say hello world"
    assert Normalizer()("  Keep   THIS, as is ") == "Keep THIS, as is"


def test_load_mapping_reads_tab_separated_pairs_and_names_bad_lines(tmp_path):
    path = tmp_path / "map.tsv"
    path.write_text("# comment\nokay\tok\n\nuh\t\n")
    assert load_mapping(str(path)) == {"okay": "ok", "uh": ""}
    path.write_text("okay\tok\nokay ok\n")
    with pytest.raises(ValueError, match=r"map.tsv:2: expected"):
        load_mapping(str(path))
    path.write_text("okay\tok\nokay\tOK\n")
    with pytest.raises(ValueError, match=r"map.tsv:2: 'okay' is mapped twice"):
        load_mapping(str(path))


def test_bootstrap_interval_covers_the_rate_and_shrinks_with_more_utterances():
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 20, 2000)
    errors = rng.binomial(lengths, 0.2)
    rate = errors.sum() / lengths.sum()
    lo, hi = bootstrap_interval(errors, lengths, num_samples=500)
    assert lo < rate < hi and hi - lo < 0.02
    lo_small, hi_small = bootstrap_interval(errors[:100], lengths[:100], num_samples=500)
    assert hi_small - lo_small > 2 * (hi - lo)  # ~ 1 / sqrt(N): 100 vs 2000 utterances
    # Independent check: the interval's width is about 2 x 1.96 standard errors of the
    # ratio estimator (delta method) for this many utterances.
    r = errors / lengths.mean() - rate * lengths / lengths.mean()
    se = r.std(ddof=1) / np.sqrt(len(r))
    assert abs((hi - lo) - 2 * 1.96 * se) < 0.25 * (hi - lo)
    assert np.isnan(bootstrap_interval(np.zeros(0), np.zeros(0))[0])
