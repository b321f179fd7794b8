"""Pipeline parallelism over the `stage` mesh axis: a stack of L identical layers split
into groups that stages apply in turn to microbatches (GPipe, and the circular schedule
of MaxText / Megatron's interleaving).

The layer stack's parameters stay (L, ...) arrays, their leading axis sharded over
`stage` (logical axis "layers"), so checkpoints do not depend on the stage count. The
schedule runs in GSPMD: the stage axis of a (S, ...) state is sharded over `stage`, every
iteration applies all stages at once (`jax.vmap(..., spmd_axis_name="stage")`) and then
shifts the state one stage on (XLA turns the shift into a collective permute between
neighbouring stages). Reverse-mode autodiff of the iteration loop is the schedule's
backward pass (all forward, then all backward: GPipe's), with each stage's activations
recomputed from its input (`jax.checkpoint`), as GPipe keeps only stage inputs.

Schedules (S stages, M microbatches, R layer groups per stage, G = S * R groups of L / G
consecutive layers):
- gpipe (R = 1): stage s holds layers [s L / S, (s + 1) L / S). M + S - 1 iterations.
- circular (R > 1): stage s holds groups s, S + s, 2S + s, ...: a microbatch goes round
  the stages R times. M R + S - 1 iterations, so the bubble is (S - 1) / (M R + S - 1)
  instead of (S - 1) / (M + S - 1); it needs M >= S (a microbatch comes back to stage 0
  only after the others have entered). Its stages hold non-contiguous layers while the
  stored (L, ...) parameters are split into contiguous blocks: each step regroups them
  (an all-to-all within a stage group) before the loop.

Microbatch m is the batch rows m, m + M, m + 2M, ...: each data shard's rows split into
all microbatches, so every microbatch keeps the whole data sharding. Arrays that travel
with the activations (padding masks, attention masks) are split the same way.

Shapes: S stages, M microbatches, R repeats, L layers, B rows (b = B / M per microbatch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxspeech.parallel import rules

SCHEDULES = ("gpipe", "circular")
STAGE_AXIS = "stage"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the layer stack is pipelined: `stages` (the mesh's stage axis), `microbatches`
    and `repeats` (layer groups per stage: 1 for gpipe)."""

    stages: int
    microbatches: int
    repeats: int = 1

    @property
    def iterations(self) -> int:
        """Loop iterations of one forward pass: every stage slot of the schedule."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """Idle stage slots / all stage slots: (S - 1) / (M R + S - 1)."""
        return (self.stages - 1) / self.iterations


def check(num_layers: int, rows: int, schedule: Schedule) -> None:
    """Raises ValueError (one line) when the layers or rows do not split as `schedule`
    needs."""
    groups = schedule.stages * schedule.repeats
    if num_layers % groups:
        raise ValueError(
            f"{num_layers} layers do not split into {schedule.stages} stages x "
            f"{schedule.repeats} groups: num_layers must be a multiple of {groups}"
        )
    if rows % schedule.microbatches:
        raise ValueError(
            f"a batch of {rows} rows does not split into {schedule.microbatches} microbatches"
        )
    if schedule.repeats > 1 and schedule.microbatches < schedule.stages:
        raise ValueError(
            f"the circular schedule needs microbatches >= stages, got "
            f"{schedule.microbatches} < {schedule.stages}"
        )


def fit(schedule: Schedule, rows: int) -> Schedule:
    """`schedule` with as many microbatches as `rows` allows: the most M' <= M such that
    every microbatch splits evenly over the batch shards inside a stage; the circular
    schedule falls back to gpipe (repeats 1) where M' < S. Training batches are rounded
    so the configured M fits (`jaxspeech.config.build`); evaluation's and the monitor's
    batches may not be, and still run (with a larger bubble)."""
    shards = _batch_shards_within_stage()
    for m in range(min(schedule.microbatches, rows), 0, -1):
        if rows % m == 0 and (rows // m) % shards == 0:
            repeats = schedule.repeats if m >= schedule.stages else 1
            return dataclasses.replace(schedule, microbatches=m, repeats=repeats)
    return dataclasses.replace(schedule, microbatches=1, repeats=1)


def _batch_shards_within_stage() -> int:
    """How many ways the batch axes other than the stage axis split a batch."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    with rules.learner_axes((STAGE_AXIS,)):
        axes = rules.logical_to_spec(("batch",))[0]
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    size = 1
    for n in names:
        size *= int(mesh.shape[n]) if n in mesh.shape else 1
    return size


