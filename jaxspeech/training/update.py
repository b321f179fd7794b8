"""Pieces every strategy's training step shares: the guarded optimizer update, the step's
metrics from its loss sums, and the step's random keys."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxspeech.training.objective import normalizer


def guarded_update(tx: optax.GradientTransformation, grads, objective, params, opt_state):
    """The optimizer update, or nothing where the objective or the gradient norm is not
    finite. Returns (params, opt_state, finite, gradient norm)."""
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(objective) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # Skipped, not clipped: a NaN anywhere would otherwise spread into every weight.
    params, opt_state = jax.tree.map(
        lambda new, old: jnp.where(finite, new, old),
        (new_params, new_opt_state),
        (params, opt_state),
    )
    return params, opt_state, finite, grad_norm


def step_metrics(sums: dict, grad_norm, param_norm, finite) -> dict:
    """The step's metrics from its (summed) loss sums: per-token and per-utterance losses,
    norms, the non-finite flag (or share of learners that skipped) and the counts."""
    tokens = normalizer(sums)
    metrics = {
        "loss": sums["objective"] / tokens,
        "utt_loss": sums["objective"] / jnp.maximum(sums["utterances"], 1.0),
        "grad_norm": grad_norm,
        "param_norm": param_norm,
        "nonfinite": 1.0 - finite.astype(jnp.float32),
    }
    for k, v in sums.items():
        metrics[k] = v / tokens if k.startswith("loss_") else v
    return metrics


def step_key(seed: int) -> jax.Array:
    """The base key of the training step's randomness (dropout, SpecAugment)."""
    return jax.random.key(seed + 1)


def micro_batch_key(seed: int, step: int | jax.Array, index: int | jax.Array) -> jax.Array:
    """The random key of micro-batch `index` of `step` (index 0 without accumulation)."""
    return jax.random.fold_in(jax.random.fold_in(step_key(seed), step), index)
