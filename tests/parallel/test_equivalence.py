"""The same train step on 1 device and on 8-device (replica, data, fsdp, tensor) meshes;
gradient accumulation and bf16 compute against the plain float32 step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import demo
from jaxspeech.config import build
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.training import state as state_lib
from jaxspeech.training.step import jit_train_step, make_train_step

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
        "corrupt": np.zeros(b, np.int32),
    }


def _run_step(
    mesh_shape,
    head="ctc",
    rnnt_loss="pruned",
    *,
    grad_accum=1,
    dtype="float32",
    plain=False,
    with_opt_state=False,
    table=None,
):
    """One train step; returns (loss, grad norm, parameter change, new params).

    plain=True: no SpecAugment and an optimizer whose update is the gradient itself
    (`optax.identity`), so the parameter change IS the gradient (micro-batches draw their
    own augmentation, and Adam's normalization would hide gradient scale errors).
    """
    config = demo.get_config("tiny")
    config.model.conformer.dim = 16
    config.model.conformer.num_heads = 2
    config.model.head = head
    config.model.dtype = dtype
    config.loss.rnnt = rnnt_loss
    if plain:
        config.specaug.enabled = False
    if len(mesh_shape) == 3:
        mesh_shape = (1,) + tuple(mesh_shape)
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    n = int(np.prod(mesh_shape))
    if table is not None:
        config.mesh.rules = rules.rules_to_config(table)
    mesh = build.mesh_from_config(config, devices=jax.devices()[:n])
    mean, std = (
        np.full(config.features.num_mel_bins, -5.0),
        np.full(config.features.num_mel_bins, 3.0),
    )
    tx = optax.identity() if plain else None
    with rules.axis_rules(build.rules_from_config(config)):  # as train.py does
        return _step_on(config, mesh, mean, std, tx, grad_accum, with_opt_state)


def _step_on(config, mesh, mean, std, tx, grad_accum, with_opt_state):
    state, setup = state_lib.init_train_state(config, VOCAB, mesh, mean, std, tx=tx)
    state = state.replace(step=jax.device_put(jnp.int32(3), setup.shardings.step))
    params = state.params
    batch = mesh_lib.host_to_global(mesh, _batch())
    step = jit_train_step(
        setup,
        make_train_step(setup.spec.graphdef, setup.tx, 0, 0, config.loss, grad_accum=grad_accum),
    )
    with jax.set_mesh(mesh):
        new, metrics = step(state, batch)
    new_params, new_opt = new.params, new.opt_state
    grads_proxy = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), new_params, params)
    out = float(metrics["loss"]), float(metrics["grad_norm"]), grads_proxy, new_params
    return out + (new_opt,) if with_opt_state else out


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


@pytest.mark.parametrize(
    # The AdamW update where the optimizer state is sharded (FSDP, tensor, replica axes);
    # pure data parallelism, (8), is in the gradient test below.
    "mesh_shape",
    [(1, 4, 2), (2, 2, 2, 1), (2, 1, 2, 2)],
)
def test_step_equals_single_device(single, mesh_shape):
    loss1, gn1, delta1, _ = single
    loss8, gn8, delta8, params8, opt8 = _run_step(mesh_shape, with_opt_state=True)
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    np.testing.assert_allclose(gn8, gn1, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), delta8, delta1
    )
    # Parameters really are sharded as the rules say on a (data, fsdp, tensor) mesh, and
    # so are their Adam moments (FSDP shards optimizer memory too).
    if mesh_shape[-2] > 1:
        # Scanned layers: (layers, embed, mlp) -> (stage: 1 here, so whole; fsdp; tensor if
        # divisible).
        kernel = params8["encoder"]["blocks"]["ff1"]["up"]["kernel"]
        assert kernel.sharding.spec[0] == "stage" and kernel.sharding.spec[1] == "fsdp"
        adam = opt8[1][0]  # chain(clip, adamw): adamw's ScaleByAdamState
        for moment in (adam.mu, adam.nu):
            assert moment["encoder"]["blocks"]["ff1"]["up"]["kernel"].sharding == kernel.sharding


@pytest.mark.parametrize("head,rnnt_loss", [("ctc+rnnt", "pruned"), ("rnnt", "full")])
def test_transducer_step_equals_single_device(head, rnnt_loss):
    """The transducer heads (predictor, joiner, both RNN-T losses) shard like the encoder."""
    want = _run_step((1, 1, 1), head, rnnt_loss)
    got = _run_step((2, 2, 2), head, rnnt_loss)
    _assert_same_step(got, want)
    params = got[3]["transducer"]
    # Joiner projections (embed, mlp) are sharded over (fsdp, tensor) like feed-forwards.
    assert tuple(params["joiner"]["enc_proj"]["kernel"].sharding.spec) == ("fsdp", "tensor")


@pytest.fixture(scope="module")
def single_plain():
    return _run_step((1, 1, 1), plain=True)


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (4, 2, 1), (2, 2, 2)])
def test_gradients_equal_single_device(single_plain, mesh_shape):
    """With the identity optimizer the parameter change is the gradient: equal to 1e-5."""
    loss1, _, grads1, _ = single_plain
    loss8, _, grads8, _ = _run_step(mesh_shape, plain=True)
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads8, grads1)
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads1)) > 1e-3  # not all ~0


@pytest.mark.parametrize("mesh_shape,head", [((1, 1, 1), "ctc"), ((2, 2, 2), "ctc+rnnt")])
def test_gradient_accumulation_equals_one_pass(single_plain, mesh_shape, head):
    """Two micro-batches give the loss and gradient of the whole batch (sums, not means of
    means: the per-token normalization uses the whole batch's tokens)."""
    # The plain one-pass step on one device is the module's `single_plain`: not run twice.
    plain_ctc = (mesh_shape, head) == ((1, 1, 1), "ctc")
    want = single_plain if plain_ctc else _run_step(mesh_shape, head, plain=True)
    got = _run_step(mesh_shape, head, grad_accum=2, plain=True)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got[2], want[2])


def test_bf16_compute_keeps_float32_parameters_and_close_loss(single_plain):
    loss32, _, grads32, _ = single_plain
    loss16, _, grads16, params16 = _run_step((2, 2, 2), dtype="bfloat16", plain=True)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params16))
    assert all(g.dtype == np.float32 for g in jax.tree.leaves(grads16))
    # bf16 has an 8-bit mantissa: the loss agrees to ~1%, gradients point the same way.
    np.testing.assert_allclose(loss16, loss32, rtol=2e-2)
    a = np.concatenate([g.ravel() for g in jax.tree.leaves(grads16)])
    b = np.concatenate([g.ravel() for g in jax.tree.leaves(grads32)])
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) > 0.98


def test_rules_table_from_the_config_lays_out_the_same_step(single_plain):
    """config.mesh.rules decides the layout: with every model axis replicated and the batch
    over all three axes, the (2, 2, 2) mesh is pure data parallelism; same gradients."""
    table = dict(rules.DEFAULT_RULES)
    table.update(batch=("data", "fsdp", "tensor"), embed=None, mlp=None, heads=None, vocab=None)
    loss1, _, grads1, _ = single_plain
    loss8, _, grads8, params8 = _run_step((2, 2, 2), plain=True, table=tuple(table.items()))
    kernel = params8["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    # Default: (stage, fsdp, tensor); here only the size-1 stage axis is left.
    assert kernel.sharding.spec[0] == "stage" and all(a is None for a in kernel.sharding.spec[1:])
    assert len({str(s.index) for s in kernel.addressable_shards}) == 1  # whole on each device
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads8, grads1)
