"""Pruned RNN-T loss (k2's method) against independent numpy references
(tests/losses/rnnt_reference.py, float64, no jaxspeech code):

- the simple lattice against a direct 4-D log-softmax of am[t] + lm[u];
- the simple loss and the pruned loss against the enumeration of every alignment (for the
  pruned loss, of the alignments whose every cell lies in its frame's window
  [s_t, s_t + R)), their gradients against the enumeration's (through the chain rule of
  the joiner) and against central differences of the numpy loss in float64;
- the prune ranges against what `rnnt_prune_ranges` promises: the docstring's constraints,
  the most occupied window of each frame (occupations by enumeration) whenever those
  windows already meet the constraints, and the Viterbi path of the simple lattice when
  it holds most of the probability;
- the losses benchmark's reported losses against the forward recursions in numpy.

The loss code computes in float32 whatever its inputs (it casts them), so the code runs in
float32 and only the references run in float64."""

import functools
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspeech.losses import rnnt
from tests.losses import rnnt_reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (frames, labels) per utterance, padded to T=5, U=3 (V=5): ragged T and U, an empty label
# sequence, a single frame, and a single frame with two labels.
CASES = [(5, [1, 2, 1]), (3, [3, 3]), (4, []), (1, [2, 1]), (5, [4])]
T, U, V = 5, 3, 5


def _batch(cases=CASES, u=U):
    labels = np.zeros((len(cases), u), np.int32)
    for i, (_, y) in enumerate(cases):
        labels[i, : len(y)] = y
    frames = np.array([f for f, _ in cases], np.int32)
    label_len = np.array([len(y) for _, y in cases], np.int32)
    return labels, frames, label_len


@functools.partial(jax.jit, static_argnums=(5, 6))
def _simple_ranges(am, lm, labels, frames, label_len, prune_range, blank_id):
    blank, label = rnnt.rnnt_simple_logprobs(am, lm, labels, blank_id=blank_id)
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


def _tanh_joiner(params):
    def joiner(enc, pred):
        return jnp.tanh(enc + pred) @ params["w"] + params["b"]

    return joiner


def _tanh_logits(params, enc_td, pred_ud):
    """The same joiner in numpy: (T, U+1, V) logits of one utterance."""
    return np.tanh(enc_td[:, None, :] + pred_ud[None, :, :]) @ params["w"] + params["b"]


def _tanh_chain_rule(params, enc_td, pred_ud, g_tuv):
    """d/d(w, b, enc, pred) of a function of the tanh joiner's logits, from its gradient
    g_tuv w.r.t. the logits."""
    h = np.tanh(enc_td[:, None, :] + pred_ud[None, :, :])  # (T, U+1, D)
    g_w = np.einsum("tud,tuv->dv", h, g_tuv)
    g_z = (g_tuv @ params["w"].T) * (1 - h**2)
    return g_w, g_tuv.sum((0, 1)), g_z.sum(1), g_z.sum(0)


def _central_difference(fn, arrays: dict, name: str, index: tuple, eps: float = 1e-5):
    """d fn(**arrays) / d arrays[name][index] by central differences, in float64."""
    up = {k: np.array(a, np.float64) for k, a in arrays.items()}
    down = {k: np.array(a, np.float64) for k, a in arrays.items()}
    up[name][index] += eps
    down[name][index] -= eps
    return (fn(**up) - fn(**down)) / (2 * eps)


def _window(start_t, r):
    """allowed(t, u) for the enumeration: the cell lies in frame t's window."""
    return lambda t, u: start_t[t] <= u < start_t[t] + r


# ------------------------------------------------------------------------------ simple


