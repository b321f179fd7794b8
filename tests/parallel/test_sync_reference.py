"""The NumPy sync references against small cases worked out by hand (no jax)."""

import numpy as np
import pytest

from tests.parallel import sync_reference as ref

THIRD = 1.0 / 3.0

# --- ring mixing matrix ------------------------------------------------------------------


def test_ring_matrix_four_learners_rows():
    expected = np.array(
        [
            [THIRD, THIRD, 0.0, THIRD],
            [THIRD, THIRD, THIRD, 0.0],
            [0.0, THIRD, THIRD, THIRD],
            [THIRD, 0.0, THIRD, THIRD],
        ]
    )
    np.testing.assert_allclose(ref.ring_mixing_matrix(4), expected, rtol=0, atol=1e-15)


def test_ring_matrix_small_rings():
    np.testing.assert_array_equal(ref.ring_mixing_matrix(2), np.full((2, 2), 0.5))
    np.testing.assert_allclose(ref.ring_mixing_matrix(3), np.full((3, 3), THIRD), atol=1e-15)
    np.testing.assert_allclose(
        ref.ring_mixing_matrix(5)[0], [THIRD, THIRD, 0.0, 0.0, THIRD], atol=1e-15
    )


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_matrix_symmetric_doubly_stochastic(n):
    w = ref.ring_mixing_matrix(n)
    assert w.shape == (n, n)
    np.testing.assert_array_equal(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), np.ones(n), atol=1e-15)
    np.testing.assert_allclose(w.sum(axis=1), np.ones(n), atol=1e-15)


@pytest.mark.parametrize("n", [0, 1])
def test_ring_matrix_needs_two_learners(n):
    with pytest.raises(ValueError):
        ref.ring_mixing_matrix(n)


# --- gossip ------------------------------------------------------------------------------


def test_gossip_two_learners_is_the_mean():
    before = np.array([[[0.0, 0.0]], [[2.0, 2.0]]])  # (N=2, 1, 2)
    after = np.array([[[1.0, 2.0]], [[3.0, 6.0]]])
    np.testing.assert_allclose(
        ref.gossip_reference(before, after, overlap=False), [[[2.0, 4.0]], [[2.0, 4.0]]]
    )
    # Overlap: mean of `before` = [1, 1], plus each learner's own update.
    np.testing.assert_allclose(
        ref.gossip_reference(before, after, overlap=True), [[[2.0, 3.0]], [[2.0, 5.0]]]
    )


def test_gossip_four_learner_ring():
    before = np.array([0.0, 3.0, 6.0, 9.0])
    after = np.array([3.0, 0.0, 0.0, 6.0])
    # new[i] = (after[i-1] + after[i] + after[i+1]) / 3
    np.testing.assert_allclose(
        ref.gossip_reference(before, after, overlap=False), [3.0, 1.0, 2.0, 3.0]
    )
    after = before + np.array([1.0, 0.0, 0.0, -1.0])
    # new[i] = (before[i-1] + before[i] + before[i+1]) / 3 + (after[i] - before[i])
    np.testing.assert_allclose(
        ref.gossip_reference(before, after, overlap=True), [5.0, 3.0, 6.0, 4.0]
    )


def test_gossip_tree_nested():
    before = {"a": np.array([0.0, 2.0]), "b": {"c": np.array([[1.0], [3.0]])}}
    after = {"a": np.array([4.0, 0.0]), "b": {"c": np.array([[1.0], [3.0]])}}
    out = ref.gossip_tree(before, after, overlap=False)
    np.testing.assert_allclose(out["a"], [2.0, 2.0])
    np.testing.assert_allclose(out["b"]["c"], [[2.0], [2.0]])


# --- BMUF --------------------------------------------------------------------------------


def test_bmuf_two_learners_by_hand():
    learners = np.array([1.0, 3.0])
    # mean 2, G = 2 - 0 = 2, momentum' = 0.5 * 1 + 1 * 2 = 2.5
    g, m, w = ref.bmuf_reference(learners, np.array(0.0), np.array(1.0), 0.5, 1.0, False)
    assert float(m) == 2.5
    assert float(g) == 2.5
    np.testing.assert_array_equal(w, [2.5, 2.5])
    # Nesterov: 0 + 2.5 + 0.5 * 2.5 = 3.75
    g, m, w = ref.bmuf_reference(learners, np.array(0.0), np.array(1.0), 0.5, 1.0, True)
    assert float(m) == 2.5
    assert float(g) == 3.75
    np.testing.assert_array_equal(w, [3.75, 3.75])


