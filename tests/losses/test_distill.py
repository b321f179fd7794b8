"""Distillation losses against independent float64 numpy references written from the math."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.losses.distill import distill_loss, full_kl, topk_log_probs

FLOOR = np.exp(-87.0)  # distill.LOG_PROB_FLOOR, restated


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _teacher_topk(rng, b, t, v, k, scale=3.0):
    """(logits, indices, log_probs): a random teacher and its top-k by argsort."""
    logits = scale * rng.standard_normal((b, t, v))
    logp = _log_softmax(logits)
    idx = np.argsort(-logp, axis=-1)[..., :k]
    return logits, idx.astype(np.int32), np.take_along_axis(logp, idx, -1).astype(np.float32)


def _np_topk(idx, logp, v, rest):
    """Reference reconstruction as probabilities (float64), frame by frame."""
    b, t, k = idx.shape
    out = np.zeros((b, t, v))
    for i in range(b):
        for j in range(t):
            p = np.exp(np.asarray(logp[i, j], np.float64))
            if rest == "drop":
                out[i, j, idx[i, j]] = p / p.sum()
            else:
                if k < v:
                    out[i, j] = max(max(0.0, 1.0 - p.sum()) / (v - k), FLOOR)
                out[i, j, idx[i, j]] = p
    return out


def _np_frame_loss(q, logits, temperature, kind):
    """KL(q_T || p_T) or CE at temperature, times temperature**2, for one frame."""
    with np.errstate(divide="ignore"):
        qt = q ** (1.0 / temperature)
    qt = qt / qt.sum()
    logp = _log_softmax(np.asarray(logits, np.float64) / temperature)
    nz = qt > 0
    ce = -np.sum(qt * logp)
    neg_entropy = np.sum(qt[nz] * np.log(qt[nz]))
    return temperature**2 * (ce + neg_entropy if kind == "kl" else ce)


def _np_distill(logits, s_len, idx, logp, t_len, rest, temperature, kind):
    v = logits.shape[-1]
    q = _np_topk(idx, logp, v, rest)
    loss = np.zeros(logits.shape[0])
    for i in range(logits.shape[0]):
        if s_len[i] != t_len[i]:
            continue
        for j in range(s_len[i]):
            loss[i] += _np_frame_loss(q[i, j], logits[i, j], temperature, kind)
    return loss, s_len == t_len


def _np_full_kl(s_logits, s_len, t_logits, temperature):
    return np.array(
        [
            sum(
                _np_frame_loss(
                    np.exp(_log_softmax(t_logits[i, j])), s_logits[i, j], temperature, "kl"
                )
                for j in range(s_len[i])
            )
            for i in range(s_logits.shape[0])
        ]
    )


@functools.partial(jax.jit, static_argnames=("rest", "temperature", "kind"))
def _distill(*args, rest="spread", temperature=1.0, kind="kl"):
    return distill_loss(*args, rest=rest, temperature=temperature, kind=kind)


@pytest.mark.parametrize("rest", ["spread", "drop"])
def test_topk_reconstruction_matches_numpy(rest):
    rng = np.random.default_rng(0)
    _, idx, logp = _teacher_topk(rng, 2, 3, 11, 4, scale=1.0)
    # One very peaked frame: the top-k hold all the float32 mass, so "spread" hits the floor.
    idx[1, 2], logp[1, 2] = [5, 1, 0, 2], [0.0, -40.0, -45.0, -50.0]
    got = np.asarray(topk_log_probs(jnp.asarray(idx), jnp.asarray(logp), 11, rest))
    assert got.dtype == np.float32 and got.shape == (2, 3, 11)
    want = _np_topk(idx, logp, 11, rest)
    np.testing.assert_allclose(np.exp(got), want, rtol=1e-5, atol=1e-30)
    if rest == "drop":
        assert np.all(np.isneginf(got[want == 0]))
    else:
        assert np.all(np.isfinite(got)) and got[1, 2, 3] == np.float32(-87.0)
        assert np.exp(got[1, 2, 3]) >= np.finfo(np.float32).tiny  # normal


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_full_topk_equals_full_kl(temperature):
    rng = np.random.default_rng(1)
    b, t, v = 2, 4, 7
    t_logits, idx, logp = _teacher_topk(rng, b, t, v, v)
    s_logits = rng.standard_normal((b, t, v)).astype(np.float32)
    s_len = np.array([4, 2], np.int32)
    want = _np_full_kl(s_logits, s_len, t_logits, temperature)
    full = np.asarray(full_kl(s_logits, s_len, t_logits.astype(np.float32), temperature))
    np.testing.assert_allclose(full, want, rtol=1e-5)
    for rest in ("spread", "drop"):
        loss, valid = _distill(
            s_logits, s_len, idx, logp, s_len, rest=rest, temperature=temperature
        )
        assert np.all(np.asarray(valid))
        np.testing.assert_allclose(np.asarray(loss), want, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(loss), full, rtol=1e-5)


@pytest.mark.parametrize("kind", ["kl", "ce"])
@pytest.mark.parametrize("rest", ["spread", "drop"])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_loss_matches_numpy(kind, rest, temperature):
    rng = np.random.default_rng(2)
    b, t, t_pad, v, k = 4, 5, 7, 13, 4  # teacher padded past the student (T' > T)
    _, idx, logp = _teacher_topk(rng, b, t_pad, v, k)
    s_logits = 2.0 * rng.standard_normal((b, t, v)).astype(np.float32)
    s_len = np.array([5, 3, 0, 4], np.int32)
    t_len = np.array([5, 3, 0, 5], np.int32)  # row 3 disagrees: invalid
    loss, valid = _distill(
        s_logits, s_len, idx, logp, t_len, rest=rest, temperature=temperature, kind=kind
    )
    want, want_valid = _np_distill(s_logits, s_len, idx, logp, t_len, rest, temperature, kind)
    assert loss.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(valid), want_valid)
    np.testing.assert_allclose(np.asarray(loss), want, rtol=1e-5, atol=1e-6)
    assert float(loss[3]) == 0.0 and float(loss[0]) > 0.0


@pytest.mark.parametrize(
    ("kind", "rest", "temperature"), [("kl", "spread", 2.0), ("ce", "drop", 1.0)]
)
def test_gradient_matches_finite_differences(kind, rest, temperature):
    rng = np.random.default_rng(3)
    b, t, v, k = 2, 3, 5, 3
    _, idx, logp = _teacher_topk(rng, b, t, v, k, scale=1.0)
    logp = logp.astype(np.float64)
    x0 = rng.standard_normal((b, t, v))
    s_len = t_len = np.array([3, 2], np.int32)

    def ref(x):
        return _np_distill(x, s_len, idx, logp, t_len, rest, temperature, kind)[0].sum()

    with jax.enable_x64(True):
        f = lambda x: distill_loss(
            x, s_len, idx, jnp.asarray(logp), t_len, rest=rest, temperature=temperature, kind=kind
        )[0].sum()
        grad = np.asarray(jax.grad(f)(jnp.asarray(x0)))
    assert grad.dtype == np.float64
    eps = 1e-6
    fd = np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        d = np.zeros_like(x0)
        d[i] = eps
        fd[i] = (ref(x0 + d) - ref(x0 - d)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert np.all(grad[1, 2] == 0.0)  # padding frame


@pytest.mark.parametrize("rest", ["spread", "drop"])
def test_finite_for_padding_and_garbage(rest):
    rng = np.random.default_rng(4)
    b, t, v, k = 3, 4, 6, 3
    _, idx, logp = _teacher_topk(rng, b, t, v, k)
    s_logits = rng.standard_normal((b, t, v)).astype(np.float32)
    s_len = np.array([0, 2, 4], np.int32)  # row 0 all padding
    # Padding frames hold garbage: NaN logits, NaN / -inf log-probs, repeated ids.
    s_logits[1, 2:] = np.nan
    s_logits[0] = np.nan
    logp[1, 2:] = [np.nan, -np.inf, 0.0]
    idx[1, 2:] = 0
    logp[2, 0] = [0.0, -np.inf, -np.inf]  # a valid frame with zero-mass top-k entries

    def f(x):
        loss, _ = distill_loss(x, s_len, idx, logp, s_len, rest=rest, temperature=2.0)
        return loss.sum(), loss

    (_, loss), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(jnp.asarray(s_logits))
    loss, grad = np.asarray(loss), np.asarray(grad)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
    assert loss[0] == 0.0 and np.all(grad[0] == 0.0) and np.all(grad[1, 2:] == 0.0)
    assert np.any(grad[2] != 0.0)


def test_bad_arguments_raise():
    x = np.zeros((1, 2, 4), np.float32)
    n = np.array([2], np.int32)
    idx, logp = np.zeros((1, 2, 2), np.int32), np.zeros((1, 2, 2), np.float32)
    with pytest.raises(ValueError, match="spread"):
        topk_log_probs(idx, logp, 4, rest="uniform")
    with pytest.raises(ValueError, match="drop"):
        distill_loss(x, n, idx, logp, n, rest="uniform")
    with pytest.raises(ValueError, match="kl"):
        distill_loss(x, n, idx, logp, n, kind="mse")
    for temperature in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            distill_loss(x, n, idx, logp, n, temperature=temperature)
        with pytest.raises(ValueError, match="temperature"):
            full_kl(x, n, x, temperature=temperature)
