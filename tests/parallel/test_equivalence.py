"""The same train step on 1 device and on 8-device (data, fsdp, tensor) meshes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import demo
from jaxspeech import evaluate as eval_lib
from jaxspeech import optim
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.train import init_opt_state, make_train_step

VOCAB = 8


def _batch(b=8, s=16000, u=6):
    rng = np.random.default_rng(0)
    return {
        "audio": (0.1 * rng.standard_normal((b, s))).astype(np.float32),
        "audio_len": rng.integers(s // 2, s + 1, b).astype(np.int32),
        "labels": rng.integers(1, VOCAB, (b, u)).astype(np.int32),
        "label_len": rng.integers(1, u + 1, b).astype(np.int32),
        "weight": np.array([1] * (b - 1) + [0], np.float32),
        "label_overflow": np.zeros(b, np.int32),
    }


def _run_step(mesh_shape, head="ctc", rnnt_loss="pruned"):
    config = demo.get_config("tiny")
    config.model.conformer.dim = 16
    config.model.conformer.num_heads = 2
    config.model.head = head
    config.loss.rnnt = rnnt_loss
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    n = int(np.prod(mesh_shape))
    mesh = mesh_lib.make_mesh(config.mesh.to_dict(), devices=jax.devices()[:n])
    graphdef, _, _, p_shard, v_shard = eval_lib.abstract_model(config, VOCAB, mesh)
    init = lambda: nnx.to_pure_dict(nnx.state(eval_lib.make_model(config, VOCAB, 0), nnx.Param))
    params = jax.jit(init, out_shardings=p_shard)()
    model_vars = jax.device_put(
        {
            "frontend": {
                "mean": np.full(config.features.num_mel_bins, -5.0, np.float32),
                "std": np.full(config.features.num_mel_bins, 3.0, np.float32),
            }
        },
        v_shard,
    )
    tx, _ = optim.make_optimizer(config.optim, 10)
    opt_state, o_shard = init_opt_state(tx, params, mesh)
    batch = mesh_lib.host_to_global(mesh, _batch())
    step = jax.jit(
        make_train_step(graphdef, tx, 0, 0, config.loss),
        in_shardings=(p_shard, v_shard, o_shard, None, None),
        out_shardings=(p_shard, o_shard, None),
    )
    with jax.set_mesh(mesh):
        new_params, _, metrics = step(params, model_vars, opt_state, batch, jnp.int32(3))
    grads_proxy = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new_params, params)
    return float(metrics["loss"]), float(metrics["grad_norm"]), grads_proxy, new_params


@pytest.fixture(scope="module")
def single():
    return _run_step((1, 1, 1))


def _assert_same_step(got, want):
    (loss8, gn8, delta8, _), (loss1, gn1, delta1, _) = got, want
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    np.testing.assert_allclose(gn8, gn1, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), delta8, delta1
    )


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2), (4, 2, 1), (1, 4, 2)])
def test_step_equals_single_device(single, mesh_shape):
    loss1, gn1, delta1, _ = single
    loss8, gn8, delta8, params8 = _run_step(mesh_shape)
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    np.testing.assert_allclose(gn8, gn1, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), delta8, delta1
    )
    # Parameters really are sharded as the rules say on a (data, fsdp, tensor) mesh.
    if mesh_shape[1] > 1:
        # Scanned layers: (layers, embed, mlp) -> (replicated, fsdp, tensor if divisible).
        kernel = params8["encoder"]["blocks"]["ff1"]["up"]["kernel"]
        assert kernel.sharding.spec[0] is None and kernel.sharding.spec[1] == "fsdp"


@pytest.mark.parametrize("head,rnnt_loss", [("ctc+rnnt", "pruned"), ("rnnt", "full")])
def test_transducer_step_equals_single_device(head, rnnt_loss):
    """The transducer heads (predictor, joiner, both RNN-T losses) shard like the encoder."""
    want = _run_step((1, 1, 1), head, rnnt_loss)
    got = _run_step((2, 2, 2), head, rnnt_loss)
    _assert_same_step(got, want)
    params = got[3]["transducer"]
    # Joiner projections (embed, mlp) are sharded over (fsdp, tensor) like feed-forwards.
    assert tuple(params["joiner"]["enc_proj"]["kernel"].sharding.spec) == ("fsdp", "tensor")
