"""The optax chain built from an optimizer section of the config (`config.optim`, and the
vocoder's discriminators' `config.optim2` of the same keys): warmup + decay schedule,
clipping, AdamW."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from ml_collections import ConfigDict


def make_schedule(cfg: ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warmup to `peak_lr`, then `decay` ("cosine", "noam", "constant" or
    "exponential": peak_lr * decay_rate ** (steps after the warm-up / decay_steps))."""
    warmup = int(cfg.warmup_steps)
    if cfg.decay == "exponential":
        decay = optax.exponential_decay(cfg.peak_lr, int(cfg.decay_steps), cfg.decay_rate)
        if not warmup:  # (HiFi-GAN's: optax's plain schedule, not a join of two)
            return decay
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.peak_lr, warmup), decay], [warmup]
        )
    if cfg.decay == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=cfg.peak_lr,
            warmup_steps=warmup,
            decay_steps=max(total_steps, warmup + 1),
            end_value=cfg.peak_lr * cfg.end_lr_ratio,
        )
    if cfg.decay == "noam":
        # Inverse square root after warmup (Vaswani et al.), peaking at peak_lr.
        def noam(step):
            step = jnp.maximum(step, 1).astype(jnp.float32)
            return cfg.peak_lr * jnp.minimum(step / max(warmup, 1), jnp.sqrt(max(warmup, 1) / step))

        return noam
    if cfg.decay == "constant":
        return optax.linear_schedule(0.0, cfg.peak_lr, max(warmup, 1))
    raise ValueError(
        f"unknown optim.decay {cfg.decay!r}; use cosine, noam, constant or exponential"
    )


WEIGHT_DECAY_MASKS = ("matrices", "all")


def decay_mask(params) -> object:
    """Weight decay on matrices only: biases, norm scales and 1-D parameters are exempt."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(
    cfg: ConfigDict, total_steps: int
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Returns (optimizer, schedule) for an optimizer section of the config (`optim`,
    `optim2`): AdamW, after a global-norm clip unless clip_norm is 0, its weight decay on
    matrices only or (weight_decay_mask "all") on every parameter. Runs from before
    weight_decay_mask decayed matrices only."""
    schedule = make_schedule(cfg, total_steps)
    if cfg.name != "adamw":
        raise ValueError(f"unknown optim.name {cfg.name!r}; supported: adamw")
    mask = cfg.get("weight_decay_mask", "matrices")
    if mask not in WEIGHT_DECAY_MASKS:
        raise ValueError(f"unknown optim.weight_decay_mask {mask!r}; use matrices or all")
    adamw = optax.adamw(
        schedule,
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask if mask == "matrices" else None,
    )
    if not cfg.get("clip_norm", 0.0):
        return adamw, schedule
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw), schedule
