"""LSTM layer and encoder against a plain numpy LSTM, finite differences and masking rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from jaxspeech.models.lstm import LSTMEncoder, LSTMLayer, stack_frames
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel.rules import DEFAULT_RULES, logical_to_spec, state_shardings


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _numpy_lstm(x, lengths, w_x, w_h, bias, w_proj, reverse):
    """Reference: one row at a time, one frame at a time, float64; zeros past each length."""
    b, t, _ = x.shape
    out_dim = w_h.shape[0]
    y = np.zeros((b, t, out_dim))
    for r in range(b):
        h, c = np.zeros(out_dim), np.zeros(w_h.shape[2])
        frames = range(lengths[r] - 1, -1, -1) if reverse else range(lengths[r])
        for s in frames:
            pre = np.einsum("d,dgh->gh", x[r, s], w_x) + np.einsum("p,pgh->gh", h, w_h) + bias
            i, f, g, o = _sigmoid(pre[0]), _sigmoid(pre[1]), np.tanh(pre[2]), _sigmoid(pre[3])
            c = f * c + i * g
            h = o * np.tanh(c)
            if w_proj is not None:
                h = h @ w_proj
            y[r, s] = h
    return y


def _random(make, seed, scale=0.5):
    """Build a module abstractly and fill every parameter with scaled normal noise.

    The bias is random too, so the gate layout is tested; skipping the real
    initializers saves an eager compile per parameter shape.
    """
    module = nnx.eval_shape(make)
    rng = np.random.default_rng(seed)
    state = nnx.state(module, nnx.Param)
    state = jax.tree.map(
        lambda a: jnp.asarray(scale * rng.standard_normal(a.shape), a.dtype), state
    )
    nnx.update(module, state)
    return module


def _np_params(layer):
    w_proj = None if layer.w_proj is None else np.asarray(layer.w_proj[...], np.float64)
    return (
        np.asarray(layer.w_x[...], np.float64),
        np.asarray(layer.w_h[...], np.float64),
        np.asarray(layer.bias[...], np.float64),
        w_proj,
    )


def _jit_apply(module, **kw):
    """One compiled program for the whole module call (eager calls recompile each scan)."""
    graphdef, state = nnx.split(module)
    fn = jax.jit(lambda st, *args: nnx.merge(graphdef, st)(*args, **kw))
    return lambda *args: fn(state, *args)


def _mask(lengths, t):
    return jnp.arange(t)[None, :] < jnp.asarray(lengths)[:, None]


LENGTHS = np.array([6, 3, 0, 5])


@pytest.mark.parametrize("proj_dim", [0, 3])
@pytest.mark.parametrize("reverse", [False, True])
def test_layer_equals_numpy_lstm(proj_dim, reverse):
    layer = _random(lambda: LSTMLayer(4, 5, proj_dim=proj_dim, rngs=nnx.Rngs(0)), 1)
    x = np.random.default_rng(2).standard_normal((4, 6, 4)).astype(np.float32)
    got = np.asarray(layer(jnp.asarray(x), _mask(LENGTHS, 6), reverse=reverse))
    want = _numpy_lstm(x.astype(np.float64), LENGTHS, *_np_params(layer), reverse)
    assert got.shape == (4, 6, proj_dim or 5)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("proj_dim", [0, 2])
def test_step_loop_equals_call(proj_dim):
    layer = _random(lambda: LSTMLayer(3, 4, proj_dim=proj_dim, rngs=nnx.Rngs(3)), 4)
    x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 5, 3)), jnp.float32)
    carry, ys = layer.init_carry(2), []
    for s in range(5):
        carry, y = layer.step(carry, x[:, s])
        ys.append(y)
    want = layer(x, jnp.ones((2, 5), bool))
    np.testing.assert_allclose(np.stack(ys, axis=1), np.asarray(want), atol=1e-6)
    assert carry[0].shape == (2, proj_dim or 4) and carry[1].dtype == jnp.float32


def _encoder(**kw):
    args = dict(num_features=3, hidden=4, num_layers=2) | kw
    return _random(lambda: LSTMEncoder(**args, rngs=nnx.Rngs(0)), 9)


FEAT_LENGTHS = np.array([9, 4, 7])


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(stack_frames=3, lookahead=2, proj_dim=3),
        dict(bidirectional=True, stack_frames=2, proj_dim=2, output_dim=5),
    ],
)
def test_encoder_padding_invariance(kw):
    enc = _encoder(**kw)
    rng = np.random.default_rng(10)
    feats = rng.standard_normal((3, 9, 3)).astype(np.float32)
    # Different garbage past each length, and 5 extra frames of it.
    other = np.concatenate([feats, rng.standard_normal((3, 5, 3)).astype(np.float32)], axis=1)
    for r, n in enumerate(FEAT_LENGTHS):
        other[r, n:] = rng.standard_normal(other[r, n:].shape) * 10
    apply = _jit_apply(enc, deterministic=True)
    a, la = apply(jnp.asarray(feats), jnp.asarray(FEAT_LENGTHS))
    b, lb = apply(jnp.asarray(other), jnp.asarray(FEAT_LENGTHS))
    k = kw.get("stack_frames", 1)
    np.testing.assert_array_equal(np.asarray(la), -(-FEAT_LENGTHS // k))
    np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
    assert a.shape == (3, -(-9 // k), kw.get("output_dim", 4)) and b.shape[1] == -(-14 // k)
    for r, n in enumerate(np.asarray(la)):
        np.testing.assert_allclose(np.asarray(a[r, :n]), np.asarray(b[r, :n]), atol=1e-5)


def _reverse_valid(x_btd, lengths_b):
    """Reverse each row's first lengths[r] frames in place; padding frames stay where they are."""
    t = np.arange(x_btd.shape[1])[None, :]
    n = np.asarray(lengths_b)[:, None]
    idx = np.where(t < n, n - 1 - t, t)
    return jnp.take_along_axis(x_btd, jnp.asarray(idx)[..., None], axis=1)


