"""The fused CTC kernel (jaxspeech.losses.kernels.ctc, Pallas interpret mode on the CPU)
against the XLA loss (optax's scan) and the brute-force path enumeration of test_ctc, and
the `loss.kernel` choice. One jit per shape and dtype: interpret mode compiles slowly."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from jaxspeech.losses.ctc import ctc_loss, fused_nll
from jaxspeech.losses.kernels import common
from jaxspeech.losses.kernels.ctc import extended_states
from jaxspeech.training import objective
from tests.losses.test_ctc import _brute_force_nll


def _loss_and_grad(kernel, logits, logit_len, labels, label_len):
    """(loss_b, valid_b, d sum(loss) / d logits in the logits' dtype) of ctc_loss with
    `kernel`."""

    def total(x):
        loss, valid = ctc_loss(x, logit_len, labels, label_len, kernel=kernel)
        return jnp.sum(loss), (loss, valid)

    (_, (loss, valid)), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(logits)
    assert grad.dtype == logits.dtype
    return np.asarray(loss), np.asarray(valid), np.asarray(grad)


# Rows: full length with a repeat (needs a blank between the 1s); fewer frames than T; an
# empty label sequence; infeasible ([1, 1] in 2 frames); labels shorter than U with a
# triple repeat; labels padded with a non-blank id past label_len.
LABELS = np.array([[1, 1, 2], [3, 0, 0], [0, 0, 0], [1, 1, 0], [2, 2, 2], [3, 1, 3]], np.int32)
LABEL_LEN = np.array([3, 1, 0, 2, 3, 1], np.int32)
LOGIT_LEN = np.array([5, 3, 5, 2, 5, 4], np.int32)


@pytest.fixture(scope="module")
def logits():
    return np.random.default_rng(0).standard_normal((6, 5, 4)).astype(np.float32) * 2


def test_kernel_matches_xla_and_brute_force(logits):
    loss, valid, grad = _loss_and_grad("pallas", logits, LOGIT_LEN, LABELS, LABEL_LEN)
    want_loss, want_valid, want_grad = _loss_and_grad("xla", logits, LOGIT_LEN, LABELS, LABEL_LEN)
    assert valid.tolist() == want_valid.tolist() == [True, True, True, False, True, True]
    for i in np.flatnonzero(valid):
        labels = LABELS[i, : LABEL_LEN[i]].tolist()
        brute = _brute_force_nll(logits[i, : LOGIT_LEN[i]], labels)
        np.testing.assert_allclose(loss[i], brute, rtol=1e-5)
    assert loss[3] == 0.0  # infeasible: masked and counted, as the XLA loss does
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, atol=2e-5)
    assert np.all(grad[3] == 0) and np.all(grad[1, 3:] == 0)  # infeasible row; padding
    # Each valid frame's gradient is softmax - occupancy: it sums to 0 over the vocabulary.
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-5)


def test_kernel_with_one_frame():
    logits = np.random.default_rng(1).standard_normal((3, 1, 3)).astype(np.float32)
    labels = np.array([[0, 0], [2, 0], [1, 1]], np.int32)
    label_len, logit_len = np.array([0, 1, 2], np.int32), np.array([1, 1, 1], np.int32)
    loss, valid, grad = _loss_and_grad("pallas", logits, logit_len, labels, label_len)
    want_loss, want_valid, want_grad = _loss_and_grad("xla", logits, logit_len, labels, label_len)
    logp = logits[:, 0] - np.log(np.exp(logits[:, 0]).sum(-1, keepdims=True))
    assert valid.tolist() == want_valid.tolist() == [True, True, False]
    np.testing.assert_allclose(loss, [-logp[0, 0], -logp[1, 2], 0.0], rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, atol=2e-5)


def test_kernel_takes_bf16_logits(logits):
    """bf16 logits: float32 statistics inside, the gradient back in bf16."""
    x = jnp.asarray(logits, jnp.bfloat16)
    loss, valid, grad = _loss_and_grad("pallas", x, LOGIT_LEN, LABELS, LABEL_LEN)
    want_loss, _, want_grad = _loss_and_grad("xla", x, LOGIT_LEN, LABELS, LABEL_LEN)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)  # the same rounded inputs
    assert grad.dtype == want_grad.dtype == jnp.bfloat16
    # bf16 rounding of the gradient
    np.testing.assert_allclose(grad.astype(np.float32), want_grad.astype(np.float32), atol=1e-2)


def test_extended_states():
    ext, live, skip = extended_states(
        jnp.array([[1, 1, 2], [3, 0, 0]]), jnp.array([3, 1]), blank_id=0, num_states=8
    )
    assert ext.tolist() == [[0, 1, 0, 1, 0, 2, 0, 0], [0, 3, 0, 0, 0, 0, 0, 0]]
    assert live.tolist() == [[True] * 7 + [False], [True] * 3 + [False] * 5]
    # Only a label unlike the one two states back may be reached by skipping a blank.
    assert (np.asarray(skip) == 0).tolist() == [
        [False, False, False, False, False, True, False, False],
        [False] * 8,
    ]


def test_resolve_kernel_setting(monkeypatch):
    assert common.resolve("auto", "gpu") == "pallas"
    assert common.resolve("auto", "cpu") == "xla"
    assert common.resolve("auto", "tpu") == "xla"
    assert common.resolve("pallas", "cpu") == "pallas"  # explicit: interpreted
    assert common.resolve("xla", "gpu") == "xla"
    with pytest.raises(ValueError, match="loss.kernel must be one of"):
        common.resolve("cuda", "gpu")
    with pytest.raises(ValueError, match="kernel must be one of"):
        ctc_loss(np.zeros((1, 2, 3)), np.array([2]), np.array([[1]]), np.array([1]), kernel="x")
    monkeypatch.setattr(common, "TRITON_AVAILABLE", False)  # a jax without Pallas Triton
    assert common.resolve("auto", "gpu") == "xla"
    with pytest.raises(ValueError, match="use loss.kernel=xla"):
        common.resolve("pallas", "gpu")


class _CtcModel:
    """What `objective.model_losses` calls of a CTC model; records the kernel it is given."""

    ctc, transducer, decoder = object(), None, None

    def __call__(self, audio, audio_len, *, train, rngs):
        return jnp.zeros((2, 3, 4)), audio_len

    def forward_ctc(self, enc, enc_len, labels, label_len, *, blank_id, kernel):
        self.kernel = kernel
        return jnp.ones(2), jnp.ones(2, bool)


def _kernel_the_objective_passes(setting: str) -> str:
    batch = {"audio": jnp.zeros((2, 8)), "audio_len": jnp.array([3, 3])}
    batch |= {"labels": jnp.ones((2, 1), jnp.int32), "label_len": jnp.array([1, 1])}
    batch |= {"weight": jnp.ones(2), "label_overflow": jnp.zeros(2), "corrupt": jnp.zeros(2)}
    model = _CtcModel()
    objective.model_losses(model, batch, jax.random.key(0), 0, ConfigDict({"kernel": setting}), 0)
    return model.kernel


def test_objective_passes_the_kernel_for_the_mesh_devices():
    """auto follows the devices of the mesh the step is traced under (a GPU mesh's, in a
    deviceless GPU plan whose host backend is the CPU), not the host's backend."""
    from jax._src.mesh import AbstractDevice  # what a mesh of GPU devices carries

    assert _kernel_the_objective_passes("auto") == "xla"  # no mesh: the CPU backend
    assert _kernel_the_objective_passes("pallas") == "pallas"  # explicit: interpreted
    with jax.set_mesh(jax.make_mesh((1,), ("data",))):
        assert common.trace_platform() == "cpu"
        assert _kernel_the_objective_passes("auto") == "xla"
    gpu = AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
    with jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("data",), abstract_device=gpu)
    ):
        assert common.trace_platform() == "gpu"
        assert _kernel_the_objective_passes("auto") == "pallas"
        assert _kernel_the_objective_passes("xla") == "xla"


def test_compiled_kernel_runs_on_each_devices_rows():
    """Under a mesh the (non-interpreted) kernels run inside a shard_map over the batch
    axes, one program per local row: XLA would gather the global batch onto every device
    for a custom call. Traced only (a CPU cannot compile the GPU kernel)."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Auto,))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    args = [np.zeros((2, 3, 3), np.float32), np.array([3, 2]), np.ones((2, 2), np.int32)]
    args = [jax.device_put(x, rows) for x in args + [np.array([2, 1])]]
    total = lambda x, *a: fused_nll(x, *a, 0, False).sum()  # noqa: E731
    with jax.set_mesh(mesh):
        jaxpr = str(jax.jit(jax.grad(total)).trace(*args).jaxpr)
    assert jaxpr.count("pallas_call[") == 2 and "shard_map[" in jaxpr  # alpha and beta
    assert re.findall(r"grid=\((\d+),\)", jaxpr) == ["1", "1"]  # 1 of the 2 rows each
