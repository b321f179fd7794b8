"""Pruned RNN-T loss: the simple lattice, the prune ranges and the pruned loss against
numpy references (direct 4-D log-softmax, enumeration of the alignments inside the windows,
the chain rule through the simple acoustic projection) and against the full `rnnt_loss`."""

import functools
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.losses import rnnt
from tests.losses.test_rnnt import _brute_force, _log_softmax, _tanh_joiner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (frames, labels) per utterance, padded to T=5, U=3 (V=5): ragged T and U, an empty label
# sequence, a single frame, and a single frame with two labels.
CASES = [(5, [1, 2, 1]), (3, [3, 3]), (4, []), (1, [2, 1]), (5, [4])]
T, U, V = 5, 3, 5


def _batch():
    labels = np.zeros((len(CASES), U), np.int32)
    for i, (_, y) in enumerate(CASES):
        labels[i, : len(y)] = y
    frames = np.array([f for f, _ in CASES], np.int32)
    label_len = np.array([len(y) for _, y in CASES], np.int32)
    return labels, frames, label_len


@functools.partial(jax.jit, static_argnums=5)
def _simple_ranges(am, lm, labels, frames, label_len, prune_range):
    blank, label = rnnt.rnnt_simple_logprobs(am, lm, labels)
    return rnnt.rnnt_prune_ranges(blank, label, frames, label_len, prune_range)


def _given(am):
    """simple_am for tests that give the acoustic logits themselves: the identity."""
    return am


def _table_joiner(u1: int, v: int):
    """A joiner whose encoder output carries its frame's whole (U+1, V) table of logits and
    whose predictor output is the one-hot row index: it returns table[t, u] exactly, so the
    loss can be checked with the logits as the only input, full or pruned."""

    def joiner(enc, pred):
        table = enc.reshape(*enc.shape[:-1], u1, v)  # (B, T', 1, U+1, V)
        return jnp.sum(table * pred[..., None], axis=-2)  # pred (B, T'|1, R, U+1, 1)

    return joiner


def test_simple_logprobs_match_direct_log_softmax():
    rng = np.random.default_rng(0)
    b, t, u, v = 3, 6, 4, 7
    am = rng.standard_normal((b, t, v)).astype(np.float32) * 3
    lm = rng.standard_normal((b, u + 1, v)).astype(np.float32) * 3
    labels = rng.integers(1, v, (b, u)).astype(np.int32)
    blank, label = jax.jit(rnnt.rnnt_simple_logprobs, static_argnames="blank_id")(
        am, lm, labels, blank_id=2
    )
    logp = _log_softmax(am[:, :, None, :] + lm[:, None, :, :])  # (B, T, U+1, V)
    np.testing.assert_allclose(blank, logp[..., 2], atol=1e-5)
    want = np.take_along_axis(logp[:, :, :u], labels[:, None, :, None], -1)[..., 0]
    np.testing.assert_allclose(label[:, :, :u], want, atol=1e-5)
    assert np.all(np.asarray(label[:, :, u]) == rnnt.LOG_ZERO)


def test_simple_loss_matches_enumeration():
    """The simple loss through a real acoustic projection (am = x @ w + c), run 2 frames at a
    time (T = 5: the last chunk overlaps its predecessor), against the enumeration, with
    gradients for x, w, c and lm by the chain rule."""
    rng = np.random.default_rng(1)
    labels, frames, label_len = _batch()
    b, d = len(CASES), 3
    x = rng.standard_normal((b, T, d)).astype(np.float32)
    w = rng.standard_normal((d, V)).astype(np.float32) * 1.5
    c = rng.standard_normal(V).astype(np.float32)
    lm = rng.standard_normal((b, U + 1, V)).astype(np.float32) * 2
    # The pruned half is not checked here: any joiner will do.
    enc = jnp.zeros((b, T, (U + 1) * V))
    pred = jnp.eye(U + 1)[None].repeat(b, 0)
    joiner = _table_joiner(U + 1, V)

    def total(x, w, c, lm):
        simple, _, valid = rnnt.rnnt_pruned_loss(
            joiner,
            enc,
            frames,
            pred,
            lambda x_chunk: x_chunk @ w + c,
            x,
            lm,
            labels,
            label_len,
            prune_range=U + 1,
            frames_per_chunk=2,
        )
        return jnp.sum(simple), (simple, valid)

    (_, (simple, valid)), (g_x, g_w, g_c, g_lm) = jax.jit(
        jax.value_and_grad(total, argnums=(0, 1, 2, 3), has_aux=True)
    )(x, w, c, lm)
    assert bool(np.all(valid))
    am = x.astype(np.float64) @ w + c
    want_w, want_c = np.zeros((d, V)), np.zeros(V)
    for i, (f, y) in enumerate(CASES):
        logits = am[i, :f, None, :] + lm[i, None, : len(y) + 1, :]
        want, want_grad = _brute_force(logits, y)
        np.testing.assert_allclose(simple[i], want, rtol=1e-5, atol=1e-4)
        # logits[t, u] = am[t] + lm[u]: the chain rule sums over the other index.
        g_am = want_grad.sum(1)  # (T_b, V)
        np.testing.assert_allclose(g_x[i, :f], g_am @ w.T, atol=1e-4)
        np.testing.assert_allclose(g_lm[i, : len(y) + 1], want_grad.sum(0), atol=1e-4)
        assert np.all(np.asarray(g_x[i, f:]) == 0)
        want_w += x[i, :f].T @ g_am
        want_c += g_am.sum(0)
    np.testing.assert_allclose(g_w, want_w, atol=1e-4)
    np.testing.assert_allclose(g_c, want_c, atol=1e-4)


