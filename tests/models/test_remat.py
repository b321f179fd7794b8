"""Rematerialization of the scanned Conformer blocks under dropout: what configs/conformer.py
trains with (model.conformer.remat="dots", scan_layers, dropout 0.1). The recomputed
forward pass must draw the same dropout masks as the first, so the loss and gradients
equal those of no rematerialization (tests/models/test_streaming.py checks the policies
without dropout)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.models.conformer import ConformerEncoder

F = 20
TINY = dict(
    dim=16, num_layers=2, num_heads=2, ff_mult=2, conv_kernel=5, subsampling_channels=4, dropout=0.3
)


def _encoder(remat: str, params: dict | None = None) -> ConformerEncoder:
    """A tiny scanned encoder built abstractly, holding `params` (else random ones)."""
    enc = nnx.eval_shape(
        lambda: ConformerEncoder(
            num_features=F, scan_layers=True, remat=remat, **TINY, rngs=nnx.Rngs(0)
        )
    )
    state = nnx.state(enc, nnx.Param)
    if params is None:
        rng = np.random.default_rng(0)

        def draw(path, leaf):
            name = str(path[-1].key)
            if name == "scale":  # LayerNorm
                return 1 + 0.1 * rng.standard_normal(leaf.shape, np.float32)
            fan_in = max(1, int(np.prod(leaf.shape[1:-1])) if len(leaf.shape) > 2 else 1)
            return 0.3 * rng.standard_normal(leaf.shape, np.float32) / np.sqrt(fan_in)

        params = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, params)
    nnx.update(enc, state)
    return enc


def test_remat_under_dropout_gives_the_loss_and_gradients_of_no_remat():
    feats = jnp.asarray(np.random.default_rng(1).standard_normal((2, 48, F)), jnp.float32)
    lengths = jnp.array([48, 33])

    def loss(m, deterministic=False):
        rngs = None if deterministic else nnx.Rngs(jax.random.key(3))
        out, out_len = m(feats, lengths, deterministic=deterministic, rngs=rngs)
        valid = jnp.arange(out.shape[1])[None, :, None] < out_len[:, None, None]
        return jnp.sum(jnp.where(valid, out, 0.0) ** 2)

    grad_fn = nnx.jit(nnx.value_and_grad(loss))
    base = _encoder("none")
    params = nnx.to_pure_dict(nnx.state(base, nnx.Param))
    ref_loss, ref_grads = grad_fn(base)
    ref_grads = nnx.to_pure_dict(nnx.state(ref_grads, nnx.Param))
    # Dropout is really on: the deterministic loss differs.
    assert abs(float(nnx.jit(loss, static_argnums=1)(base, True)) - float(ref_loss)) > 1e-3
    value, grads = grad_fn(_encoder("dots", params))
    np.testing.assert_allclose(float(value), float(ref_loss), rtol=1e-6)
    grads = nnx.to_pure_dict(nnx.state(grads, nnx.Param))
    # Recomputation may round differently: float32 rounding, relative to the largest.
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * (1 + np.abs(b).max())),
        grads,
        ref_grads,
    )
