"""The training step: `train_step(state, batch) -> (state, metrics)` for every sync strategy.

`make_step` builds it from a task's gradient function (`make_train_step`: the
recognizer's) and returns a pure function of a `TrainState` and a batch that `jax.jit`
compiles once per batch shape (`jit_train_step`: the state's shardings in and out, the
state donated). All-reduce is written here; the other strategies' steps are in
`jaxspeech.training.sync_step`. Used by the trainer, the benchmarks and the tests alike.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax
from ml_collections import ConfigDict

from jaxspeech.parallel import sync
from jaxspeech.training import sync_step
from jaxspeech.training.objective import (
    SoftTargets,
    make_accumulated_grads,
    make_grads_fn,
    normalizer,
)
from jaxspeech.training.state import TrainSetup, TrainState
from jaxspeech.training.update import guarded_update, step_key, step_metrics

StepFn = Callable[[TrainState, dict], tuple[TrainState, dict]]
# (params, model_vars, batch, key, step) -> (summed gradients, sums incl. "objective")
GradsFn = Callable[..., tuple[dict, dict]]


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    seed: int,
    blank_id: int,
    loss_cfg: ConfigDict,
    *,
    strategy: sync.Strategy | None = None,
    param_shardings: dict | None = None,
    grad_accum: int = 1,
    soft: SoftTargets | None = None,
) -> StepFn:
    """The recognizer's step: `make_step` of its objective (`objective.make_grads_fn`,
    with `soft` targets) over `grad_accum` micro-batches.

    With grad_accum = k > 1 the batch is processed as k micro-batches in a `lax.scan`
    (activation memory of one micro-batch); gradients and loss sums accumulate in
    float32 and are normalized once by the whole batch's tokens, so the update equals
    the single-pass one up to summation order.
    """
    accumulated = make_accumulated_grads(
        make_grads_fn(graphdef, blank_id, loss_cfg, soft), grad_accum
    )
    return make_step(accumulated, tx, seed, strategy=strategy, param_shardings=param_shardings)


def make_step(
    grads_fn: GradsFn,
    tx: optax.GradientTransformation,
    seed: int,
    *,
    strategy: sync.Strategy | None = None,
    param_shardings: dict | None = None,
) -> StepFn:
    """(state, batch) -> (state + 1 step, metrics) of any task's objective under `strategy`
    (default all-reduce; the others need `param_shardings`, see
    `jaxspeech.training.sync_step`).

    `grads_fn(params, model_vars, batch, key, step) -> (summed gradients, sums)` is the
    task's objective over the whole batch (the recognizer's: `make_train_step`; the
    synthesizer's: `jaxspeech.tts.objective`); sums hold "objective" and the
    counts `objective.normalizer` divides it by, so the update is of the per-token mean.

    A step whose objective or gradient norm is not finite changes nothing but the step
    count: parameters and optimizer state come back as they went in
    (metrics["nonfinite"] = 1). The test is on global values inside the one SPMD
    program, so every process skips the same steps. The step's randomness is `seed`
    folded with the step: (seed, step) is the whole RNG state a checkpoint needs.
    """
    if strategy is not None and strategy.method != "allreduce":
        if param_shardings is None:
            raise ValueError(f"sync.strategy={strategy.method} needs the parameter shardings")
        return sync_step.make_sync_train_step(grads_fn, tx, seed, strategy, param_shardings)

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step = state.step
        key = jax.random.fold_in(step_key(seed), step)
        grads, sums = grads_fn(state.params, state.model_vars, batch, key, step)
        # Per-token objective: buckets of different batch sizes get the same gradient scale.
        tokens = normalizer(sums)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        params, opt_state, finite, grad_norm = guarded_update(
            tx, grads, sums["objective"], state.params, state.opt_state
        )
        metrics = step_metrics(sums, grad_norm, optax.tree.norm(params), finite)
        return state.replace(step=step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def setup_train_step(
    setup: TrainSetup,
    config: ConfigDict,
    blank_id: int,
    *,
    soft: SoftTargets | None = None,
) -> StepFn:
    """`make_train_step` for `setup`'s model, optimizer and strategy with `config`'s seed,
    loss settings and gradient accumulation."""
    return make_train_step(
        setup.spec.graphdef,
        setup.tx,
        config.seed,
        blank_id,
        config.loss,
        strategy=setup.strategy,
        param_shardings=setup.spec.param_shardings,
        grad_accum=int(config.train.grad_accum),
        soft=soft,
    )


def jit_train_step(
    setup: TrainSetup, step_fn: StepFn, batch_shardings=None, *, donate: bool = False
) -> Callable:
    """`jax.jit` of a step function with the state's shardings in and out (the whole state
    donated when `donate`: the step's inputs are never read again)."""
    return jax.jit(
        step_fn,
        in_shardings=(setup.shardings, batch_shardings),
        out_shardings=(setup.shardings, None),
        donate_argnums=(0,) if donate else (),
    )
