"""The length regulator and token averages against plain numpy loops."""

import jax
import numpy as np
import pytest

from jaxspeech.tts.length_regulator import frame_tokens, regulate, token_average


def _batch(seed: int, b: int = 6, n: int = 7, d: int = 3):
    """Random token vectors and durations with zeros inside, padding tokens (0) at the end
    of most rows and one row that owns no frame at all."""
    rng = np.random.default_rng(seed)
    durations = rng.integers(0, 5, (b, n))
    durations[rng.random((b, n)) < 0.25] = 0
    lengths = rng.integers(1, n + 1, b)
    durations[np.arange(n)[None, :] >= lengths[:, None]] = 0  # padding
    durations[-1] = 0
    return rng.standard_normal((b, n, d)).astype(np.float32), durations.astype(np.int32)


def _regulate_reference(h, durations, max_frames):
    b, _, d = h.shape
    out = np.zeros((b, max_frames, d), np.float32)
    mask = np.zeros((b, max_frames), bool)
    for i in range(b):
        frames = np.repeat(h[i], durations[i], axis=0)[:max_frames]
        out[i, : len(frames)] = frames
        mask[i, : len(frames)] = True
    return out, mask, durations.sum(1) > max_frames


@pytest.mark.parametrize("seed,max_frames", [(0, 40), (1, 12), (2, 1), (3, 9)])
def test_regulate_equals_np_repeat(seed, max_frames):
    h, durations = _batch(seed)
    got = jax.jit(regulate, static_argnums=2)(h, durations, max_frames)
    want = _regulate_reference(h, durations, max_frames)
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])
    np.testing.assert_array_equal(np.asarray(got[2]), want[2])


def test_regulate_overflow_cuts_at_max_frames():
    h = np.arange(3, dtype=np.float32)[None, :, None] + 1  # token vectors 1, 2, 3
    frames, mask, overflow = regulate(h, np.array([[2, 3, 4]]), 6)
    np.testing.assert_array_equal(np.asarray(frames)[0, :, 0], [1, 1, 2, 2, 2, 3])
    assert bool(mask.all()) and bool(overflow[0])
    frames, mask, overflow = regulate(h, np.array([[2, 3, 1]]), 6)
    assert bool(mask.all()) and not bool(overflow[0])  # exactly full is no overflow


def test_regulate_gradient_sums_over_each_tokens_frames():
    h, durations = _batch(4)
    max_frames = 15
    grad = jax.grad(lambda x: regulate(x, durations, max_frames)[0].sum())(h)
    frames_per_token = np.stack(
        [np.bincount(np.repeat(np.arange(7), d)[:max_frames], minlength=7) for d in durations]
    )
    np.testing.assert_array_equal(np.asarray(grad), np.repeat(frames_per_token[..., None], 3, -1))


def test_frame_tokens_index_and_totals():
    index, total = frame_tokens(np.array([[0, 2, 0, 1, 0]]), 5)
    np.testing.assert_array_equal(np.asarray(index), [[1, 1, 3, 5, 5]])
    assert int(total[0]) == 3


def _token_average_reference(values, durations, weights):
    b, n = durations.shape
    out = np.zeros((b, n), np.float32)
    for i in range(b):
        owner = np.repeat(np.arange(n), durations[i])[: values.shape[1]]
        for k in range(n):
            w = weights[i, : len(owner)][owner == k]
            v = values[i, : len(owner)][owner == k]
            out[i, k] = (w * v).sum() / w.sum() if w.sum() > 0 else 0.0
    return out


@pytest.mark.parametrize("seed,frames", [(5, 30), (6, 8)])  # 8 frames: totals overflow
def test_token_average_equals_numpy_loop(seed, frames):
    _, durations = _batch(seed)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((durations.shape[0], frames)).astype(np.float32)
    got = jax.jit(token_average)(values, durations)
    want = _token_average_reference(values, durations, np.ones_like(values))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    assert np.all(np.asarray(got)[durations == 0] == 0.0)


def test_token_average_over_weighted_frames_only():
    """E.g. pitch averaged over voiced frames: unvoiced frames (weight 0) do not count."""
    _, durations = _batch(7)
    rng = np.random.default_rng(7)
    values = rng.uniform(80, 300, (durations.shape[0], 30)).astype(np.float32)
    voiced = rng.random(values.shape) < 0.6
    got = token_average(values, durations, voiced)
    want = _token_average_reference(values, durations, voiced.astype(np.float32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    soft = rng.random(values.shape).astype(np.float32)  # float weights: a weighted mean
    np.testing.assert_allclose(
        np.asarray(token_average(values, durations, soft)),
        _token_average_reference(values, durations, soft),
        rtol=1e-5,
    )


def test_regulate_needs_a_token():
    with pytest.raises(ValueError, match="at least one token"):
        regulate(np.zeros((2, 0, 3)), np.zeros((2, 0), np.int32), 4)
