import numpy as np

from jaxspeech.decoding.ctc import collapse, greedy_ids


def test_ctc_greedy_collapse():
    ids = np.array([[0, 1, 1, 0, 1, 2, 2, 0], [3, 3, 3, 0, 0, 0, 0, 0]])
    assert collapse(ids, np.array([8, 2])) == [[1, 1, 2], [3]]
    assert collapse(ids, np.array([0, 8])) == [[], [3]]


def test_greedy_ids_is_argmax():
    logits = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(greedy_ids(logits)), logits.argmax(-1))