def test_bmuf_nonzero_global_by_hand():
    learners = np.array([2.0, 4.0])
    # mean 3, G = 3 - 1 = 2, momentum' = 0.5 * -2 + 2 = 1
    g, m, _ = ref.bmuf_reference(learners, np.array(1.0), np.array(-2.0), 0.5, 1.0, False)
    assert (float(g), float(m)) == (2.0, 1.0)
    g, m, _ = ref.bmuf_reference(learners, np.array(1.0), np.array(-2.0), 0.5, 1.0, True)
    assert (float(g), float(m)) == (2.5, 1.0)


def test_bmuf_without_momentum_is_model_averaging():
    learners = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]])  # mean [3, 3]
    global_ = np.array([1.0, -1.0])
    g, m, w = ref.bmuf_reference(learners, global_, np.array([7.0, 7.0]), 0.0, 1.0, False)
    np.testing.assert_array_equal(g, [3.0, 3.0])
    np.testing.assert_array_equal(m, [2.0, 4.0])
    np.testing.assert_array_equal(w, [[3.0, 3.0]] * 3)


def test_bmuf_tree_nested():
    learners = {"a": np.array([1.0, 3.0]), "b": {"c": np.array([[0.0, 4.0], [2.0, 0.0]])}}
    global_ = {"a": np.array(0.0), "b": {"c": np.array([0.0, 0.0])}}
    momentum = {"a": np.array(1.0), "b": {"c": np.array([0.0, 0.0])}}
    g, m, w = ref.bmuf_tree(learners, global_, momentum, 0.5, 1.0, False)
    assert float(g["a"]) == 2.5 and float(m["a"]) == 2.5
    np.testing.assert_array_equal(g["b"]["c"], [1.0, 2.0])
    np.testing.assert_array_equal(m["b"]["c"], [1.0, 2.0])
    np.testing.assert_array_equal(w["b"]["c"], [[1.0, 2.0], [1.0, 2.0]])


def test_bmuf_default_momentum():
    assert ref.bmuf_default_momentum(4) == 0.75
    assert ref.bmuf_default_momentum(1) == 0.0
    with pytest.raises(ValueError):
        ref.bmuf_default_momentum(0)


# --- GTC: one learner --------------------------------------------------------------------

RESIDUAL8 = np.array([0.5, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.125], dtype=np.float32)
GRAD8 = np.array([0.25, 0.125, -1.0, 0.0, 0.5, -0.25, 0.0, 0.0], dtype=np.float32)
# x = [0.75, 0.125, -0.75, 0, 0.5, -0.25, 0, 0.125]; |x| >= 0.5 at indices 0, 2, 4.


def test_gtc_sign_capacity_overflow():
    out = ref.gtc_compress_reference(RESIDUAL8, GRAD8, 0.5, 0.0, 0.25, "sign")
    np.testing.assert_array_equal(out["x"], [0.75, 0.125, -0.75, 0, 0.5, -0.25, 0, 0.125])
    assert out["tau"] == np.float32(0.5)
    # cap = ceil(0.25 * 8) = 2: indices 0 and 2 go, index 4 overflows.
    np.testing.assert_array_equal(out["indices"], [0, 2])
    assert out["indices"].dtype == np.int32
    np.testing.assert_array_equal(out["values_sent"], [0.5, -0.5])
    np.testing.assert_array_equal(out["words"], [0, 5])
    assert out["words"].dtype == np.int32
    assert (out["sent"], out["overflow"]) == (2, 1)
    np.testing.assert_array_equal(
        out["new_residual"], [0.25, 0.125, -0.25, 0, 0.5, -0.25, 0, 0.125]
    )
    assert out["new_residual"].dtype == np.float32


def test_gtc_float_capacity_overflow():
    out = ref.gtc_compress_reference(RESIDUAL8, GRAD8, 0.5, 0.0, 0.25, "float")
    np.testing.assert_array_equal(out["indices"], [0, 2])
    np.testing.assert_array_equal(out["values_sent"], [0.75, -0.75])
    assert "words" not in out
    assert (out["sent"], out["overflow"]) == (2, 1)
    np.testing.assert_array_equal(out["new_residual"], [0, 0.125, 0, 0, 0.5, -0.25, 0, 0.125])


