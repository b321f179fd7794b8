"""The training step under a synchronization strategy other than all-reduce
(jaxspeech.parallel.sync): BMUF and gossip learners, and GTC's compressed updates.

- bmuf / gossip (and hierarchical): state.sync["learners"] (n, ...) are the learners'
  parameters and state.opt_state their optimizer states (n, ...). Each learner takes a
  local step on its block of the batch (a `vmap` over the learner axis with
  `spmd_axis_name`, so each learner's arrays stay on its devices), normalized by its
  own tokens and skipped alone if not finite; then BMUF's block update every
  `block_steps` steps (params = the global model W_g) or the ring mix every step
  (params pass through unchanged: `TrainSetup.model_params` gives the learners' mean).
- gtc: one shared model; state.opt_state holds each learner's optimizer state (n, ...).
  Each learner turns the gradient of its own rows (normalized by its own tokens) into
  its optimizer's update at the shared parameters; the updates go through
  `sync.gtc_exchange` with state.sync["residual"] (n, ...) (error feedback: what is not
  sent waits there), and the model moves by the mean of the messages. The compression
  works on updates, not gradients: AdamW fed sparse +-tau gradient spikes moves a weight
  a few learning-rate steps per message where the dense gradient moves it one per step
  (1-bit Adam compresses after the optimizer for the same reason). With SGD it is
  Strom's GTC on lr-scaled gradients.

Metrics add "sync_bytes_per_step" (payload arithmetic) and, for GTC, "sync_density"
(sent / all elements) and "sync_overflow" (elements that found no slot).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

from jaxspeech.parallel import rules, sync
from jaxspeech.training.objective import normalizer
from jaxspeech.training.state import TrainState
from jaxspeech.training.update import guarded_update, step_key, step_metrics


def make_sync_train_step(
    accumulated: Callable,
    tx: optax.GradientTransformation,
    seed: int,
    strategy: sync.Strategy,
    param_shardings: dict,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """(state, batch) -> (state, metrics) under `strategy`; `accumulated` is the
    objective's (params, model_vars, batch, key, step) -> (summed gradients, sums)."""
    if strategy.per_learner_models:
        return _learner_step(accumulated, tx, seed, strategy, param_shardings)
    return _gtc_step(accumulated, tx, seed, strategy, param_shardings)


def _mesh_and_specs(param_shardings: dict):
    """The mesh and the PartitionSpecs of a tree of NamedShardings."""

    def is_sharding(x):
        return isinstance(x, NamedSharding)

    mesh = jax.tree.leaves(param_shardings, is_leaf=is_sharding)[0].mesh
    return mesh, jax.tree.map(lambda s: s.spec, param_shardings, is_leaf=is_sharding)


def _over_learners(fn: Callable, in_axes: tuple, axes: tuple) -> Callable:
    """fn vmapped over the learner axis, traced with the learners' rules."""

    def run(*args):
        with rules.learner_axes(axes):
            return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=axes)(*args)

    return run


def _payload(
    strategy: sync.Strategy, params, param_shardings: dict, mesh, kind: str = "bytes_per_step"
) -> jax.Array:
    """Bytes per device per step of the exchange (static: from shapes at trace time);
    `kind` is a key of `sync.payload_bytes`'s result."""
    return jnp.float32(sync.payload_bytes(strategy, params, param_shardings, mesh)[kind])


def _learner_metrics(sums: dict, grad_norm, param_norm, finite) -> dict:
    """The step's metrics from the learners' summed sums; "nonfinite" is the share of
    learners that skipped their update."""
    metrics = step_metrics(sums, jnp.mean(grad_norm), param_norm, finite)
    metrics["nonfinite"] = 1.0 - jnp.mean(finite.astype(jnp.float32))
    return metrics


def _bmuf_update(strategy: sync.Strategy, step, after, params, momentum):
    """BMUF's block update at the end of every block (else everything passes through);
    during the dense warm-up (`sync.block_dense_steps`) the learners' models are averaged
    every step instead, with no block momentum (which starts from zero after it).
    Returns (learners' start of the next block, global model, block momentum)."""

    def block(args):
        learners_, global_, momentum_ = args
        g, m, start = sync.bmuf_block(
            learners_,
            global_,
            momentum_,
            strategy.block_momentum,
            strategy.block_lr,
            strategy.nesterov,
        )
        return start, g, m

    def blocks(args):
        boundary = (step + 1) % strategy.block_steps == 0
        return jax.lax.cond(boundary, block, lambda a: a, args)

    if strategy.dense_steps == 0:  # no cond at all without a warm-up
        return blocks((after, params, momentum))

    def average(args):
        learners_, global_, momentum_ = args
        g, _, start = sync.bmuf_block(learners_, global_, momentum_, 0.0, 1.0, False)
        return start, g, jax.tree.map(jnp.zeros_like, momentum_)

    dense = step < strategy.dense_steps
    return jax.lax.cond(dense, average, blocks, (after, params, momentum))


