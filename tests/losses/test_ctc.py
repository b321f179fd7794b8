import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.losses.ctc import ctc_loss, required_frames


def _collapse(path, blank=0):
    out, prev = [], None
    for s in path:
        if s != prev and s != blank:
            out.append(s)
        prev = s
    return out


def _brute_force_nll(logits_tv: np.ndarray, labels: list[int]) -> float:
    """-log sum over every length-T path that collapses to `labels`."""
    logp = logits_tv - np.log(np.exp(logits_tv).sum(-1, keepdims=True))
    t, v = logp.shape
    total = 0.0
    for path in itertools.product(range(v), repeat=t):
        if _collapse(path) == labels:
            total += np.exp(sum(logp[i, s] for i, s in enumerate(path)))
    return -np.log(total) if total > 0 else np.inf


def test_ctc_matches_brute_force_enumeration():
    rng = np.random.default_rng(0)
    b, t, v = 4, 5, 3
    logits = rng.standard_normal((b, t, v)).astype(np.float32)
    labels = np.array([[1, 2, 1], [1, 1, 0], [2, 0, 0], [1, 2, 2]], np.int32)
    label_len = np.array([3, 2, 1, 3], np.int32)
    logit_len = np.array([5, 4, 5, 5], np.int32)
    loss, valid = jax.jit(ctc_loss)(logits, logit_len, labels, label_len)
    for i in range(b):
        want = _brute_force_nll(logits[i, : logit_len[i]], labels[i, : label_len[i]].tolist())
        assert bool(valid[i])
        np.testing.assert_allclose(float(loss[i]), want, rtol=1e-4)


def test_ctc_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 4, 3))
    labels, label_len, logit_len = np.array([[1, 2]]), np.array([2]), np.array([4])
    f = lambda x: ctc_loss(x, logit_len, labels, label_len)[0].sum()
    grad = np.asarray(jax.grad(f)(jnp.asarray(logits, jnp.float32)))
    eps = 1e-3
    for idx in [(0, 0, 0), (0, 1, 2), (0, 3, 1)]:
        d = np.zeros_like(logits)
        d[idx] = eps
        fd = (
            _brute_force_nll(logits[0] + d[0], [1, 2]) - _brute_force_nll(logits[0] - d[0], [1, 2])
        ) / (2 * eps)
        np.testing.assert_allclose(grad[idx], fd, rtol=1e-2, atol=1e-3)


def test_infeasible_targets_are_masked_and_counted():
    # [1, 1] needs a blank between the repeats: 3 frames; only 2 given.
    logits = np.zeros((3, 2, 3), np.float32)
    labels = np.array([[1, 1], [1, 2], [1, 1]], np.int32)
    label_len = np.array([2, 2, 2], np.int32)
    logit_len = np.array([2, 2, 2], np.int32)
    np.testing.assert_array_equal(required_frames(labels, label_len), [3, 2, 3])
    loss, valid = ctc_loss(logits, logit_len, labels, label_len)
    assert valid.tolist() == [False, True, False]
    assert float(loss[0]) == 0.0 and np.isfinite(float(loss[1]))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_loss_is_masked(bad):
    logits = np.zeros((2, 4, 3), np.float32)
    logits[0, 1, 1] = bad
    loss, valid = ctc_loss(logits, np.array([4, 4]), np.array([[1], [2]]), np.array([1, 1]))
    assert valid.tolist() == [False, True]
    assert np.all(np.isfinite(np.asarray(loss)))