def test_wide_windows_equal_full_loss():
    """R >= U+1 keeps the whole lattice (R = U+2 also checks the window is cut to U+1)."""
    prune_range = U + 2
    rng = np.random.default_rng(2)
    labels, frames, label_len = _batch()
    b, d = len(CASES), 6
    enc = rng.standard_normal((b, T, d)).astype(np.float32)
    pred = rng.standard_normal((b, U + 1, d)).astype(np.float32)
    am = rng.standard_normal((b, T, V)).astype(np.float32)
    lm = rng.standard_normal((b, U + 1, V)).astype(np.float32)
    params = {
        "w": rng.standard_normal((d, V)).astype(np.float32),
        "b": rng.standard_normal((V,)).astype(np.float32),
    }

    def pruned(params, enc, pred, am, lm):
        _, loss, valid = rnnt.rnnt_pruned_loss(
            _tanh_joiner(params),
            enc,
            frames,
            pred,
            _given,
            am,
            lm,
            labels,
            label_len,
            prune_range=prune_range,
        )
        return jnp.sum(loss), (loss, valid)

    def full(params, enc, pred, am, lm):
        loss, valid = rnnt.rnnt_loss(
            _tanh_joiner(params), enc, frames, pred, labels, label_len, frames_per_chunk=2
        )
        return jnp.sum(loss + 0.0 * (jnp.sum(am) + jnp.sum(lm))), (loss, valid)

    args = (params, enc, pred, am, lm)
    argnums = tuple(range(5))
    (_, (got, got_valid)), got_g = jax.jit(
        jax.value_and_grad(pruned, argnums=argnums, has_aux=True)
    )(*args)
    (_, (want, want_valid)), want_g = jax.jit(
        jax.value_and_grad(full, argnums=argnums, has_aux=True)
    )(*args)
    assert bool(np.all(got_valid)) and bool(np.all(want_valid))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)
    # The ranges carry no gradient: the pruned loss does not depend on am or lm.
    assert np.all(np.asarray(got_g[3]) == 0) and np.all(np.asarray(got_g[4]) == 0)