def test_simple_logprobs_match_direct_log_softmax():
    """The simple joiner's log-probs are log_softmax(am[t] + lm[u]) over V, formed here as
    the (B, T, U+1, V) tensor the code avoids (blank_id=2 checks the blank column)."""
    rng = np.random.default_rng(0)
    b, t, u, v = 3, 6, 4, 7
    am = rng.standard_normal((b, t, v)).astype(np.float32) * 3
    lm = rng.standard_normal((b, u + 1, v)).astype(np.float32) * 3
    labels = rng.integers(1, v, (b, u)).astype(np.int32)
    blank, label = jax.jit(rnnt.rnnt_simple_logprobs, static_argnames="blank_id")(
        am, lm, labels, blank_id=2
    )
    logp = ref.log_softmax(am[:, :, None, :] + lm[:, None, :, :])  # (B, T, U+1, V)
    np.testing.assert_allclose(blank, logp[..., 2], atol=1e-5)
    want = np.take_along_axis(logp[:, :, :u], labels[:, None, :, None], -1)[..., 0]
    np.testing.assert_allclose(label[:, :, :u], want, atol=1e-5)
    assert np.all(np.asarray(label[:, :, u]) == rnnt.LOG_ZERO)


def test_simple_loss_matches_enumeration():
    """The simple loss through a real acoustic projection (am = x @ w + c), run 2 frames at a
    time (T = 5: the last chunk overlaps its predecessor), against the enumeration with
    logits am[t] + lm[u]; gradients for x, w, c and lm against the enumeration's by the
    chain rule, and against central differences of the numpy loss."""
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
    assert valid.tolist() == [True] * b

    def numpy_losses(x, w, c, lm):
        am = x @ w + c
        return [
            ref.nll_by_enumeration(am[i, :f, None, :] + lm[i, None, : len(y) + 1, :], y)
            for i, (f, y) in enumerate(CASES)
        ]

    want_w, want_c = np.zeros((d, V)), np.zeros(V)
    for i, ((f, y), (want, want_grad)) in enumerate(
        zip(CASES, numpy_losses(x.astype(np.float64), w, c, lm), strict=True)
    ):
        np.testing.assert_allclose(simple[i], want, rtol=1e-5, atol=1e-4)
        # logits[t, u] = am[t] + lm[u]: the chain rule sums over the other index.
        g_am = want_grad.sum(1)  # (T_b, V)
        np.testing.assert_allclose(g_x[i, :f], g_am @ w.T, atol=1e-4)
        np.testing.assert_allclose(g_lm[i, : len(y) + 1], want_grad.sum(0), atol=1e-4)
        assert np.all(np.asarray(g_x[i, f:]) == 0) and np.all(
            np.asarray(g_lm[i, len(y) + 1 :]) == 0
        )
        want_w += x[i, :f].T @ g_am
        want_c += g_am.sum(0)
    np.testing.assert_allclose(g_w, want_w, atol=1e-4)
    np.testing.assert_allclose(g_c, want_c, atol=1e-4)

    def numpy_total(x, w, c, lm):
        return sum(loss for loss, _ in numpy_losses(x, w, c, lm))

    arrays = {"x": x, "w": w, "c": c, "lm": lm}
    got = {"x": g_x, "w": g_w, "c": g_c, "lm": g_lm}
    for name, index in [("x", (0, 1, 2)), ("w", (1, 3)), ("c", (0,)), ("lm", (1, 2, 3))]:
        fd = _central_difference(numpy_total, arrays, name, index)
        np.testing.assert_allclose(got[name][index], fd, rtol=1e-3, atol=1e-4)


# ------------------------------------------------------------------------------ pruned