def test_bidirectional_encoder_equals_manual_composition():
    """Each layer = [forward LSTM, forward LSTM run on each row's reversed valid part, reversed]."""
    enc = _encoder(bidirectional=True, stack_frames=2, proj_dim=3)
    feats = np.random.default_rng(11).standard_normal((3, 9, 3)).astype(np.float32)
    got, lens = _jit_apply(enc, deterministic=True)(jnp.asarray(feats), jnp.asarray(FEAT_LENGTHS))

    n = -(-FEAT_LENGTHS // 2)  # stacked lengths, known outside the traced function

    def manual(feats):
        h, _ = stack_frames(feats, jnp.asarray(FEAT_LENGTHS), 2)
        mask = _mask(n, h.shape[1])
        for fw, bw in zip(enc.fw_layers, enc.bw_layers):
            back = _reverse_valid(bw(_reverse_valid(h, n), mask), n)
            h = jnp.concatenate([fw(h, mask), back], axis=-1)
        return enc.out(enc.norm(h))

    want = jax.jit(manual)(jnp.asarray(feats))
    np.testing.assert_array_equal(np.asarray(lens), n)
    for r, n in enumerate(np.asarray(lens)):
        np.testing.assert_allclose(np.asarray(got[r, :n]), np.asarray(want[r, :n]), atol=1e-5)


def test_stack_frames_layout_and_lengths():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 7, 2)).astype(np.float32)
    lengths = np.array([7, 5, 1, 6])
    got, got_len = stack_frames(jnp.asarray(x), jnp.asarray(lengths), 3)
    want = np.zeros((4, 3, 6), np.float32)
    for r in range(4):
        for j in range(3):
            for i in range(3):
                s = 3 * j + i
                if s < lengths[r]:
                    want[r, j, 2 * i : 2 * i + 2] = x[r, s]
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(got_len), [3, 2, 1, 2])


def test_lookahead_sees_exactly_n_future_frames():
    n, k = 2, 2  # n counts stacked frames
    enc = _encoder(lookahead=n, stack_frames=k)
    rng = np.random.default_rng(13)
    feats = rng.standard_normal((1, 8 * k, 3)).astype(np.float32)
    lengths = jnp.array([8 * k])
    apply = _jit_apply(enc, deterministic=True)
    base, _ = apply(jnp.asarray(feats), lengths)
    for s in (3, 6):  # a stacked frame; perturb the raw frames inside it
        moved = feats.copy()
        moved[0, s * k : (s + 1) * k] += 1.0
        out, _ = apply(jnp.asarray(moved), lengths)
        diff = np.abs(np.asarray(out - base))[0].max(axis=-1)
        np.testing.assert_array_equal(diff[: s - n], 0.0)  # t + n < s: cannot see frame s
        assert diff[s - n] > 1e-4  # t + n == s: sees it


def test_lookahead_with_bidirectional_is_rejected():
    with pytest.raises(ValueError, match="unidirectional"):
        LSTMEncoder(
            num_features=3,
            hidden=4,
            num_layers=1,
            bidirectional=True,
            lookahead=1,
            rngs=nnx.Rngs(0),
        )


def _finite_difference_check(model, loss_of_model, eps=1e-6):
    """Every parameter's gradient against central differences, in float64."""
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), state)
    theta, unravel = ravel_pytree(state)
    loss = jax.jit(lambda th: loss_of_model(nnx.merge(graphdef, unravel(th))))
    grad = np.asarray(jax.grad(loss)(theta))
    eye = jnp.eye(theta.size, dtype=jnp.float64) * eps
    plus_minus = np.asarray(jax.vmap(loss)(jnp.concatenate([theta + eye, theta - eye])))
    fd = (plus_minus[: theta.size] - plus_minus[theta.size :]) / (2 * eps)
    assert np.all(grad != 0)  # every parameter reaches the loss
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)


