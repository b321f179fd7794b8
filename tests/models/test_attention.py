"""Rotary attention and the attention-kernel choice: rotary embeddings against a complex-
number rotation, RotaryAttention against a numpy brute force, "auto" on CPU, explicit
choices the model cannot run, and the cuDNN path lowered for a GPU (one fused call)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspeech.config import validate as validate_lib
from jaxspeech.models import attention_ops
from jaxspeech.models.layers import RotaryAttention


def _rotate_np(x_bthk, positions, base=attention_ops.ROPE_BASE):
    """Pairs (i, i + K/2) as complex numbers times exp(1j * position * base^(-2i/K))."""
    k = x_bthk.shape[-1]
    z = x_bthk[..., : k // 2] + 1j * x_bthk[..., k // 2 :]
    freq = base ** (-np.arange(k // 2) * 2.0 / k)
    z = z * np.exp(1j * positions[None, :, None, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def test_rotate_equals_complex_rotation_and_keeps_only_distances():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    pos = np.arange(5) + 3
    got = np.asarray(attention_ops.rotate(jnp.asarray(x), jnp.asarray(pos)))
    np.testing.assert_allclose(got, _rotate_np(x, pos), atol=1e-5)
    # q_i . k_j depends on i - j only: shifting every position changes no score.
    q, k = x, rng.standard_normal(x.shape).astype(np.float32)
    s0 = np.einsum("bthk,bshk->bhts", _rotate_np(q, pos), _rotate_np(k, pos))
    s1 = np.einsum("bthk,bshk->bhts", _rotate_np(q, pos + 17), _rotate_np(k, pos + 17))
    np.testing.assert_allclose(s0, s1, atol=1e-4)


def test_rotary_attention_equals_numpy_brute_force():
    d, h, t = 16, 2, 7
    attn = RotaryAttention(d, h, 0.0, dtype=jnp.float32, rngs=nnx.Rngs(0), attention="xla")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, t, d)).astype(np.float32)
    mask = np.arange(t)[None, :] < np.array([[t], [4]])
    got = np.asarray(attn(jnp.asarray(x), jnp.asarray(mask), deterministic=True, rngs=None))

    p = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(attn, nnx.Param)))
    mu = x.mean(-1, keepdims=True)
    xn = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    xn = xn * p["norm"]["scale"] + p["norm"]["bias"]
    q, k, v = (np.einsum("btd,dhk->bthk", xn, p[w]) for w in ("wq", "wk", "wv"))
    q, k = _rotate_np(q, np.arange(t)), _rotate_np(k, np.arange(t))
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(d // h)
    scores = np.where(mask[:, None, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.einsum("bthk,hkd->btd", np.einsum("bhts,bshk->bthk", probs, v), p["wo"])
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_auto_is_xla_on_cpu_and_impossible_choices_are_refused():
    from jax._src.mesh import AbstractDevice  # what a mesh of GPU devices carries

    assert attention_ops.resolve_attention("auto", jnp.bfloat16, 64) == "xla"  # CPU backend
    gpu = AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
    with jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("data",), abstract_device=gpu)
    ):  # the mesh a step is traced under decides, as in a deviceless GPU plan
        assert attention_ops.resolve_attention("auto", jnp.bfloat16, 64) == "cudnn"
        assert attention_ops.resolve_attention("auto", jnp.float32, 64) == "xla"
        assert attention_ops.resolve_attention("auto", jnp.bfloat16, 36) == "xla"
    assert attention_ops.resolve_attention("xla", jnp.float32, 36) == "xla"
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention_ops.resolve_attention("cudnn", jnp.float32, 64)
    with pytest.raises(ValueError, match="multiple of 8"):
        attention_ops.resolve_attention("cudnn", jnp.bfloat16, 36)
    with pytest.raises(ValueError, match="even head dim"):
        RotaryAttention(15, 5, 0.0, dtype=jnp.float32, rngs=nnx.Rngs(0))


def test_validation_names_the_keys_of_an_impossible_attention():
    from configs import demo

    c = demo.get_config("tiny")
    c.model.conformer.attention = "cudnn"  # the tiny model computes in float32
    c.model.conformer.pos_enc = "rope"
    c.model.conformer.dim, c.model.conformer.num_heads = 15, 5
    lines = validate_lib.mistakes(c)
    assert any("model.conformer.attention=cudnn" in m and "float32" in m for m in lines)
    assert any("pos_enc=rope needs an even head dim" in m for m in lines)


@pytest.mark.parametrize("chunked", [False, True])
def test_cudnn_path_lowers_to_one_fused_call_per_direction(chunked, monkeypatch):
    """Lowered for CUDA (the CPU jaxlib lowers but cannot compile for a GPU): the forward
    and backward attention are cuDNN's fused custom calls, with no (B, H, T, T) softmax
    left. The version check needs the cuDNN library, absent here: it is patched."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fa, "compute_capability_supported", lambda *a, **k: True, raising=False)
    attn = RotaryAttention(64, 2, 0.0, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), attention="cudnn")
    t = 15  # odd, as 16 s at x4 subsampling (399 frames): padded to even for cuDNN
    x = jnp.zeros((2, t, 64), jnp.float32)
    lengths = jnp.array([t, 9])
    mask = jnp.arange(t)[None, :] < lengths[:, None]
    if chunked:
        mask = mask[:, None, :] & (jnp.arange(t)[None, :, None] // 4 >= jnp.arange(t) // 4)
    graphdef, params = nnx.split(attn)

    def loss(params, x):
        out = nnx.merge(graphdef, params)(x, mask, deterministic=True, rngs=None)
        return jnp.sum(out.astype(jnp.float32))

    traced = jax.jit(jax.grad(loss)).trace(params, x)
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"custom_call @(__cudnn\$fmha\w*)", text)
    # A chunk mask reaches cuDNN as a bias (fmhaScaleBias...); lengths need none.
    kind = "fmhaScaleBiasSoftmax" if chunked else "fmhaSoftmax"
    assert sorted(calls) == [f"__cudnn${kind}", f"__cudnn${kind}Backward"]
    assert "exponential" not in text  # no softmax of materialized scores


@pytest.mark.parametrize("t,chunked", [(7, False), (7, True), (6, True)])
def test_fused_wrapping_equals_masked_softmax(t, chunked):
    """The fused path's padding to even lengths, lengths-as-mask and chunk masks (run on
    XLA's implementation here) equal the plain masked softmax on every valid query,
    a bias included."""
    rng = np.random.default_rng(t)
    q, k, v = (jnp.asarray(rng.standard_normal((2, t, 2, 8)), jnp.float32) for _ in range(3))
    bias = jnp.asarray(rng.standard_normal((2, 2, t, t)), jnp.float32)
    lengths = np.array([t, 4])
    mask = np.arange(t)[None, :] < lengths[:, None]
    if chunked:
        mask = mask[:, None, :] & (np.arange(t)[None, :, None] // 3 >= np.arange(t) // 3)
    got = attention_ops.fused_attention(
        q, k, v, jnp.asarray(mask), scale=0.3, bias_bhqs=bias, implementation="xla"
    )
    scores = 0.3 * np.einsum("bqhk,bshk->bhqs", q, k) + np.asarray(bias)
    m = mask[:, None, None, :] if mask.ndim == 2 else mask[:, None]
    scores = np.where(m, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqs,bshk->bqhk", probs / probs.sum(-1, keepdims=True), v)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(got)[b, :n], want[b, :n], atol=1e-5)