@pytest.mark.parametrize("frames_per_chunk", [None, 4])
def test_narrow_windows_match_windowed_enumeration(frames_per_chunk):
    """R = 2 on a T=6, U=4 lattice: the pruned loss sums exactly the alignments that stay in
    the windows the ranges chose, and its gradient is theirs."""
    rng = np.random.default_rng(3)
    cases = [(6, [1, 2, 3, 4]), (4, [2, 2, 1]), (5, []), (2, [3]), (3, [1, 4])]
    b, t, u, v, r = len(cases), 6, 4, 5, 2
    labels = np.zeros((b, u), np.int32)
    for i, (_, y) in enumerate(cases):
        labels[i, : len(y)] = y
    frames = np.array([f for f, _ in cases], np.int32)
    label_len = np.array([len(y) for _, y in cases], np.int32)
    logits = rng.standard_normal((b, t, u + 1, v)).astype(np.float32) * 2
    am = rng.standard_normal((b, t, v)).astype(np.float32) * 2
    lm = rng.standard_normal((b, u + 1, v)).astype(np.float32) * 2
    pred = jnp.eye(u + 1)[None].repeat(b, 0)
    joiner = _table_joiner(u + 1, v)

    def total(flat):
        _, loss, valid = rnnt.rnnt_pruned_loss(
            joiner,
            flat,
            frames,
            pred,
            _given,
            am,
            lm,
            labels,
            label_len,
            prune_range=r,
            frames_per_chunk=frames_per_chunk,
        )
        return jnp.sum(loss), (loss, valid)

    flat = jnp.asarray(logits.reshape(b, t, -1))
    (_, (loss, valid)), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(flat)
    grad = np.asarray(grad).reshape(logits.shape)
    start = np.asarray(_simple_ranges(am, lm, labels, frames, label_len, r))
    assert bool(np.all(valid))
    for i, (f, y) in enumerate(cases):

        def allowed(tt, uu, i=i):
            return start[i, tt] <= uu < start[i, tt] + r

        want, want_grad = _brute_force(logits[i, :f, : len(y) + 1], y, allowed=allowed)
        full, _ = _brute_force(logits[i, :f, : len(y) + 1], y)
        np.testing.assert_allclose(loss[i], want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(grad[i, :f, : len(y) + 1], want_grad, atol=1e-4)
        assert np.all(grad[i, f:] == 0) and np.all(grad[i, :, len(y) + 1 :] == 0)
        assert want >= full - 1e-9  # fewer alignments, never a higher probability
    # Some windows really prune (else this test would only repeat the full-loss one).
    assert float(loss[0]) > _brute_force(logits[0], cases[0][1])[0] + 1e-3


def _check_range_properties(start, frames, label_len, r):
    for i in range(start.shape[0]):
        f, n = int(frames[i]), int(label_len[i])
        s = start[i, :f]
        assert s[0] == 0
        assert np.all(np.diff(s) >= 0) and np.all(np.diff(s) <= r - 1)
        assert np.all(s >= 0) and np.all(s <= max(n - r + 1, 0))
        assert s[-1] <= n < s[-1] + r


def test_range_properties_on_random_lattices():
    rng = np.random.default_rng(4)
    for b, t, u, v, r in [(4, 9, 6, 5, 2), (5, 7, 3, 4, 5), (3, 4, 10, 5, 4)]:
        frames = rng.integers(1, t + 1, b).astype(np.int32)
        # Label counts the windows can reach: U_b <= (R-1) T_b.
        label_len = np.minimum(rng.integers(0, u + 1, b), (r - 1) * frames).astype(np.int32)
        labels = rng.integers(1, v, (b, u)).astype(np.int32)
        am = rng.standard_normal((b, t, v)).astype(np.float32) * 3
        lm = rng.standard_normal((b, u + 1, v)).astype(np.float32) * 3
        start = _simple_ranges(am, lm, labels, frames, label_len, r)
        assert start.dtype == jnp.int32 and start.shape == (b, t)
        _check_range_properties(np.asarray(start), frames, label_len, min(r, u + 1))


def test_range_adjustment_on_arbitrary_occupations():
    """Whatever the occupation (here random, so the best windows jump up and down from
    frame to frame), the adjusted windows keep every constraint."""
    rng = np.random.default_rng(8)
    b, t, u, r = 64, 8, 7, 3
    frames = rng.integers(1, t + 1, b).astype(np.int32)
    label_len = np.minimum(rng.integers(0, u + 1, b), (r - 1) * frames).astype(np.int32)
    occupation = rng.random((b, t, u + 1)).astype(np.float32)
    adjust = jax.jit(rnnt._ranges_from_occupation, static_argnums=3)
    start = np.asarray(adjust(occupation, frames, label_len, r))
    _check_range_properties(start, frames, label_len, r)


def test_ranges_cover_a_dominant_path():
    """Each lattice has one alignment with almost all the probability; the windows must
    contain every cell it visits."""
    rng = np.random.default_rng(5)
    b, t, u, r = 6, 10, 8, 3
    frames = rng.integers(4, t + 1, b).astype(np.int32)
    blank = np.full((b, t, u + 1), -12.0, np.float32)
    label = np.full((b, t, u + 1), -12.0, np.float32)
    label_len, paths = np.zeros(b, np.int32), []
    for i in range(b):
        # Labels emitted on each frame: at most r - 1, so that one window can hold them.
        per_frame = rng.integers(0, r, frames[i])
        per_frame[np.cumsum(per_frame) > u] = 0
        label_len[i] = per_frame.sum()
        cells, row = [], 0
        for frame, k in enumerate(per_frame):
            for _ in range(k):
                label[i, frame, row] = -0.01
                cells.append((frame, row))
                row += 1
            blank[i, frame, row] = -0.01
            cells.append((frame, row))
        paths.append(cells)
    ranges = jax.jit(rnnt.rnnt_prune_ranges, static_argnums=4)
    start = np.asarray(ranges(blank, label, frames, label_len, r))
    _check_range_properties(start, frames, label_len, r)
    for i, cells in enumerate(paths):
        for frame, row in cells:
            assert start[i, frame] <= row < start[i, frame] + r, (i, frame, row, start[i])
    # Not trivially: some windows start above row 0.
    assert start.max() > 0


def test_unreachable_and_empty_inputs_are_invalid_not_nan():
    b, t, u, v, d = 3, 3, 5, 4, 2
    rng = np.random.default_rng(6)
    enc = jnp.asarray(rng.standard_normal((b, t, d)), jnp.float32)
    pred = jnp.asarray(rng.standard_normal((b, u + 1, d)), jnp.float32)
    am = jnp.asarray(rng.standard_normal((b, t, v)), jnp.float32)
    lm = jnp.asarray(rng.standard_normal((b, u + 1, v)), jnp.float32)
    params = {"w": jnp.asarray(rng.standard_normal((d, v)), jnp.float32), "b": jnp.zeros(v)}
    labels = jnp.ones((b, u), jnp.int32)
    # No frames; 5 labels in 2 frames with R = 2 (at most T_b = 2 reachable); fine.
    frames, label_len = jnp.array([0, 2, 3]), jnp.array([1, 5, 2])

    def total(params, enc):
        simple, pruned, valid = rnnt.rnnt_pruned_loss(
            _tanh_joiner(params),
            enc,
            frames,
            pred,
            _given,
            am,
            lm,
            labels,
            label_len,
            prune_range=2,
        )
        return jnp.sum(simple + pruned), (simple, pruned, valid)

    grad_fn = jax.jit(jax.value_and_grad(total, (0, 1), has_aux=True))
    (_, (simple, pruned, valid)), grads = grad_fn(params, enc)
    assert valid.tolist() == [False, False, True]
    assert float(simple[0]) == float(pruned[0]) == float(pruned[1]) == 0.0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    with pytest.raises(ValueError, match="prune_range"):
        rnnt.rnnt_pruned_loss(
            _tanh_joiner(params),
            enc,
            frames,
            pred,
            _given,
            am,
            lm,
            labels,
            label_len,
            prune_range=1,
        )


def _pruned_grad_temp_bytes(b, t, u, d, v, frames_per_chunk):
    """Scratch bytes of the compiled forward + backward of the pruned loss, with gradients
    for the joiner, both simple projections and every input (as in training)."""
    rng = np.random.default_rng(7)

    def normal(*shape, scale=1.0):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    params = {
        "w": normal(d, v, scale=0.1),
        "b": jnp.zeros(v),
        "am": normal(d, v, scale=0.1),
        "lm": normal(d, v, scale=0.1),
    }
    enc, pred = normal(b, t, d), normal(b, u + 1, d)
    labels = jnp.asarray(rng.integers(1, v, (b, u)), jnp.int32)

    def total(params, enc, pred):
        simple, pruned, _ = rnnt.rnnt_pruned_loss(
            _tanh_joiner(params),
            enc,
            jnp.full((b,), t),
            pred,
            lambda x: x @ params["am"],
            enc,
            pred @ params["lm"],
            labels,
            jnp.full((b,), u),
            prune_range=4,
            frames_per_chunk=frames_per_chunk,
        )
        return jnp.sum(simple + pruned)

    grad = jax.jit(jax.grad(total, argnums=(0, 1, 2)))
    return grad.lower(params, enc, pred).compile().memory_analysis().temp_size_in_bytes


def test_pruned_path_never_holds_lattice_sized_tensors():
    """Forward + backward of the pruned loss, a few frames at a time, needs less scratch
    memory than one float32 (B, T, V) array (let alone a (B, T, U+1, V) one): the simple
    joiner's acoustic logits, their exponentials and gradients never exist for all frames.
    (All frames at once, frames_per_chunk=None, the same call takes about ten such arrays:
    the check fails if they ever come back.)"""
    b, t, u, d, v = 2, 128, 8, 16, 512
    chunked = _pruned_grad_temp_bytes(b, t, u, d, v, frames_per_chunk=4)
    assert chunked < b * t * v * 4, chunked


def test_benchmark_quick_run_writes_its_keys(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "losses_benchmark", os.path.join(ROOT, "benchmarks", "losses.py")
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "losses.json"
    bench.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["peak_method"] and result["jax"] and result["date"] and result["device"]
    assert result["cases"]
    for case in result["cases"]:
        for key in (
            "rnnt_full_ms",
            "rnnt_full_peak_mb",
            "rnnt_pruned_ms",
            "rnnt_pruned_peak_mb",
            "ctc_ms",
            "logsoftmax_4d_mb",
        ):
            assert case[key] > 0, (key, case)
