import numpy as np

from jaxspeech.metrics.wer import ErrorCounts, edit_distance


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