def test_wide_windows_match_full_enumeration():
    """R >= U+1 keeps the whole lattice (R = U+2 also checks the window is cut to U+1): the
    pruned loss of a tanh joiner is the enumeration over every alignment; its gradients are
    the enumeration's through the joiner's chain rule and match central differences; the
    ranges carry no gradient, so am and lm get exact zeros."""
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

    (_, (loss, valid)), (g_params, g_enc, g_pred, g_am, g_lm) = jax.jit(
        jax.value_and_grad(pruned, argnums=tuple(range(5)), has_aux=True)
    )(params, enc, pred, am, lm)
    assert valid.tolist() == [True] * b

    def numpy_losses(w, b, enc, pred):
        p = {"w": w, "b": b}
        return [
            ref.nll_by_enumeration(_tanh_logits(p, enc[i, :f], pred[i, : len(y) + 1]), y)
            for i, (f, y) in enumerate(CASES)
        ]

    p64 = {k: a.astype(np.float64) for k, a in params.items()}
    want_w, want_b = np.zeros_like(p64["w"]), np.zeros_like(p64["b"])
    losses = numpy_losses(p64["w"], p64["b"], enc.astype(np.float64), pred.astype(np.float64))
    for i, ((f, y), (want, want_grad)) in enumerate(zip(CASES, losses, strict=True)):
        n = len(y)
        np.testing.assert_allclose(loss[i], want, rtol=1e-5, atol=1e-4)
        gw, gb, genc, gpred = _tanh_chain_rule(p64, enc[i, :f], pred[i, : n + 1], want_grad)
        np.testing.assert_allclose(g_enc[i, :f], genc, atol=1e-4)
        np.testing.assert_allclose(g_pred[i, : n + 1], gpred, atol=1e-4)
        assert np.all(np.asarray(g_enc[i, f:]) == 0) and np.all(np.asarray(g_pred[i, n + 1 :]) == 0)
        want_w += gw
        want_b += gb
    np.testing.assert_allclose(g_params["w"], want_w, atol=1e-4)
    np.testing.assert_allclose(g_params["b"], want_b, atol=1e-4)
    assert np.all(np.asarray(g_am) == 0) and np.all(np.asarray(g_lm) == 0)

    def numpy_total(w, b, enc, pred):
        return sum(nll for nll, _ in numpy_losses(w, b, enc, pred))

    arrays = {"w": params["w"], "b": params["b"], "enc": enc, "pred": pred}
    got = {"w": g_params["w"], "b": g_params["b"], "enc": g_enc, "pred": g_pred}
    for name, index in [("w", (2, 1)), ("b", (3,)), ("enc", (0, 2, 4)), ("pred", (1, 1, 0))]:
        fd = _central_difference(numpy_total, arrays, name, index)
        np.testing.assert_allclose(got[name][index], fd, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    "frames_per_chunk, blank_id, kernel", [(None, 0, "xla"), (4, 3, "xla"), (4, 3, "pallas")]
)
def test_narrow_windows_match_windowed_enumeration(frames_per_chunk, blank_id, kernel):
    """R = 2 on a T=6, U=4 lattice: the pruned loss sums exactly the alignments that stay in
    the windows the ranges chose, and its gradient is theirs. (blank_id=3: tokens 0 and 3
    swap roles, for the blank's column in both the simple and the full lattice.)"""
    rng = np.random.default_rng(3)
    swap = {0: blank_id, blank_id: 0}
    cases = [(6, [1, 2, 3, 4]), (4, [2, 2, 1]), (5, []), (2, [3]), (3, [1, 4])]
    cases = [(f, [swap.get(k, k) for k in y]) for f, y in cases]
    b, t, u, v, r = len(cases), 6, 4, 5, 2
    labels, frames, label_len = _batch(cases, u)
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
            blank_id=blank_id,
            frames_per_chunk=frames_per_chunk,
            kernel=kernel,
        )
        return jnp.sum(loss), (loss, valid)

    flat = jnp.asarray(logits.reshape(b, t, -1))
    (_, (loss, valid)), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(flat)
    grad = np.asarray(grad).reshape(logits.shape)
    start = np.asarray(_simple_ranges(am, lm, labels, frames, label_len, r, blank_id))
    assert valid.tolist() == [True] * b
    for i, (f, y) in enumerate(cases):
        lattice = logits[i, :f, : len(y) + 1]
        want, want_grad = ref.nll_by_enumeration(lattice, y, blank_id, _window(start[i], r))
        np.testing.assert_allclose(loss[i], want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(grad[i, :f, : len(y) + 1], want_grad, atol=1e-4)
        assert np.all(grad[i, f:] == 0) and np.all(grad[i, :, len(y) + 1 :] == 0)
    # Some windows really prune (else this test would only repeat the wide-window one).
    full, _ = ref.nll_by_enumeration(logits[0], cases[0][1], blank_id)
    assert float(loss[0]) > full + 1e-3


def test_unreachable_and_empty_inputs_are_invalid_and_isolated():
    """No frames, or more labels than the windows can climb (U_b > (R-1) T_b), mark the
    utterance invalid with zero losses and exactly zero gradients; the valid utterance
    beside them keeps its enumerated losses and gradients."""
    b, t, u, v, d, r = 3, 3, 5, 4, 2, 2
    rng = np.random.default_rng(6)
    enc = rng.standard_normal((b, t, d)).astype(np.float32)
    pred = rng.standard_normal((b, u + 1, d)).astype(np.float32)
    am = rng.standard_normal((b, t, v)).astype(np.float32)
    lm = rng.standard_normal((b, u + 1, v)).astype(np.float32)
    params = {"w": rng.standard_normal((d, v)).astype(np.float32), "b": np.zeros(v, np.float32)}
    labels = np.ones((b, u), np.int32)
    # No frames; 5 labels in 2 frames with R = 2 (at most T_b = 2 reachable); fine.
    frames, label_len = np.array([0, 2, 3], np.int32), np.array([1, 5, 2], np.int32)

    def total(params, enc):
        simple, pruned, valid = rnnt.rnnt_pruned_loss(
            _tanh_joiner(params),
            enc,
            frames,
            jnp.asarray(pred),
            _given,
            am,
            lm,
            labels,
            label_len,
            prune_range=r,
        )
        return jnp.sum(simple + pruned), (simple, pruned, valid)

    grad_fn = jax.jit(jax.value_and_grad(total, (0, 1), has_aux=True))
    (_, (simple, pruned, valid)), (g_params, g_enc) = grad_fn(params, enc)
    assert valid.tolist() == [False, False, True]
    assert simple.tolist()[:2] == [0.0, 0.0] and pruned.tolist()[:2] == [0.0, 0.0]
    assert np.all(np.asarray(g_enc[:2]) == 0)
    # The valid utterance: 3 frames, labels [1, 1].
    f, y = 3, [1, 1]
    want_simple, _ = ref.nll_by_enumeration(am[2, :f, None, :] + lm[2, None, :3, :], y)
    np.testing.assert_allclose(simple[2], want_simple, rtol=1e-5)
    start = np.asarray(_simple_ranges(am, lm, labels, np.maximum(frames, 1), label_len, r, 0))
    p64 = {k: a.astype(np.float64) for k, a in params.items()}
    lattice = _tanh_logits(p64, enc[2, :f], pred[2, :3])
    want_pruned, g_logits = ref.nll_by_enumeration(lattice, y, allowed=_window(start[2], r))
    np.testing.assert_allclose(pruned[2], want_pruned, rtol=1e-5)
    # The simple loss does not depend on the joiner or enc: the gradients are the pruned one's.
    g_w, g_b, g_enc2, _ = _tanh_chain_rule(p64, enc[2, :f], pred[2, :3], g_logits)
    np.testing.assert_allclose(g_params["w"], g_w, atol=1e-4)
    np.testing.assert_allclose(g_params["b"], g_b, atol=1e-4)
    np.testing.assert_allclose(g_enc[2], g_enc2, atol=1e-4)
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


# ------------------------------------------------------------------------------ ranges


def _check_range_properties(start, frames, label_len, r):
    """The constraints `rnnt_prune_ranges` documents, with R = r: s_0 = 0, non-decreasing,
    s_{t+1} <= s_t + R - 1, 0 <= s_t <= max(U_b - R + 1, 0), and frames at and past T_b - 1
    start at max(U_b - R + 1, 0) (so the last frame's window holds U_b)."""
    for i in range(start.shape[0]):
        f, n = int(frames[i]), int(label_len[i])
        last = max(n - r + 1, 0)
        s = start[i, :f]
        assert s[0] == 0, (i, start[i])
        assert np.all(np.diff(s) >= 0) and np.all(np.diff(s) <= r - 1), (i, start[i])
        assert np.all(s >= 0) and np.all(s <= last), (i, start[i])
        assert np.all(start[i, f - 1 :] == last), (i, start[i])
        assert s[-1] <= n < s[-1] + r


def _most_occupied_windows(occ_tu, u1, r):
    """Start of each frame's most occupied window of r rows among 0 .. u1 - r (the lowest
    of exact ties, which only windows differing by rows of zero occupation can make), or
    None when two different windows are too close to call in float32."""
    occ = np.pad(occ_tu, ((0, 0), (0, u1 - occ_tu.shape[1])))
    sums = np.stack([occ[:, s : s + r].sum(1) for s in range(u1 - r + 1)], axis=1)
    best = sums.max(1, keepdims=True)
    if np.any((sums > best - 1e-4) & (sums < best - 1e-12)):
        return None
    return np.argmax(sums >= best - 1e-12, axis=1)


@pytest.mark.parametrize("r", [2, 3, 6])
def test_ranges_follow_the_simple_lattice_occupation(r):
    """Random simple lattices (T=6, U=5, V=5, ragged): the windows meet the constraints,
    and whenever the most occupied windows (occupation = posterior probability of visiting
    a cell, by enumeration) already meet them, the windows are exactly those: then
    there is nothing to adjust. (r = 6 > U: one window of every row.)"""
    rng = np.random.default_rng(4 + r)
    b, t, u, v = 48, 6, 5, 5
    rr = min(r, u + 1)
    frames = rng.integers(1, t + 1, b).astype(np.int32)
    label_len = np.minimum(rng.integers(0, u + 1, b), (rr - 1) * frames).astype(np.int32)
    labels = rng.integers(1, v, (b, u)).astype(np.int32)
    scale = rng.uniform(1.0, 2.5, (b, 1, 1))
    am = (rng.standard_normal((b, t, v)) * scale).astype(np.float32)
    lm = (rng.standard_normal((b, u + 1, v)) * scale).astype(np.float32)
    start = np.asarray(_simple_ranges(am, lm, labels, frames, label_len, r, 0))
    assert start.dtype == np.int32 and start.shape == (b, t)
    _check_range_properties(start, frames, label_len, rr)
    exact = moved = 0
    for i in range(b):
        f, n = int(frames[i]), int(label_len[i])
        y = labels[i, :n].tolist()
        blank, label = ref.lattice_logprobs(am[i, :f, None, :] + lm[i, None, : n + 1, :], y)
        best = _most_occupied_windows(ref.occupation_by_enumeration(blank, label, f, n), u + 1, rr)
        if best is None:
            continue
        last = max(n - rr + 1, 0)
        want = np.where(np.arange(t) < f - 1, np.pad(best, (0, t - f)), last)
        steps = np.diff(want[:f])
        if want[0] == 0 and np.all((steps >= 0) & (steps <= rr - 1)) and np.all(want <= last):
            np.testing.assert_array_equal(start[i], want, err_msg=f"utterance {i}")
            exact += 1
            moved += bool(np.any(best[: f - 1] > 0))
    # Enough lattices are checked exactly, some of them with windows off row 0.
    assert exact >= b // 2, exact
    if rr <= u:
        assert moved >= 3, moved


def test_range_adjustment_on_arbitrary_occupations():
    """Any occupation (here random, so the best windows jump up and down from frame to
    frame) gives windows that meet every constraint; an occupation that singles out
    windows already meeting them (rows [s_t, s_t + R) occupied 1, the rest below 1/2)
    gives exactly those windows back."""
    rng = np.random.default_rng(8)
    b, t, u, r = 64, 8, 7, 3
    frames = rng.integers(1, t + 1, b).astype(np.int32)
    label_len = np.minimum(rng.integers(0, u + 1, b), (r - 1) * frames).astype(np.int32)
    adjust = jax.jit(rnnt._ranges_from_occupation, static_argnums=3)
    occupation = rng.random((b, t, u + 1)).astype(np.float32)
    _check_range_properties(
        np.asarray(adjust(occupation, frames, label_len, r)), frames, label_len, r
    )

    want = np.zeros((b, t), np.int32)
    occupation = (rng.random((b, t, u + 1)) * 0.49).astype(np.float32)
    for i in range(b):
        f, last = int(frames[i]), max(int(label_len[i]) - r + 1, 0)
        while True:  # a random feasible path of starts from 0 to `last` at frame f - 1
            s = np.minimum(np.cumsum(np.r_[0, rng.integers(0, r, f - 1)]), last)
            if s[-1] == last or f == 1:
                break
        want[i] = np.r_[s[: f - 1], [last] * (t - f + 1)]
        for frame in range(f):
            occupation[i, frame, want[i, frame] : want[i, frame] + r] = 1.0
    got = np.asarray(adjust(occupation, frames, label_len, r))
    np.testing.assert_array_equal(got, want)
    assert want.max() > 0


def test_ranges_cover_a_dominant_viterbi_path():
    """If one alignment has posterior p > R/(R+1) and visits at most R cells per frame, every
    window holds its cells: a window holding that frame's cells of it has occupation at
    least p k (k cells), any other at most p (k-1) + (1-p) R, which is less; and the
    adjustments keep them (the path itself meets the constraints). Such a path is the
    Viterbi path: found here by numpy Viterbi on the simple lattice, its posterior by the
    numpy forward recursion."""
    rng = np.random.default_rng(5)
    b, t, u, v, r = 96, 8, 6, 5, 3
    frames = rng.integers(3, t + 1, b).astype(np.int32)
    label_len = np.minimum(rng.integers(1, u + 1, b), (r - 1) * frames).astype(np.int32)
    labels = rng.integers(1, v, (b, u)).astype(np.int32)
    # Large logits: peaked lattices, many of them with one dominant alignment.
    am = (rng.standard_normal((b, t, v)) * 6).astype(np.float32)
    lm = (rng.standard_normal((b, u + 1, v)) * 6).astype(np.float32)
    start = np.asarray(_simple_ranges(am, lm, labels, frames, label_len, r, 0))
    _check_range_properties(start, frames, label_len, r)
    covered = off_row_0 = 0
    for i in range(b):
        f, n = int(frames[i]), int(label_len[i])
        y = labels[i, :n].tolist()
        blank, label = ref.lattice_logprobs(am[i, :f, None, :] + lm[i, None, : n + 1, :], y)
        score, cells = ref.viterbi(blank, label, f, n)
        posterior = np.exp(score + ref.forward_nll(blank, label, f, n))
        cells_per_frame = np.bincount([tt for tt, _ in cells], minlength=f)
        if posterior > r / (r + 1) and cells_per_frame.max() <= r:
            for frame, row in cells:
                assert start[i, frame] <= row < start[i, frame] + r, (i, cells, start[i])
            covered += 1
            off_row_0 += bool(start[i, : f - 1].max() > 0)
    assert covered >= 20 and off_row_0 >= 5, (covered, off_row_0)


# ------------------------------------------------------------------------------ memory


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


# ------------------------------------------------------------------------------ benchmark


def test_benchmark_quick_run_reports_the_losses_it_measures(tmp_path):
    """benchmarks/losses.py --quick: the mean losses it reports at its seeded initialization
    are those of the heads its docstring describes, recomputed here in numpy (forward
    recursions, checked first against the enumerations on small slices); its 4-D size and
    its peaks are consistent with the case's shapes."""
    spec = importlib.util.spec_from_file_location(
        "losses_benchmark", os.path.join(ROOT, "benchmarks", "losses.py")
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "losses.json"
    bench.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["jax"] == jax.__version__ and result["date"] and result["device"]
    (row,) = result["cases"]
    b, t, u, v = row["B"], row["T"], row["U"], row["V"]
    assert (b, t, u, v) == (2, 40, 8, 64)
    # One float32 (2, 40, 9, 64) tensor: 184320 * 4 bytes = 0.17578125 MiB.
    assert row["logsoftmax_4d_mb"] == 0.17578125

    params, (enc, enc_len, pred, labels, label_len) = bench.make_inputs(b, t, u, v)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    enc, pred = np.asarray(enc, np.float64), np.asarray(pred, np.float64)

    def linear(name, x):
        return x @ p[name]["w"] + p[name]["b"]

    enc_proj, pred_proj = linear("enc_proj", enc), linear("pred_proj", pred)
    am, lm = linear("simple_am", enc), linear("simple_lm", pred)
    ctc_logits = linear("ctc", enc)
    # The windows are the code's (tested above); the sums over them are numpy's.
    start = np.asarray(
        _simple_ranges(
            am.astype(np.float32), lm.astype(np.float32), labels, enc_len, label_len, 5, 0
        )
    )
    full, simple, pruned, ctc = [], [], [], []
    for i in range(b):
        f, n = int(enc_len[i]), int(label_len[i])
        y = np.asarray(labels[i, :n]).tolist()
        logits = np.tanh(enc_proj[i, :f, None] + pred_proj[i, None, : n + 1]) @ p["out"]["w"]
        logits += p["out"]["b"]
        lattice = ref.lattice_logprobs(logits, y)
        if i == 0:  # the forward recursions agree with the enumerations
            small = logits[:4, :4], y[:3]
            for window in (None, lambda tt, uu: abs(tt - uu) <= 1):
                want, _ = ref.nll_by_enumeration(*small, allowed=window)
                got = ref.forward_nll(*ref.lattice_logprobs(*small), 4, 3, allowed=window)
                assert got == pytest.approx(want, rel=1e-12)
            for y_small in ([1, 2], [1, 1], []):
                logits_small = logits[:4, 0, :3]
                want = ref.ctc_nll_by_enumeration(logits_small, y_small)
                assert ref.ctc_nll(logits_small, y_small) == pytest.approx(want, rel=1e-12)
        full.append(ref.forward_nll(*lattice, f, n))
        pruned.append(ref.forward_nll(*lattice, f, n, allowed=_window(start[i], 5)))
        simple_lattice = ref.lattice_logprobs(am[i, :f, None] + lm[i, None, : n + 1], y)
        simple.append(ref.forward_nll(*simple_lattice, f, n))
        ctc.append(ref.ctc_nll(ctc_logits[i, :f], y))
    assert row["rnnt_full_loss"] == pytest.approx(np.mean(full), rel=1e-4)
    assert row["rnnt_pruned_loss"] == pytest.approx(
        np.mean(pruned) + 0.5 * np.mean(simple), rel=1e-4
    )
    assert row["ctc_loss"] == pytest.approx(np.mean(ctc), rel=1e-4)
    # Fewer alignments: the pruned loss is above the full one (else nothing was pruned).
    assert np.mean(pruned) > np.mean(full) + 1e-3

    # Arguments every head's step takes: all six dense layers (two 256x256, four 256x64,
    # with biases), enc (2, 40, 256) and pred (2, 9, 256) float32, and 20 int32 ids and
    # lengths: (2 * 65792 + 4 * 16448 + 20480 + 4608) * 4 + 20 * 4 = 889936 bytes.
    args_mb = 889936 / 2**20
    for head in ("rnnt_full", "rnnt_pruned", "ctc"):
        assert row[f"{head}_ms"] > 0, head
        if "memory_analysis" in result["peak_method"]:
            # Peak = scratch + arguments + outputs (3-decimal rounding on each).
            assert row[f"{head}_peak_mb"] >= row[f"{head}_xla_temp_mb"] + args_mb - 2e-3, head