def test_gtc_sign_padding():
    out = ref.gtc_compress_reference(RESIDUAL8, GRAD8, 0.5, 0.0, 1.0, "sign")
    np.testing.assert_array_equal(out["indices"], [0, 2, 4, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(out["values_sent"], [0.5, -0.5, 0.5, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["words"], [0, 5, 8, -1, -1, -1, -1, -1])
    assert (out["sent"], out["overflow"]) == (3, 0)


def test_gtc_adds_in_float32():
    # In float32, 1 + 2**-30 rounds back to 1; in float64 it would not.
    out = ref.gtc_compress_reference(np.array([1.0]), np.array([2.0**-30]), 0.0, 0.0, 1.0, "float")
    assert out["x"].dtype == np.float32
    assert out["x"][0] == 1.0


def test_gtc_adaptive_tau_is_kth_largest():
    grad = np.array([0.125, -3.0, 2.0, 0.5, -1.0], dtype=np.float32)
    zero = np.zeros(5, dtype=np.float32)
    # density 0.4 -> k = 2 -> tau = 2 (magnitudes 3, 2, 1, 0.5, 0.125); given tau ignored.
    out = ref.gtc_compress_reference(zero, grad, 100.0, 0.4, 1.0, "sign")
    assert out["tau"] == np.float32(2.0)
    np.testing.assert_array_equal(out["indices"], [1, 2, -1, -1, -1])
    np.testing.assert_array_equal(out["values_sent"], [-2.0, 2.0, 0, 0, 0])
    np.testing.assert_array_equal(out["words"], [3, 4, -1, -1, -1])
    np.testing.assert_array_equal(out["new_residual"], [0.125, -1.0, 0.0, 0.5, -1.0])
    # density 0.5 -> k = ceil(2.5) = 3 -> tau = 1.
    out = ref.gtc_compress_reference(zero, grad, 0.0, 0.5, 1.0, "sign")
    assert out["tau"] == np.float32(1.0)
    assert out["sent"] == 3


def test_gtc_adaptive_tau_ties_send_more_than_k():
    # k = 1, tau = 1, and all three magnitude-1 elements qualify.
    out = ref.gtc_compress_reference(
        np.zeros(4), np.array([1.0, -1.0, 0.5, 1.0]), 0.0, 0.25, 1.0, "sign"
    )
    assert out["tau"] == np.float32(1.0)
    np.testing.assert_array_equal(out["indices"], [0, 1, 3, -1])


def test_sign_word_packing():
    np.testing.assert_array_equal(ref.pack_sign_words(np.array([3]), np.array([True])), [7])
    words = ref.pack_sign_words(np.array([0, 3, 10]), np.array([False, True, False]))
    np.testing.assert_array_equal(words, [0, 7, 20])
    assert words.dtype == np.int32
    idx, vals = ref.unpack_sign_words(np.array([7, 20, -1, -1], dtype=np.int32), 0.5)
    np.testing.assert_array_equal(idx, [3, 10])
    np.testing.assert_array_equal(vals, [-0.5, 0.5])
    assert vals.dtype == np.float32


@pytest.mark.parametrize(
    ("tau", "density", "capacity", "values"),
    [
        (0.5, 0.0, 0.5, "int8"),  # unknown value mode
        (0.5, 0.0, 0.0, "sign"),  # no room in a message
        (0.5, 0.0, -0.1, "float"),
        (0.0, 0.0, 0.5, "sign"),  # +-0 carries nothing
        (-1.0, 0.0, 0.5, "sign"),
    ],
)
def test_gtc_validation(tau, density, capacity, values):
    with pytest.raises(ValueError):
        ref.gtc_compress_reference(RESIDUAL8, GRAD8, tau, density, capacity, values)


def test_gtc_sign_with_zero_tau_is_fine_when_adaptive():
    out = ref.gtc_compress_reference(RESIDUAL8, GRAD8, 0.0, 0.25, 1.0, "sign")
    assert out["tau"] == np.float32(0.75)  # k = 2: magnitudes 0.75, 0.75, ...


# --- GTC: exchange -----------------------------------------------------------------------

RESIDUALS = np.array([[0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=np.float32)
GRADS = np.array([[1.0, 0.25, -2.0, 0.0], [0.75, 0.0, 0.0, -1.5]], dtype=np.float32)
# x0 = [1, 0.25, -2, 0], x1 = [1.25, 0, 0, -1.5]


def test_gtc_exchange_sign():
    out = ref.gtc_exchange_reference(RESIDUALS, GRADS, 1.0, 0.0, 0.5, "sign")
    np.testing.assert_array_equal(out["aggregate"], [2.0, 0.0, -1.0, -1.0])
    assert out["aggregate"].dtype == np.float32
    np.testing.assert_array_equal(
        out["new_residuals"], [[0.0, 0.25, -1.0, 0.0], [0.25, 0.0, 0.0, -0.5]]
    )
    np.testing.assert_array_equal(out["sent"], [2, 2])
    np.testing.assert_array_equal(out["overflow"], [0, 0])
    np.testing.assert_array_equal(out["tau"], [1.0, 1.0])


def test_gtc_exchange_float():
    out = ref.gtc_exchange_reference(RESIDUALS, GRADS, 1.0, 0.0, 0.5, "float")
    np.testing.assert_array_equal(out["aggregate"], [2.25, 0.0, -2.0, -1.5])
    np.testing.assert_array_equal(out["new_residuals"], [[0.0, 0.25, 0.0, 0.0], [0.0] * 4])


def test_gtc_exchange_float_sends_everything():
    out = ref.gtc_exchange_reference(RESIDUALS, GRADS, 0.0, 0.0, 1.0, "float")
    # Aggregate = sum over learners of grad + residual; nothing stays behind.
    np.testing.assert_array_equal(out["aggregate"], [2.25, 0.25, -2.0, -1.5])
    np.testing.assert_array_equal(out["new_residuals"], np.zeros((2, 4)))
    np.testing.assert_array_equal(out["sent"], [4, 4])
    np.testing.assert_array_equal(out["overflow"], [0, 0])


def test_gtc_exchange_accumulates_in_float32_learner_by_learner():
    # float32: (1 + 2**-24) + 2**-24 rounds to 1 at each step; a float64 sum would give
    # 1 + 2**-23, which float32 represents.
    grads = np.array([[1.0], [2.0**-24], [2.0**-24]], dtype=np.float32)
    out = ref.gtc_exchange_reference(np.zeros_like(grads), grads, 0.0, 0.0, 1.0, "float")
    assert out["aggregate"][0] == np.float32(1.0)


def test_gtc_exchange_tree_per_leaf_row_major():
    grads = {
        # (N=2, 2, 2): n = 4, cap = ceil(0.25 * 4) = 1
        "a": np.array([[[0.0, 2.0], [3.0, 0.0]], [[0.0, 0.0], [-1.0, 0.0]]]),
        # (N=2, 3): n = 3, cap = ceil(0.75) = 1
        "b": {"c": np.array([[0.0, 0.0, 0.0], [5.0, 0.0, 0.0]])},
    }
    residuals = {"a": np.zeros((2, 2, 2)), "b": {"c": np.zeros((2, 3))}}
    out = ref.gtc_exchange_tree(residuals, grads, 1.0, 0.0, 0.25, "sign")
    # Learner 0 sends flat index 1 of "a" (index 2 overflows); learner 1 sends flat index 2.
    np.testing.assert_array_equal(out["aggregate"]["a"], [[0.0, 1.0], [-1.0, 0.0]])
    np.testing.assert_array_equal(out["aggregate"]["b"]["c"], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        out["new_residuals"]["a"], [[[0.0, 1.0], [3.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]]
    )
    np.testing.assert_array_equal(out["new_residuals"]["b"]["c"], [[0.0] * 3, [4.0, 0.0, 0.0]])
    np.testing.assert_array_equal(out["sent"], [1, 2])
    np.testing.assert_array_equal(out["overflow"], [1, 0])


# --- bytes -------------------------------------------------------------------------------


def test_message_and_sent_bytes():
    # cap = ceil(0.01 * 1000) = 10
    assert ref.gtc_message_bytes(1000, 0.01, "sign") == 44
    assert ref.gtc_message_bytes(1000, 0.01, "float") == 80
    assert ref.gtc_sent_bytes(1000, 0.01, "sign", 4) == 132
    assert ref.gtc_sent_bytes(1000, 0.01, "float", 4) == 240
    # cap rounds up, and is at least 1
    assert ref.gtc_message_bytes(10, 0.25, "float") == 24
    assert ref.gtc_message_bytes(10, 0.001, "sign") == 8
    assert ref.allreduce_sent_bytes(1000, 4) == 1500.0
    assert ref.allreduce_sent_bytes(1000, 1) == 0.0
    with pytest.raises(ValueError):
        ref.gtc_message_bytes(10, 0.5, "int8")
