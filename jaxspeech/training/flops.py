"""Model FLOPs of one training step (the MFU numerator), by XLA's cost analysis of the
step lowered with its loops unrolled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.config import build
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.training import optim
from jaxspeech.training.state import TrainState
from jaxspeech.training.step import make_train_step


class FlopCountUnavailable(RuntimeError):
    """XLA's cost analysis gave no FLOP count for the step (MFU cannot be reported)."""


def step_flops(config: ConfigDict, vocab_size: int, blank_id: int, batch_shapes: dict) -> float:
    """Model FLOPs of one training step on a global batch of `batch_shapes`, by XLA's count.

    XLA's cost analysis counts a while-loop body once, whatever its trip count, and
    counts rematerialized work twice; model FLOPs (the MFU numerator) are neither. So
    the count comes from lowering (never compiling or running) the same step with the
    Conformer's layers and the transducer loss's chunks unrolled and no
    rematerialization, on abstract arguments. Loops over time (an LSTM encoder's
    recurrence, the transducer loss recursions) are still counted once: for an LSTM
    encoder the figure is a lower bound.
    """
    c = ConfigDict(config.to_dict())
    if "conformer" in c.model:
        c.model.conformer.scan_layers = False
        c.model.conformer.remat = "none"
        # Lowered for the CPU below: cuDNN's fused attention has no CPU lowering, and
        # XLA's attention does the same model FLOPs.
        c.model.conformer.attention = "xla"
    c.loss.frames_per_chunk = None  # the transducer joiner's chunk loop, unrolled likewise
    model = nnx.eval_shape(lambda: build.make_model(c, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    params, model_vars = nnx.to_pure_dict(params), nnx.to_pure_dict(model_vars)
    tx, _ = optim.make_optimizer(c.optim, int(c.train.num_steps))
    opt_state = jax.eval_shape(tx.init, params)
    step = make_train_step(graphdef, tx, 0, blank_id, c.loss)
    state = TrainState(jax.ShapeDtypeStruct((), jnp.int32), params, model_vars, opt_state)
    # Lowered for the host's CPU backend whatever the run's devices: GPU plugins (PJRT C
    # API) do not implement a lowered program's cost analysis (jax returns None there), and
    # model FLOPs are the program's, not the device's.
    with jax.default_device(jax.devices("cpu")[0]):
        lowered = jax.jit(step).lower(state, batch_shapes)
        analysis = lowered.cost_analysis()
    if not analysis or "flops" not in analysis:
        raise FlopCountUnavailable(f"XLA's cost analysis gave no FLOP count: {analysis!r}")
    return float(analysis["flops"])
