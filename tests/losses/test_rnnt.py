"""RNN-T loss against a brute-force numpy enumeration of every alignment."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.losses import rnnt


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _brute_force(logits_tuv: np.ndarray, labels: list[int], blank: int = 0, allowed=None):
    """(-log P(y|x), d(-log P)/d logits) by enumerating every alignment.

    An alignment is T blanks and U labels in some order, ending with the blank at
    (T-1, U): choose which of the first T+U-1 moves emit labels. With `allowed`, only the
    alignments whose every cell (t, u) satisfies allowed(t, u) count ((inf, 0) if none).
    """
    t_len, _, _ = logits_tuv.shape
    u_len = len(labels)
    logp = _log_softmax(logits_tuv)
    paths = []  # (log-prob, [(t, u, token)])
    for label_moves in itertools.combinations(range(t_len + u_len - 1), u_len):
        t = u = 0
        total, steps = 0.0, []
        for move in range(t_len + u_len):
            token = labels[u] if move in label_moves else blank
            steps.append((t, u, token))
            total += logp[t, u, token]
            u, t = (u + 1, t) if move in label_moves else (u, t + 1)
        if allowed is None or all(allowed(tt, uu) for tt, uu, _ in steps):
            paths.append((total, steps))
    grad = np.zeros_like(logp)
    if not paths:
        return np.inf, grad
    log_p = np.logaddexp.reduce([p for p, _ in paths])
    probs = np.exp(logp)
    for p, steps in paths:
        w = np.exp(p - log_p)
        for t, u, token in steps:
            grad[t, u] += w * probs[t, u]
            grad[t, u, token] -= w
    return -log_p, grad


def _logits_joiner(b: int, t: int, u1: int, v: int):
    """A joiner whose 'encoder output' is the whole lattice of logits (to test the loss
    against the enumeration with logits as the only input)."""

    def joiner(enc, pred):
        tc = enc.shape[1]
        return enc[:, :, 0, :].reshape(b, tc, u1, v) + 0.0 * pred[:, :, :, :1]

    return joiner


CASES = [  # (frames, labels) per utterance; padded to T=5, U=3, V=4
    (5, [1, 2, 1]),
    (3, [3, 3]),
    (4, []),
    (1, [2, 1]),
    (5, [2]),
]


@pytest.mark.parametrize(
    "frames_per_chunk, kernel", [(1, "xla"), (2, "xla"), (5, "xla"), (2, "pallas")]
)
def test_values_and_gradients_match_enumeration(frames_per_chunk, kernel):
    b, t, u, v = len(CASES), 5, 3, 4
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((b, t, u + 1, v)).astype(np.float32) * 2.0
    labels = np.zeros((b, u), np.int32)
    for i, (_, y) in enumerate(CASES):
        labels[i, : len(y)] = y
    frames = np.array([f for f, _ in CASES], np.int32)
    label_len = np.array([len(y) for _, y in CASES], np.int32)
    joiner = _logits_joiner(b, t, u + 1, v)
    pred = jnp.zeros((b, u + 1, 1))

    def total(flat_logits):
        loss, valid = rnnt.rnnt_loss(
            joiner,
            flat_logits,
            frames,
            pred,
            labels,
            label_len,
            frames_per_chunk=frames_per_chunk,
            kernel=kernel,
        )
        return jnp.sum(loss), (loss, valid)

    flat = jnp.asarray(logits.reshape(b, t, -1))
    (_, (loss, valid)), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(flat)
    grad = np.asarray(grad).reshape(logits.shape)
    assert bool(np.all(valid))
    for i, (f, y) in enumerate(CASES):
        want, want_grad = _brute_force(logits[i, :f, : len(y) + 1], y)
        np.testing.assert_allclose(loss[i], want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(grad[i, :f, : len(y) + 1], want_grad, atol=1e-4)
        # Cells outside the utterance's own lattice get no gradient.
        assert np.all(grad[i, f:] == 0) and np.all(grad[i, :, len(y) + 1 :] == 0)


def _tanh_joiner(params):
    def joiner(enc, pred):
        return jnp.tanh(enc + pred) @ params["w"] + params["b"]

    return joiner


def test_real_joiner_matches_enumeration_and_finite_differences():
    rng = np.random.default_rng(1)
    b, t, u, d, v = 2, 4, 2, 6, 5
    enc = rng.standard_normal((b, t, d)).astype(np.float32)
    pred = rng.standard_normal((b, u + 1, d)).astype(np.float32)
    params = {
        "w": rng.standard_normal((d, v)).astype(np.float32),
        "b": rng.standard_normal((v,)).astype(np.float32),
    }
    labels = np.array([[1, 4], [2, 0]], np.int32)
    label_len = np.array([2, 1], np.int32)
    frames = np.array([4, 3], np.int32)

    def total(params, enc):
        loss, _ = rnnt.rnnt_loss(
            _tanh_joiner(params), enc, frames, pred, labels, label_len, frames_per_chunk=3
        )
        return jnp.sum(loss), loss

    (_, loss), grads = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(params, enc)
    full_logits = np.tanh(enc[:, :, None, :] + pred[:, None, :, :]) @ params["w"] + params["b"]
    for i in range(b):
        y = labels[i, : label_len[i]].tolist()
        want, _ = _brute_force(full_logits[i, : frames[i], : len(y) + 1], y)
        np.testing.assert_allclose(loss[i], want, rtol=1e-5)

    # Central differences in float64 numpy on a few encoder and weight entries.
    def numpy_total(params, enc):
        logits = np.tanh(enc[:, :, None, :] + pred[:, None, :, :]) @ params["w"] + params["b"]
        return sum(
            _brute_force(
                logits[i, : frames[i], : label_len[i] + 1], labels[i, : label_len[i]].tolist()
            )[0]
            for i in range(b)
        )

    eps = 1e-3
    for name, index in [("enc", (0, 1, 2)), ("enc", (1, 2, 5)), ("w", (3, 4)), ("b", (0,))]:
        p64 = {k: x.astype(np.float64) for k, x in params.items()}
        e64 = enc.astype(np.float64)
        target = e64 if name == "enc" else p64[name]
        target[index] += eps
        up = numpy_total(p64, e64)
        target[index] -= 2 * eps
        down = numpy_total(p64, e64)
        fd = (up - down) / (2 * eps)
        got = grads[1][index] if name == "enc" else grads[0][name][index]
        np.testing.assert_allclose(got, fd, rtol=1e-3, atol=1e-4)


def test_no_frames_is_invalid_not_nan():
    joiner = _logits_joiner(1, 3, 2, 3)
    logits = jnp.zeros((1, 3, 6))
    loss, valid = rnnt.rnnt_loss(
        joiner, logits, jnp.array([0]), jnp.zeros((1, 2, 1)), jnp.array([[1]]), jnp.array([1])
    )
    assert not bool(valid[0]) and float(loss[0]) == 0.0


def test_never_holds_the_4d_log_softmax():
    """The compiled forward + backward needs far less scratch memory than one float32
    (B, T, U+1, V) array: the lattice's logits exist only a chunk at a time."""
    b, t, u, d, v = 2, 64, 16, 32, 512
    rng = np.random.default_rng(2)
    enc = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
    pred = jnp.asarray(rng.standard_normal((b, u + 1, d)), jnp.float32)
    params = {"w": jnp.asarray(rng.standard_normal((d, v)) * 0.1, jnp.float32), "b": jnp.zeros(v)}
    labels = jnp.asarray(rng.integers(1, v, (b, u)), jnp.int32)

    def total(params, enc):
        loss, _ = rnnt.rnnt_loss(
            _tanh_joiner(params),
            enc,
            jnp.full((b,), t),
            pred,
            labels,
            jnp.full((b,), u),
            frames_per_chunk=8,
        )
        return jnp.sum(loss)

    compiled = jax.jit(jax.grad(total, argnums=(0, 1))).lower(params, enc).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    full = b * t * (u + 1) * v * 4
    assert temp < full / 2, (temp, full)
