"""The RNN-T lattice kernels (jaxspeech/losses/kernels/rnnt.py, Pallas interpret mode on
the CPU) against the alignment enumeration of tests/losses/rnnt_reference.py (float64)
and against the XLA scans they replace: losses, and gradients w.r.t. the blank and
next-label log-prob lattices (each arc's posterior). End to end through the joiner,
`rnnt_loss` and `rnnt_pruned_loss` with kernel="pallas" are checked in test_rnnt.py and
test_rnnt_pruned.py beside the XLA path."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxspeech.losses import rnnt
from jaxspeech.losses.kernels import rnnt as kernel
from tests.losses import rnnt_reference as ref

# (frames, label count) per utterance on a T=5, U=3 lattice: full, padded in T and U, no
# labels, a single frame (with labels), a single frame without labels.
CASES = [(5, 3), (3, 2), (4, 0), (1, 2), (1, 0)]
T, U = 5, 3


def _lattices(rng, b, t, u):
    """Random (B, T, U+1) blank and next-label log-probs (each cell's blank and label
    probabilities sum below 1; the last column has no next label)."""
    logp = np.asarray(jax.nn.log_softmax(rng.standard_normal((b, t, u + 1, 3)) * 2, -1))
    label = logp[..., 1].copy()
    label[:, :, -1] = rnnt.LOG_ZERO
    return logp[..., 0].astype(np.float32), label.astype(np.float32)


def _arc_posteriors(blank_tu, label_tu, t_len, u_len):
    """(-log P, d(-log P)/d blank, d(-log P)/d label) by enumerating the alignments."""
    paths = ref.lattice_paths(blank_tu, label_tu, t_len, u_len)
    log_p = np.logaddexp.reduce([s for s, _ in paths])
    d_blank, d_label = np.zeros(blank_tu.shape), np.zeros(blank_tu.shape)
    for s, moves in paths:
        for t, u, is_label in moves:
            (d_label if is_label else d_blank)[t, u] -= np.exp(s - log_p)
    return -log_p, d_blank, d_label


@functools.cache  # one compilation per implementation and dtype
def _value_and_grads(impl, dtype=jnp.float32):
    def total(blank, label, frames, label_len):
        loss = rnnt.rnnt_loss_from_logprobs(
            blank.astype(dtype), label.astype(dtype), frames, label_len, kernel=impl
        )
        return jnp.sum(loss), loss

    return jax.jit(jax.value_and_grad(total, (0, 1), has_aux=True))


def test_full_lattice_matches_enumeration_and_the_scan():
    """Ragged T_b and U_b, U_b = 0, T_b = 1: the kernels' loss and lattice gradients are
    the enumeration's (cells outside an utterance's own lattice get exact zeros) and the
    XLA scan's; bf16 lattices give what their float32 values give."""
    rng = np.random.default_rng(0)
    blank, label = _lattices(rng, len(CASES), T, U)
    frames = np.array([f for f, _ in CASES], np.int32)
    label_len = np.array([n for _, n in CASES], np.int32)
    (_, loss), (d_blank, d_label) = _value_and_grads("pallas")(blank, label, frames, label_len)
    for i, (f, n) in enumerate(CASES):
        want, want_blank, want_label = _arc_posteriors(blank[i], label[i], f, n)
        np.testing.assert_allclose(loss[i], want, rtol=1e-5)
        np.testing.assert_allclose(d_blank[i, :f, : n + 1], want_blank[:f, : n + 1], atol=1e-5)
        np.testing.assert_allclose(d_label[i, :f, : n + 1], want_label[:f, : n + 1], atol=1e-5)
        assert not np.any(d_blank[i, f:]) and not np.any(d_blank[i, :, n + 1 :])
        assert not np.any(d_label[i, f:]) and not np.any(d_label[i, :, n + 1 :])
    (_, xla_loss), xla_grads = _value_and_grads("xla")(blank, label, frames, label_len)
    np.testing.assert_allclose(loss, xla_loss, rtol=1e-5)
    for got, want in zip((d_blank, d_label), xla_grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # bf16 inputs: float32 statistics of the rounded values.
    rounded = [np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in (blank, label)]
    (_, bf16_loss), _ = _value_and_grads("pallas", jnp.bfloat16)(blank, label, frames, label_len)
    (_, want_loss), _ = _value_and_grads("pallas")(*rounded, frames, label_len)
    np.testing.assert_allclose(bf16_loss, want_loss, rtol=1e-6)


def test_one_frame_no_labels_lattice():
    """T = 1, U = 0: a single cell (no loop iteration in either kernel); -log P is its
    blank's, whose gradient is -1."""
    blank = np.array([[[-0.7]], [[-2.5]]], np.float32)
    label = np.full_like(blank, rnnt.LOG_ZERO)
    ones = np.ones(2, np.int32)
    (_, loss), (d_blank, d_label) = _value_and_grads("pallas")(blank, label, ones, 0 * ones)
    np.testing.assert_allclose(loss, [0.7, 2.5], rtol=1e-6)
    assert d_blank.ravel().tolist() == [-1.0, -1.0] and not np.any(d_label)


def test_window_lattice_matches_the_window_scan():
    """The pruned windows' loss through the full-lattice kernels equals the XLA window
    recursion (`rnnt._window_loss`), gradients w.r.t. the (B, T, R) window log-probs
    included, on ranges chosen from random occupations; an utterance with more labels
    than its windows can climb is infinite in both and gets no gradient."""
    rng = np.random.default_rng(1)
    b, t, u, r = 4, 6, 5, 3
    frames = np.array([6, 4, 1, 2], np.int32)
    label_len = np.array([5, 2, 0, 5], np.int32)  # the last: 5 > (R-1) * 2 reachable
    occupation = rng.random((b, t, u + 1)).astype(np.float32)
    start = rnnt._ranges_from_occupation(jnp.asarray(occupation), frames, label_len, r)
    blank, label = _lattices(rng, b, t, r - 1)  # (B, T, R): any log-probs will do

    def total(impl, blank, label):
        if impl == "pallas":
            loss = kernel.window_nll(blank, label, start, frames, label_len, u + 1)
        else:
            loss = rnnt._window_loss(blank, label, start, frames, label_len)
        ok = rnnt._finite(loss)
        return jnp.sum(jnp.where(ok, loss, 0.0)), (loss, ok)

    grads = {
        impl: jax.jit(jax.value_and_grad(lambda *x, i=impl: total(i, *x), (0, 1), has_aux=True))(
            blank, label
        )
        for impl in ("pallas", "xla")
    }
    (_, (loss, ok)), got = grads["pallas"]
    (_, (want_loss, want_ok)), want = grads["xla"]
    assert ok.tolist() == want_ok.tolist() == [True, True, True, False]
    np.testing.assert_allclose(loss[:3], want_loss[:3], rtol=1e-5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
    assert not np.any(got[0][3]) and not np.any(got[1][3])


def test_compiled_kernels_run_on_each_devices_rows(monkeypatch):
    """Under a 2-device mesh the (non-interpreted) kernels of every RNN-T entry point run
    inside a shard_map over the batch axes, one program per local row: XLA would gather
    the global batch onto every device for a custom call. The full lattice's loss and
    gradient, and the pruned loss (the simple lattice's loss and occupation, then the
    windows'), each kernel call with a grid of 1 of the 2 rows. Traced only (a CPU cannot
    compile the GPU kernels), so the interpret switch is forced off."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    monkeypatch.setattr(kernel, "interpret_on", lambda platform: False)
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Auto,))

    def rows(*xs):
        return [jax.device_put(x, NamedSharding(mesh, PartitionSpec("data"))) for x in xs]

    def grids(fn, *args):
        with jax.set_mesh(mesh):
            jaxpr = str(jax.jit(jax.grad(fn)).trace(*rows(*args)).jaxpr)
        assert "shard_map[" in jaxpr
        return re.findall(r"grid=\((\d+),\)", jaxpr)

    t, u, v = 4, 3, 5
    frames, label_len = np.array([4, 3], np.int32), np.array([3, 1], np.int32)
    lattice = np.zeros((2, t, u + 1), np.float32)
    full = lambda blank, label, f, n: jnp.sum(  # noqa: E731
        rnnt.rnnt_loss_from_logprobs(blank, label, f, n, kernel="pallas")
    )
    assert grids(full, lattice, lattice, frames, label_len) == ["1", "1"]  # alpha, beta

    def pruned(enc, pred, lm, labels, f, n):
        simple, loss, _ = rnnt.rnnt_pruned_loss(
            lambda e, p: e + p, enc, f, pred, lambda x: x, enc, lm, labels, n,
            prune_range=2, frames_per_chunk=None, kernel="pallas",
        )  # fmt: skip
        return jnp.sum(simple + loss)

    enc, pred = np.zeros((2, t, v), np.float32), np.zeros((2, u + 1, v), np.float32)
    labels = np.ones((2, u), np.int32)
    # The simple lattice's alpha and beta (loss and occupation), the windows' alpha and beta.
    assert grids(pruned, enc, pred, pred, labels, frames, label_len) == ["1"] * 4