def _split_rows(a: jax.Array, m: int) -> jax.Array:
    """(B, ...) -> (M, B / M, ...): microbatch i = rows i, i + M, ..."""
    return jnp.swapaxes(a.reshape(a.shape[0] // m, m, *a.shape[1:]), 0, 1)


def _merge_rows(a: jax.Array) -> jax.Array:
    """(M, b, ...) -> (B, ...), the inverse of `_split_rows`."""
    return jnp.swapaxes(a, 0, 1).reshape(a.shape[0] * a.shape[1], *a.shape[2:])


def run(
    apply_group: Callable[[Any, jax.Array, Any, jax.Array, jax.Array], jax.Array],
    params: Any,
    x: jax.Array,
    extras: Any,
    schedule: Schedule,
) -> jax.Array:
    """The layer stack applied to `x` by `schedule`.

    Args:
      apply_group: (group params (L / G, ...), x (b, ...), extras' microbatch, group index,
        microbatch index (int32 scalars)) -> (b, ...): one group of consecutive layers on
        one microbatch (the indices seed its dropout: every slot draws its own masks).
      params: a pytree of (L, ...) stacked layer parameters, layer order.
      x: (B, ...) the stack's input.
      extras: a pytree of (B, ...) arrays split into microbatches with `x` (masks).

    Returns:
      (B, ...) equal (up to float reassociation) to applying the L layers in order.
    """
    s, m, r = schedule.stages, schedule.microbatches, schedule.repeats
    num_layers = jax.tree.leaves(params)[0].shape[0]
    check(num_layers, x.shape[0], schedule)
    per = num_layers // (s * r)
    # (L, ...) -> (R, S, L/G, ...): group g = r * S + s holds layers [g L/G, (g + 1) L/G).
    grouped = jax.tree.map(lambda a: a.reshape(r, s, per, *a.shape[1:]), params)
    grouped = jax.tree.map(lambda a: _constrain_axis(a, 1), grouped)
    x_m = _split_rows(x, m)
    extras_m = jax.tree.map(lambda e: _split_rows(e, m), extras)
    items = m * r
    stage_ids = jnp.arange(s, dtype=jnp.int32)

    def group_of(p_rs, rep, x_s, ex_s, group, microbatch):
        p = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, rep, 0, keepdims=False), p_rs)
        return apply_group(p, x_s, ex_s, group, microbatch)

    # Keep stage inputs only and recompute the rest. The stage's weights enter whole
    # (loop-invariant: the backward pass keeps them once), not as this iteration's
    # slice, which the scan would save at every iteration.
    step = jax.checkpoint(group_of)

    def on_stage(p_rs, x_s, ex_s, k, stage):
        """One stage's slot: item k (microbatch k % M, repeat k // M) if it exists."""
        kc = jnp.clip(k, 0, items - 1)
        rep = kc // m
        return step(p_rs, rep, x_s, ex_s, rep * s + stage, kc % m)

    def iteration(carry, i):
        state, done = carry  # (S, b, ...) stage inputs; (M, b, ...) last stage's outputs
        k = i - stage_ids  # each stage's item
        mb = jnp.clip(k, 0, items - 1) % m
        ex = jax.tree.map(lambda e: e[mb], extras_m)
        with rules.learner_axes((STAGE_AXIS,)):
            out = jax.vmap(on_stage, in_axes=(1, 0, 0, 0, 0), spmd_axis_name=STAGE_AXIS)(
                grouped, state, ex, k, stage_ids
            )
        valid = (k >= 0) & (k < items)
        out = jnp.where(valid.reshape(-1, *([1] * (out.ndim - 1))), out, state)
        done = jnp.where(valid[-1], done.at[mb[-1]].set(out[-1]), done)
        nxt = i + 1  # stage 0's next item: a fresh microbatch, or one coming round again
        first = jnp.where(nxt < m, x_m[nxt % m], done[nxt % m])
        state = jnp.concatenate([first[None], out[:-1]], axis=0)
        return (_constrain_axis(state, 0), done), None

    state0 = jnp.zeros((s, *x_m.shape[1:]), x.dtype).at[0].set(x_m[0])
    (_, done), _ = jax.lax.scan(
        iteration,
        (_constrain_axis(state0, 0), jnp.zeros_like(x_m)),
        jnp.arange(schedule.iterations),
    )
    return _merge_rows(done)


def _constrain_axis(a: jax.Array, axis: int) -> jax.Array:
    """`a` with dimension `axis` sharded over the stage axis (the others unconstrained)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or STAGE_AXIS not in mesh.shape:
        return a
    spec = [jax.sharding.PartitionSpec.UNCONSTRAINED] * a.ndim
    spec[axis] = STAGE_AXIS
    return jax.lax.with_sharding_constraint(a, jax.sharding.PartitionSpec(*spec))


def stages_in_mesh() -> int:
    """The current (abstract) mesh's stage axis size; 1 outside a mesh or without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or STAGE_AXIS not in mesh.shape:
        return 1
    return int(mesh.shape[STAGE_AXIS])