def test_layer_gradients_equal_finite_differences():
    # Built outside the x64 context (its parameters are float32 until the check casts
    # them), so nothing float64 outlives the test.
    layer = _random(lambda: LSTMLayer(3, 4, proj_dim=2, dtype=jnp.float64, rngs=nnx.Rngs(14)), 15)
    with jax.enable_x64(True):
        rng = np.random.default_rng(16)
        x = jnp.asarray(rng.standard_normal((2, 5, 3)))
        cot_f, cot_b = (jnp.asarray(rng.standard_normal((2, 5, 2))) for _ in range(2))
        mask = _mask(np.array([5, 3]), 5)

        def loss(m):
            y_f = m(x, mask)
            y_b = m(x, mask, reverse=True)
            return jnp.sum(jnp.sin(y_f) * cot_f) + jnp.sum(y_b * cot_b)

        _finite_difference_check(layer, loss)


def test_encoder_jit_forward_backward_and_logical_names():
    enc = LSTMEncoder(
        num_features=3,
        hidden=4,
        num_layers=2,
        bidirectional=True,
        proj_dim=2,
        stack_frames=2,
        dropout=0.5,
        output_dim=6,
        rngs=nnx.Rngs(17),
    )
    # The real initializers: forget-gate bias (gate 1 of i, f, g, o) at 1, the rest at 0.
    for layer in [*enc.fw_layers, *enc.bw_layers]:
        want = np.zeros((4, 4), np.float32)
        want[1] = 1.0
        np.testing.assert_array_equal(np.asarray(layer.bias[...]), want)
    feats = jnp.asarray(np.random.default_rng(18).standard_normal((3, 9, 3)), jnp.float32)
    lengths = jnp.asarray(FEAT_LENGTHS)
    graphdef, params = nnx.split(enc, nnx.Param)

    @jax.jit
    def loss_and_grad(params, key):
        def loss(p):
            m = nnx.merge(graphdef, p)
            y, out_len = m(feats, lengths, deterministic=False, rngs=nnx.Rngs(dropout=key))
            mask = jnp.arange(y.shape[1])[None, :] < out_len[:, None]
            return jnp.sum(jnp.where(mask[..., None], y, 0.0) ** 2)

        return jax.value_and_grad(loss)(params)

    l1, grads = loss_and_grad(params, jax.random.key(0))
    l2, _ = loss_and_grad(params, jax.random.key(1))
    assert np.isfinite(float(l1)) and float(l1) != float(l2)  # dropout draws from the key
    known = {name for name, _ in DEFAULT_RULES}
    flat = nnx.to_flat_state(params)
    assert len(flat) == 2 * 2 * 4 + 2 + 2  # (w_x, w_h, bias, w_proj) per layer and direction
    for (path, var), (_, g) in zip(flat, nnx.to_flat_state(grads)):
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == var.get_value().ndim, path
        assert {a for a in axes if a is not None} <= known, path
        logical_to_spec(axes)  # every name has a rule
        assert np.all(np.isfinite(g.get_value())) and np.any(g.get_value() != 0), path
    names = {"/".join(map(str, p)) for p, _ in flat}
    assert "bw_layers/1/w_proj" in names and "fw_layers/0/w_x" in names


def test_sharded_encoder_equals_single_device():
    """On a (data, fsdp, tensor) = (2, 2, 2) mesh with the rules' shardings, same outputs."""
    enc = _encoder(hidden=8, proj_dim=4, bidirectional=True, num_features=4)
    feats = np.random.default_rng(19).standard_normal((4, 6, 4)).astype(np.float32)
    lengths = np.array([6, 2, 5, 4])
    want, _ = _jit_apply(enc, deterministic=True)(jnp.asarray(feats), jnp.asarray(lengths))
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    graphdef, state = nnx.split(enc)
    params = jax.device_put(nnx.to_pure_dict(state), state_shardings(state, mesh))
    assert params["fw_layers"][0]["w_x"].sharding.spec == P("fsdp", None, "tensor")
    assert params["fw_layers"][0]["w_h"].sharding.spec == P(None, None, "tensor")
    batch = mesh_lib.host_to_global(mesh, {"feats": feats, "lengths": lengths})
    fn = jax.jit(lambda p, f, n: nnx.merge(graphdef, p)(f, n, deterministic=True)[0])
    with jax.set_mesh(mesh):
        got = fn(params, batch["feats"], batch["lengths"])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
