"""jaxspeech.training.step: the train step's model FLOPs (the loss wiring and gradients are tested
against references in tests/models/test_transducer.py and tests/parallel)."""

import pytest

from configs import demo
from jaxspeech.config import build
from jaxspeech.training import batch as batch_lib
from jaxspeech.training import flops as flops_lib


def _flops_config(num_layers, scan_layers=True):
    config = demo.get_config("tiny")
    config.model.conformer.update(
        dim=144, num_heads=4, num_layers=num_layers, conv_kernel=15, scan_layers=scan_layers
    )
    config.specaug.enabled = False
    return config


def test_step_flops_counts_every_layer_like_the_matmul_arithmetic():
    """Model FLOPs grow per Conformer block by 3x (forward + backward) its matmul FLOPs,
    counted by hand; XLA's count of a scanned step would see one block only."""
    import jax
    import jax.numpy as jnp

    b, s, vocab = 2, 32000, 30
    shapes = {
        "audio": jax.ShapeDtypeStruct((b, s), jnp.float32),
        "audio_len": jax.ShapeDtypeStruct((b,), jnp.int32),
        "labels": jax.ShapeDtypeStruct((b, 20), jnp.int32),
        "label_len": jax.ShapeDtypeStruct((b,), jnp.int32),
        "weight": jax.ShapeDtypeStruct((b,), jnp.float32),
        "label_overflow": jax.ShapeDtypeStruct((b,), jnp.int32),
        "corrupt": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    f2, f4 = (flops_lib.step_flops(_flops_config(n), vocab, 0, shapes) for n in (2, 4))
    # Scanned or not, the count is the same: the count unrolls the layers itself.
    assert flops_lib.step_flops(_flops_config(2, scan_layers=False), vocab, 0, shapes) == f2

    enc = jax.eval_shape(
        lambda a, n: build.make_model(_flops_config(2), vocab, 0)(a, n)[0],
        shapes["audio"],
        shapes["audio_len"],
    )
    t, d, k = enc.shape[1], 144, 15
    r = 2 * t - 1  # relative positions
    block_forward = (
        2 * b * t * d * 4 * d * 2 * 2  # two feed-forward modules, two matmuls each
        + 2 * b * t * d * d * 4  # q, k, v and output projections
        + 2 * r * d * d  # relative position projection
        + 2 * b * t * t * d * 2  # content scores and context
        + 2 * b * t * r * d  # position scores (before the relative shift)
        + 2 * b * t * d * 2 * d
        + 2 * b * t * d * d  # conv module pointwise 1 and 2
        + 2 * b * t * d * (32 + k - 1)  # depthwise conv as 32-frame band matmuls
    )
    per_block = (f4 - f2) / 2
    # Elementwise work (norms, activations, softmax, Adam) adds a little on top.
    assert 1.0 <= per_block / (3 * block_forward) < 1.25, per_block / (3 * block_forward)


def test_step_flops_lowers_on_the_host_cpu_and_says_when_xla_gives_no_count(monkeypatch):
    """GPU plugins return no cost analysis for a lowered program (None): the count is
    taken on the host's CPU backend, and a missing count is an error, never 0 FLOPs."""
    import jax
    import jax.numpy as jnp

    b, s = 1, 8000
    shapes = {k: jax.ShapeDtypeStruct((b,), jnp.int32) for k in batch_lib.BATCH_RANKS}
    shapes |= {
        "audio": jax.ShapeDtypeStruct((b, s), jnp.float32),
        "labels": jax.ShapeDtypeStruct((b, 4), jnp.int32),
        "weight": jax.ShapeDtypeStruct((b,), jnp.float32),
    }
    seen = []

    def no_count(self):
        seen.append(jax.config.jax_default_device)
        return None

    monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", no_count)
    with pytest.raises(flops_lib.FlopCountUnavailable, match="no FLOP count: None"):
        flops_lib.step_flops(_flops_config(1), 30, 0, shapes)
    assert len(seen) == 1 and seen[0].platform == "cpu"