def _learner_step(accumulated, tx, seed, strategy, param_shardings):
    """BMUF and gossip: every learner steps its own model, then the models are mixed."""
    axes, n = strategy.learner_axes, strategy.num_learners
    mesh, specs = _mesh_and_specs(param_shardings)

    def local_step(params, model_vars, opt_state, batch, key, step):
        grads, sums = accumulated(params, model_vars, batch, key, step)
        tokens = normalizer(sums)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        params, opt_state, finite, grad_norm = guarded_update(
            tx, grads, sums["objective"], params, opt_state
        )
        return params, opt_state, sums, grad_norm, optax.tree.norm(params), finite

    local = _over_learners(local_step, (0, None, 0, 0, 0, None), axes)

    def learner_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step = state.step
        key = jax.random.fold_in(step_key(seed), step)
        before = state.sync["learners"]
        after, opt_state, sums, grad_norm, param_norm, finite = local(
            before,
            state.model_vars,
            state.opt_state,
            sync.split_batch(batch, n, axes),
            sync.learner_keys(key, n),
            step,
        )
        sync_state, params = dict(state.sync), state.params
        if strategy.method == "gossip":
            sync_state["learners"] = sync.gossip_mix(
                before, after, mesh=mesh, specs=specs, axes=axes, overlap=strategy.overlap
            )
        else:
            sync_state["learners"], params, sync_state["momentum"] = _bmuf_update(
                strategy, step, after, params, sync_state["momentum"]
            )
        sums = jax.tree.map(jnp.sum, sums)
        metrics = _learner_metrics(sums, grad_norm, jnp.mean(param_norm), finite)
        payload = _payload(strategy, params, param_shardings, mesh)
        if strategy.method == "bmuf" and strategy.dense_steps > 0:
            p = sync.payload_bytes(strategy, params, param_shardings, mesh)
            every_step = (
                p["inner_bytes_per_step"] + p["cross_bytes_per_step"] * strategy.block_steps
            )
            payload = jnp.where(step < strategy.dense_steps, jnp.float32(every_step), payload)
        metrics["sync_bytes_per_step"] = payload
        new = state.replace(step=step + 1, params=params, opt_state=opt_state, sync=sync_state)
        return new, metrics

    return learner_step


def _gtc_step(accumulated, tx, seed, strategy, param_shardings):
    """GTC: one shared model moved by the mean of the learners' compressed updates."""
    axes, n = strategy.learner_axes, strategy.num_learners
    mesh, specs = _mesh_and_specs(param_shardings)

    def local_update(params, model_vars, opt_state, batch, key, step):
        """One learner's optimizer update at the shared params from its own rows (zero,
        with its optimizer state unchanged, where not finite)."""
        grads, sums = accumulated(params, model_vars, batch, key, step)
        grads = jax.tree.map(lambda g: g / normalizer(sums), grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(sums["objective"]) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: jnp.where(finite, u, 0.0), updates)
        opt_state = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new_opt, opt_state)
        return updates, opt_state, sums, grad_norm, finite

    local = _over_learners(local_update, (None, None, 0, 0, 0, None), axes)

    def gtc_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step = state.step
        key = jax.random.fold_in(step_key(seed), step)
        updates, opt_state, sums, grad_norm, finite = local(
            state.params,
            state.model_vars,
            state.opt_state,
            sync.split_batch(batch, n, axes),
            sync.learner_keys(key, n),
            step,
        )
        sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), sums)
        args = (state.sync["residual"], updates)
        compressed = functools.partial(sync.gtc_exchange, s=strategy, mesh=mesh, specs=specs)
        payload = _payload(strategy, state.params, param_shardings, mesh)
        if strategy.dense_steps > 0:  # the dense warm-up (no cond at all without one)
            dense = step < strategy.dense_steps
            full = functools.partial(sync.dense_exchange, mesh=mesh, specs=specs)
            summed, residual, counts = jax.lax.cond(dense, full, compressed, *args)
            dense_bytes = "dense_bytes_per_step"
            all_reduce = _payload(strategy, state.params, param_shardings, mesh, dense_bytes)
            payload = jnp.where(dense, all_reduce, payload)
        else:
            summed, residual, counts = compressed(*args)
        params = jax.tree.map(lambda p, u: p + u / n, state.params, summed)
        metrics = _learner_metrics(sums, grad_norm, optax.tree.norm(params), finite)
        metrics["sync_bytes_per_step"] = payload
        metrics["sync_density"] = counts["sent"] / (
            n * sum(x.size for x in jax.tree.leaves(params))
        )
        metrics["sync_overflow"] = counts["overflow"]
        new = state.replace(
            step=step + 1, params=params, opt_state=opt_state, sync={"residual": residual}
        )
        return new, metrics

    return gtc_step
