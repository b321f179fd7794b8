"""The attention decoder's label-smoothed loss and the joint CTC-attention objective
against numpy: the smoothed distribution written out in full, padding ignored, and the
objective's ctc+aed weighting (jaxspeech.training.objective)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxspeech.losses.attention import joint_ctc_attention, label_smoothed_loss
from jaxspeech.training import objective


def np_label_smoothed(logits, targets, num, smoothing):
    """KL(q || softmax(logits)) summed over each row's first `num` positions, with q the
    full smoothed distribution (1 - s on the target, s / (V - 1) elsewhere)."""
    b, u, v = logits.shape
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    out = np.zeros(b)
    for i in range(b):
        for j in range(num[i]):
            q = np.full(v, smoothing / (v - 1))
            q[targets[i, j]] = 1.0 - smoothing
            nz = q > 0
            out[i] += np.sum(q[nz] * (np.log(q[nz]) - logp[i, j, nz]))
    return out


def _case(seed=0, b=3, u=6, v=7):
    rng = np.random.default_rng(seed)
    logits = 3 * rng.standard_normal((b, u, v))
    targets = rng.integers(0, v, (b, u)).astype(np.int32)
    num = np.array([u, 3, 1][:b], np.int32)
    return logits, targets, num


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_label_smoothed_loss_equals_numpy(smoothing):
    logits, targets, num = _case()
    got, ok = label_smoothed_loss(
        jnp.asarray(logits, jnp.float32),
        jnp.asarray(targets),
        jnp.asarray(num),
        smoothing=smoothing,
    )
    want = np_label_smoothed(logits, targets, num, smoothing)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert bool(jnp.all(ok))


def test_without_smoothing_it_is_the_cross_entropy():
    logits, targets, num = _case(1)
    got, _ = label_smoothed_loss(
        jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(num), smoothing=0.0
    )
    logp = jax.nn.log_softmax(jnp.asarray(logits), -1)
    ce = -np.take_along_axis(np.asarray(logp), targets[..., None], -1)[..., 0]
    want = [ce[i, : num[i]].sum() for i in range(3)]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_padding_positions_are_ignored_and_gradients_finite():
    """A padded row equals the row alone; garbage logits past the targets get no gradient."""
    logits, targets, num = _case(2)
    logits[1, 3:] = 1e4  # huge but finite garbage in the padding
    full, _ = label_smoothed_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(num))
    alone, _ = label_smoothed_loss(
        jnp.asarray(logits[1:2, :3]), jnp.asarray(targets[1:2, :3]), jnp.asarray([3])
    )
    np.testing.assert_allclose(full[1], alone[0], rtol=1e-6)

    def total(x):
        return jnp.sum(label_smoothed_loss(x, jnp.asarray(targets), jnp.asarray(num))[0])

    g = np.asarray(jax.grad(total)(jnp.asarray(logits, jnp.float32)))
    assert np.all(np.isfinite(g)) and np.all(g[1, 3:] == 0.0) and np.abs(g[1, :3]).max() > 0


def test_non_finite_logits_make_the_row_invalid_not_nan():
    logits, targets, num = _case(3)
    logits[2, 0, 0] = np.nan
    loss, ok = label_smoothed_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(num))
    assert list(np.asarray(ok)) == [True, True, False] and float(loss[2]) == 0.0


def test_bad_smoothing_is_one_clear_error():
    logits, targets, num = _case()
    with pytest.raises(ValueError, match=r"label smoothing must be in \[0, 1\)"):
        label_smoothed_loss(
            jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(num), smoothing=1.0
        )


def test_joint_loss_is_espnets_weighting():
    ctc, att = np.array([4.0, 2.0]), np.array([1.0, 3.0])
    got = joint_ctc_attention(jnp.asarray(ctc), jnp.asarray(att), 0.3)
    np.testing.assert_allclose(np.asarray(got), 0.3 * ctc + 0.7 * att, rtol=1e-6)
    cfg = ConfigDict({"ctc_weight": 0.3})
    parts = {"ctc": jnp.asarray(ctc), "att": jnp.asarray(att)}
    np.testing.assert_allclose(objective.combine_parts(parts, cfg), 0.3 * ctc + 0.7 * att)
    # The other heads keep their objectives.
    parts = {"ctc": jnp.asarray(ctc), "rnnt": jnp.asarray(att)}
    np.testing.assert_allclose(objective.combine_parts(parts, cfg), att + 0.3 * ctc)
    np.testing.assert_allclose(objective.combine_parts({"ctc": jnp.asarray(ctc)}, cfg), ctc)
