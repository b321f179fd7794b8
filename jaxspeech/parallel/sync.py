"""How learners agree on a model: all-reduce, BMUF, GTC, gossip and hierarchical averaging.

A *learner* is one group of devices along the mesh's learner axes (`replica` x `data`
by default; `replica` alone for `hierarchical`): the devices of a learner share one
copy of the model, sharded over `fsdp` and `tensor` as usual, and see their own rows of
the global batch. The strategies differ in what crosses between learners:

- `allreduce`: the summed gradient, every step (today's data parallelism; XLA inserts
  the all-reduce). Nothing here runs.
- `bmuf` (blockwise model-update filtering, Chen & Huo 2016): each learner keeps its own
  parameters and optimizer state and takes `block_steps` local steps; then the learners'
  mean W, the block gradient G = W - W_g, block momentum D = eta D + zeta G and the new
  global model W_g + D (+ eta D: Nesterov), from which every learner restarts.
- `gtc` (gradient threshold compression, Strom 2015): one shared model; each learner adds
  its optimizer's update (its own AdamW state, fed its own rows' gradient) to a residual,
  sends the elements whose magnitude reaches tau as +-tau (an int32 word: index and sign)
  or as (index, value), keeps the rest, and every learner applies the same mean of
  everyone's messages. The reference compresses SGD's gradients (the same thing up to the
  learning rate); an adaptive optimizer must come before the compression, since AdamW fed
  rare +-tau spikes moves a weight a few steps per message instead of one per step.
  Messages have a fixed capacity (an all-gather needs static shapes); elements past it
  stay in the residual and are counted.
- `gossip` (decentralized averaging, Lian et al. 2017): learners on a ring mix their
  parameters with their two neighbours' (`ppermute`) after their local update; with
  `overlap` the neighbours' parameters are those from before this step's update, so the
  exchange does not wait for the step's compute (the synchronous form of AD-PSGD).
- `hierarchical` (H-ADPSGD): learners are the replica groups; inside a group the data
  axis all-reduces gradients every step; across groups `outer` (gossip or bmuf).

This module holds the update rules as functions of learner-stacked trees (leading axis of
size `num_learners`, sharded over the learner axes) and the payload arithmetic; the
training step (`jaxspeech.training.step`) composes them with the model and the optimizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspeech.parallel import rules

STRATEGIES = ("allreduce", "bmuf", "gtc", "gossip", "hierarchical")
OUTER_METHODS = ("gossip", "bmuf")
GTC_VALUES = ("sign", "float")
LEARNER_AXES = ("replica", "data")  # learners of bmuf, gtc and gossip
HIERARCHICAL_AXES = ("replica",)  # learners of hierarchical: the slow-linked groups


class SyncConfigError(ValueError):
    """A sync strategy the config or the mesh cannot serve."""


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A validated `config.sync`, bound to a mesh's learner count.

    `method` is the exchange actually run: the strategy's own, or for `hierarchical` its
    `outer` method over the replica axis.
    """

    name: str = "allreduce"
    method: str = "allreduce"
    learner_axes: tuple[str, ...] = ()
    num_learners: int = 1
    data_parallel: int = 1  # hierarchical: devices all-reducing inside a learner (data)
    block_steps: int = 1
    block_momentum: float = 0.0
    block_lr: float = 1.0
    nesterov: bool = True
    tau: float = 0.0
    density: float = 0.0
    capacity: float = 1.0
    values: str = "float"
    dense_steps: int = 0  # gtc, bmuf: steps that exchange the dense mean update first
    overlap: bool = False

    @property
    def per_learner_models(self) -> bool:
        """Each learner keeps its own parameters and optimizer state (bmuf, gossip)."""
        return self.method in ("bmuf", "gossip")

    @property
    def has_state(self) -> bool:
        """The strategy carries state beyond parameters and optimizer (checkpointed)."""
        return self.method != "allreduce"


def default_sync_config() -> dict:
    """The `config.sync` keys with their defaults (all-reduce): the one table of these
    values. `jaxspeech.config.defaults` lays them out as config keys with their comments
    (this layer cannot import the config's), and `strategy_from_config` fills from it the
    keys a partial mapping leaves out."""
    return {
        "strategy": "allreduce",
        "outer": "gossip",
        "block_steps": 8,
        "block_momentum": 0.0,
        "block_lr": -1.0,
        "block_gain": 1.0,
        "nesterov": True,
        "block_dense_steps": 0,
        "gtc_tau": 0.0,
        "gtc_density": 0.004,
        "gtc_capacity": 0.0048,
        "gtc_values": "sign",
        "gtc_dense_steps": 200,
        "gossip_overlap": False,
    }


def strategy_from_config(
    sync_cfg: Mapping | None, mesh_shape: Mapping[str, int], table: rules.Rules | None = None
) -> Strategy:
    """`config.sync` (None: all-reduce; keys left out: `default_sync_config`'s) checked
    against the mesh and the sharding rules.

    Raises:
      SyncConfigError: an unknown strategy or setting, a mesh that cannot serve it (gossip
        with one learner, hierarchical without replicas), or rules that shard parameters
        over the learner axes or do not split the batch over them first.
    """
    cfg = _with_defaults(sync_cfg)
    name = cfg["strategy"]
    if name not in STRATEGIES:
        raise SyncConfigError(f"sync.strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "allreduce":
        return Strategy()
    method, axes = _learners(cfg, mesh_shape)
    n = math.prod(int(mesh_shape.get(a, 1)) for a in axes)
    _check_rules(rules.active_rules() if table is None else table, axes, mesh_shape)
    common = {
        "name": name,
        "method": method,
        "learner_axes": axes,
        "num_learners": n,
        "data_parallel": int(mesh_shape.get("data", 1)) if name == "hierarchical" else 1,
    }
    if method == "bmuf":
        return _bmuf_strategy(cfg, common)
    if method == "gossip":
        if n < 2:
            raise SyncConfigError(
                f"sync.strategy={name} mixes neighbouring learners, but the mesh has one "
                f"learner ({' x '.join(axes)} = 1): use more devices on those axes"
            )
        return Strategy(**common, overlap=bool(cfg["gossip_overlap"]))
    return _gtc_strategy(cfg, common)


def _with_defaults(sync_cfg: Mapping | None) -> dict:
    """`config.sync` as a dict of every key, `default_sync_config`'s where not given."""
    given = sync_cfg.to_dict() if hasattr(sync_cfg, "to_dict") else dict(sync_cfg or {})
    defaults = default_sync_config()
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise SyncConfigError(f"unknown sync keys {unknown}; known: {sorted(defaults)}")
    return defaults | given


def _learners(cfg: dict, mesh_shape: Mapping[str, int]) -> tuple[str, tuple[str, ...]]:
    """(the exchange run, the mesh axes whose groups are the learners)."""
    if cfg["strategy"] != "hierarchical":
        return cfg["strategy"], LEARNER_AXES
    method = cfg["outer"]
    if method not in OUTER_METHODS:
        raise SyncConfigError(f"sync.outer must be one of {OUTER_METHODS}, got {method!r}")
    if mesh_shape.get("replica", 1) < 2:
        raise SyncConfigError(
            "sync.strategy=hierarchical averages across the replica axis: set "
            "mesh.replica >= 2 (the groups of hosts on slow links)"
        )
    return method, HIERARCHICAL_AXES


def _bmuf_strategy(cfg: dict, common: dict) -> Strategy:
    """BMUF's block settings checked, with -1 momentum and block LR resolved."""
    k, eta, zeta = int(cfg["block_steps"]), float(cfg["block_momentum"]), cfg["block_lr"]
    gain, nesterov = float(cfg["block_gain"]), bool(cfg["nesterov"])
    if k < 1:
        raise SyncConfigError(f"sync.block_steps must be >= 1, got {k}")
    if eta < 0:
        eta = 1.0 - 1.0 / common["num_learners"]  # the reference's block momentum
    if not 0.0 <= eta < 1.0 or gain <= 0:
        raise SyncConfigError(
            f"sync.block_momentum must be in [0, 1) (or -1 for 1 - 1/learners) and "
            f"sync.block_gain > 0, got {cfg['block_momentum']} and {gain}"
        )
    if float(zeta) < 0:
        zeta = bmuf_block_lr(eta, gain, nesterov)
    if float(zeta) <= 0:
        raise SyncConfigError(
            f"sync.block_lr must be > 0 (or -1: from block_gain), got {cfg['block_lr']}"
        )
    block = dict(block_steps=k, block_momentum=eta, block_lr=float(zeta), nesterov=nesterov)
    return Strategy(**common, **block, dense_steps=_dense_steps(cfg, "block_dense_steps"))


def _dense_steps(cfg: dict, key: str) -> int:
    dense = cfg[key]
    if isinstance(dense, bool) or not isinstance(dense, int) or dense < 0:
        raise SyncConfigError(f"sync.{key} must be an integer >= 0, got {dense!r}")
    return dense


def _gtc_strategy(cfg: dict, common: dict) -> Strategy:
    """GTC's threshold, density, capacity and message values checked."""
    tau, density, cap = float(cfg["gtc_tau"]), float(cfg["gtc_density"]), cfg["gtc_capacity"]
    values = cfg["gtc_values"]
    if values not in GTC_VALUES:
        raise SyncConfigError(f"sync.gtc_values must be one of {GTC_VALUES}, got {values!r}")
    if not 0.0 < float(cap) <= 1.0:
        raise SyncConfigError(
            f"sync.gtc_capacity is the share of a shard's elements one message holds: it "
            f"must be in (0, 1], got {cap}"
        )
    if tau < 0 or not 0.0 <= density <= 1.0:
        raise SyncConfigError(
            f"sync.gtc_tau must be >= 0 and sync.gtc_density in [0, 1], got {tau} and {density}"
        )
    if values == "sign" and tau == 0 and density == 0:
        raise SyncConfigError(
            "sync.gtc_values=sign sends +-tau: set sync.gtc_tau > 0 or sync.gtc_density > 0 "
            "(adaptive tau), or use gtc_values=float"
        )
    kw = dict(tau=tau, density=density, capacity=float(cap), values=values)
    return Strategy(**common, **kw, dense_steps=_dense_steps(cfg, "gtc_dense_steps"))


def _check_rules(table: rules.Rules, axes: tuple[str, ...], mesh_shape: Mapping[str, int]):
    """Learners need the batch split over their axes first (learner l = rows block l) and
    no parameter sharded over them (each learner holds a whole model copy)."""
    live = tuple(a for a in axes if int(mesh_shape.get(a, 1)) > 1)
    for name, target in table:
        names = () if target is None else ((target,) if isinstance(target, str) else target)
        if name == "batch":
            # Axes of size 1 split nothing (the pipeline's stage axis without a pipeline).
            split = tuple(a for a in names if a in axes or int(mesh_shape.get(a, 1)) > 1)
            lead = tuple(a for a in split if a in axes)
            if split[: len(lead)] != lead or any(a not in names for a in live):
                raise SyncConfigError(
                    f"mesh.rules.batch={','.join(names)} must start with the learner axes "
                    f"{','.join(axes)} (each learner reads a contiguous block of the batch)"
                )
        elif any(a in live for a in names):
            raise SyncConfigError(
                f"mesh.rules.{name} shards parameters over {','.join(names)}, but "
                f"{','.join(live)} separate learners that each hold a whole model: map "
                f"{name} to fsdp or tensor"
            )


# ------------------------------------------------------------------ learner layout
def learner_spec(spec: PartitionSpec, axes: tuple[str, ...]) -> PartitionSpec:
    """A parameter's PartitionSpec with a leading learner dimension over `axes`."""
    return PartitionSpec(axes, *spec)


def learner_shardings(shardings, axes: tuple[str, ...]):
    """Every NamedSharding of a tree with a leading learner dimension over `axes`."""
    return jax.tree.map(
        lambda s: NamedSharding(s.mesh, learner_spec(s.spec, axes)),
        shardings,
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )


def stack(tree, n: int):
    """(...) leaves -> (n, ...) copies: every learner starts from the same values."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), tree)


def split_batch(batch: dict, n: int, axes: tuple[str, ...]) -> dict:
    """(B, ...) rows -> (n, B / n, ...): learner l reads rows [l B/n, (l+1) B/n).

    The batch is sharded over the learner axes first (checked by `strategy_from_config`),
    so every learner's block already lies on that learner's devices: no data moves.
    """

    def split(x):
        if x.shape[0] % n:
            raise ValueError(f"a batch of {x.shape[0]} rows does not split into {n} learners")
        y = x.reshape((n, x.shape[0] // n) + x.shape[1:])
        return jax.lax.with_sharding_constraint(y, PartitionSpec(axes))

    return jax.tree.map(split, batch)


def learner_keys(key: jax.Array, n: int) -> jax.Array:
    """(n,) keys: learner l's randomness is `key` folded with l."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))


def mean_over_learners(stacked):
    """The learners' mean model: (n, ...) -> (...), one all-reduce over the learner axes."""
    return jax.tree.map(lambda x: jnp.mean(x, axis=0, dtype=jnp.float32).astype(x.dtype), stacked)


# ------------------------------------------------------------------ BMUF
def bmuf_gain(eta: float, zeta: float, nesterov: bool) -> float:
    """How far the global model moves per block, in steady state, relative to the learners'
    mean move G: D = zeta G / (1 - eta), and `bmuf_block` moves by (1 + eta) D with
    Nesterov's look-ahead (fairseq's and the reference's form), by D without."""
    return zeta * (1.0 + eta if nesterov else 1.0) / (1.0 - eta)


def bmuf_block_lr(eta: float, gain: float, nesterov: bool) -> float:
    """The block learning rate zeta that gives `bmuf_gain` = gain.

    jaxspeech's learners split the global batch (data.batch_seconds is the global batch),
    so each learner steps as far per step as the all-reduce model would (AdamW's step
    hardly depends on the batch; SGD's has the same expectation), and the learners' mean
    move over a block already is the all-reduce model's over those steps, less the noise
    that averaging cancels: gain 1. The reference's rule zeta / (N (1 - eta)) = 1, with
    eta = 1 - 1/N and zeta = 1, is gain N (N x 1.75 with Nesterov): there every learner
    reads a whole single-GPU batch, N batches per step. Applied to split batches it moved
    the model 7x (N = 4) as far as all-reduce per block, and BMUF never left the blank
    plateau (benchmarks/README.md).
    """
    return gain * (1.0 - eta) / (1.0 + eta if nesterov else 1.0)


def bmuf_block(learners, global_params, momentum, eta: float, zeta: float, nesterov: bool):
    """The block update. learners: (n, ...) leaves; global_params, momentum: (...).

    Returns (new global model, new momentum, the learners' next start (n, ...)).
      G = mean(learners) - W_g;  D' = eta D + zeta G;  W_g' = W_g + D' (+ eta D' Nesterov)
    and every learner restarts from W_g'.
    """
    mean = mean_over_learners(learners)
    momentum = jax.tree.map(lambda d, m, g: eta * d + zeta * (m - g), momentum, mean, global_params)
    scale = 1.0 + eta if nesterov else 1.0
    new_global = jax.tree.map(lambda g, d: g + scale * d, global_params, momentum)
    n = jax.tree.leaves(learners)[0].shape[0]
    return new_global, momentum, stack(new_global, n)


# ------------------------------------------------------------------ gossip
def ring_weights(n: int) -> tuple[float, float]:
    """(own weight, each neighbour's weight) of the ring mixing matrix: 1/2, 1/2 for two
    learners (one neighbour), else 1/3 for self and each of the two neighbours."""
    if n < 2:
        raise SyncConfigError("gossip needs at least 2 learners")
    return (0.5, 0.5) if n == 2 else (1.0 / 3.0, 1.0 / 3.0)


def gossip_mix(before, after, *, mesh: Mesh, specs, axes: tuple[str, ...], overlap: bool):
    """Ring gossip over learner-stacked trees (n, ...), sharded `learner_spec(spec, axes)`.

    after: each learner's parameters after its own update; before: at the step's start.
      overlap=False: new_i = sum_j W_ij after_j
      overlap=True:  new_i = sum_j W_ij before_j + (after_i - before_i)
    (W the ring mixing matrix). The neighbours' arrays travel by `ppermute`: one permute
    for two learners, two (left and right) for more.
    """
    n = jax.tree.leaves(after)[0].shape[0]
    own, other = ring_weights(n)
    right = [(i, (i + 1) % n) for i in range(n)]
    left = [(i, (i - 1) % n) for i in range(n)]

    def mix(b, a):
        sent = b if overlap else a
        received = jax.lax.ppermute(sent, axes, right)
        if n > 2:
            received = received + jax.lax.ppermute(sent, axes, left)
        # Summed in float32 whatever the parameter dtype: the mixture is an average.
        mixed = own * sent.astype(jnp.float32) + other * received.astype(jnp.float32)
        if overlap:
            mixed = mixed + (a.astype(jnp.float32) - b.astype(jnp.float32))
        return mixed.astype(a.dtype)

    def one(spec, b, a):
        ls = learner_spec(spec, axes)
        return jax.shard_map(mix, mesh=mesh, in_specs=(ls, ls), out_specs=ls)(b, a)

    return jax.tree.map(one, specs, before, after, is_leaf=lambda x: isinstance(x, PartitionSpec))


# ------------------------------------------------------------------ GTC
def capacity_elements(n: int, capacity: float) -> int:
    """Slots of one message for a shard of n elements: ceil(capacity n), at least 1."""
    return max(1, math.ceil(capacity * n))


def gtc_select(x: jax.Array, s: Strategy):
    """One learner's shard, flattened: x (n,) float32 = residual + gradient.

    Returns (indices (cap,) int32 of the sent elements in index order, -1 padded; their
    values (cap,) float32 (+-tau or x_i, 0 in padding); the new residual (n,); tau used;
    sent count; overflow count (elements that reached tau but found no slot)).
    """
    n = x.shape[0]
    cap = capacity_elements(n, s.capacity)
    mag = jnp.abs(x)
    if s.density > 0:  # adaptive: tau = the k-th largest magnitude, k = ceil(density n)
        k = min(n, capacity_elements(n, s.density))
        tau = jax.lax.top_k(mag, k)[0][k - 1]
    else:
        tau = jnp.float32(s.tau)
    mask = mag >= tau
    pos = jnp.cumsum(mask.astype(jnp.int32)) - 1
    send = mask & (pos < cap)  # the first `cap` qualifying elements, in index order
    if s.values == "sign":
        value = jnp.where(x < 0, -tau, tau).astype(jnp.float32)
    else:
        value = x
    sent_value = jnp.where(send, value, 0.0)
    slot = jnp.where(send, pos, cap)  # unsent elements aim past the end and are dropped
    idx = jnp.full((cap,), -1, jnp.int32).at[slot].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    vals = jnp.zeros((cap,), jnp.float32).at[slot].set(sent_value, mode="drop")
    count = jnp.sum(mask.astype(jnp.int32))
    sent = jnp.minimum(count, cap)
    return idx, vals, x - sent_value, tau, sent, count - sent


def pack_sign(idx: jax.Array, vals: jax.Array) -> jax.Array:
    """1-bit messages: word = 2 index + (value < 0); -1 marks an empty slot."""
    return jnp.where(idx >= 0, 2 * idx + (vals < 0).astype(jnp.int32), -1)


def unpack_sign(words: jax.Array, tau: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(indices, values) of packed words (-1 slots: index -1, value 0)."""
    idx = jnp.where(words >= 0, words // 2, -1)
    vals = jnp.where(words >= 0, jnp.where(words % 2 == 1, -tau, tau), 0.0)
    return idx, vals.astype(jnp.float32)


def _gtc_shard(residual, grad, s: Strategy, axes: tuple[str, ...]):
    """shard_map body: this device's block of one leaf for its learner. residual, grad:
    (1, *block). Returns (aggregate block, new residual (1, *block), [sent, overflow])."""
    block = residual.shape[1:]
    x = (residual[0].astype(jnp.float32) + grad[0].astype(jnp.float32)).reshape(-1)
    n = x.shape[0]
    idx, vals, new_res, tau, sent, overflow = gtc_select(x, s)
    if s.values == "sign":  # what travels: one int32 word per slot and the tau used
        words = jax.lax.all_gather(pack_sign(idx, vals), axes)  # (learners, cap)
        taus = jax.lax.all_gather(tau, axes)
        all_idx, all_vals = jax.vmap(unpack_sign)(words, taus)
    else:  # (int32 index, float32 value) per slot
        all_idx = jax.lax.all_gather(idx, axes)
        all_vals = jax.lax.all_gather(vals, axes)

    # Learner by learner, in learner order: every learner adds the same messages in the
    # same order, so all of them compute the same float32 sum (a scatter-add of all
    # messages at once could add duplicate indices in any order).
    def add(j, acc):
        where = jnp.where(all_idx[j] >= 0, all_idx[j], n)
        return acc.at[where].add(all_vals[j], mode="drop")

    agg = jax.lax.fori_loop(0, all_idx.shape[0], add, jnp.zeros((n,), jnp.float32))
    counts = jnp.stack([sent, overflow]).astype(jnp.float32)[None]
    return (
        agg.reshape(block).astype(grad.dtype),
        new_res.reshape((1,) + block).astype(residual.dtype),
        counts,
    )


def gtc_exchange(residual, grads, *, s: Strategy, mesh: Mesh, specs):
    """GTC over learner-stacked trees: residual, grads (n, ...) sharded
    `learner_spec(spec, learner_axes)` (grads: what each learner contributes, its
    optimizer's update in the training step). Returns (the sum of every learner's messages
    (...) sharded `spec` and equal on every learner,
    new residual (n, ...), {"sent", "overflow"}: element counts over all learners).

    Each device compresses its own block of its learner's residual (per-shard messages
    of `capacity_elements(block size)` slots; indices local to the block), and the
    all-gather runs over the learner axes only: devices holding the same block of
    different learners exchange messages.
    """
    axes = s.learner_axes
    every = tuple(mesh.axis_names)

    def one(spec, res, g):
        ls = learner_spec(spec, axes)
        agg, new_res, counts = jax.shard_map(
            lambda r, x: _gtc_shard(r, x, s, axes),
            mesh=mesh,
            in_specs=(ls, ls),
            out_specs=(spec, ls, PartitionSpec(every)),
            check_vma=False,
        )(res, g)
        # Devices holding the same block (axes the leaf is replicated over) counted it
        # alike: divide by that multiplicity.
        used = {a for entry in ls for a in ((entry,) if isinstance(entry, str) else entry or ())}
        copies = math.prod(mesh.shape[a] for a in every if a not in used)
        return agg, new_res, jnp.sum(counts, axis=0) / copies

    spec_leaves, treedef = jax.tree.flatten(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    outs = [
        one(sp, r, g)
        for sp, r, g in zip(
            spec_leaves, treedef.flatten_up_to(residual), treedef.flatten_up_to(grads)
        )
    ]
    agg = treedef.unflatten([o[0] for o in outs])
    new_res = treedef.unflatten([o[1] for o in outs])
    total = sum((o[2] for o in outs), jnp.zeros((2,), jnp.float32))
    return agg, new_res, {"sent": total[0], "overflow": total[1]}


def dense_exchange(residual, grads, *, mesh: Mesh, specs):
    """GTC's dense warm-up (`sync.gtc_dense_steps`): `gtc_exchange`'s results for an
    exchange of every learner's whole update (an all-reduce over the learner axes). The
    sum is sharded `spec` as the compressed one is; the residual passes through untouched;
    every element counts as sent."""

    def one(spec, g):
        return jax.lax.with_sharding_constraint(jnp.sum(g, axis=0), NamedSharding(mesh, spec))

    spec_leaves, treedef = jax.tree.flatten(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    agg = treedef.unflatten(
        [one(sp, g) for sp, g in zip(spec_leaves, treedef.flatten_up_to(grads))]
    )
    sent = jnp.float32(sum(x.size for x in jax.tree.leaves(grads)))
    return agg, residual, {"sent": sent, "overflow": jnp.float32(0.0)}


# ------------------------------------------------------------------ payload arithmetic
def _block_size(shape, spec: PartitionSpec, mesh: Mesh) -> int:
    entries = list(spec) + [None] * (len(shape) - len(spec))
    size = 1
    for dim, axes in zip(shape, entries):
        names = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
        size *= dim // math.prod(mesh.shape[a] for a in names)
    return size


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes one device sends in a ring all-reduce of nbytes over n devices."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def gtc_message_bytes(block: int, s: Strategy) -> int:
    """One learner's message for a block of `block` elements: int32 words plus the float32
    tau (sign), or int32 index + float32 value per slot (float)."""
    cap = capacity_elements(block, s.capacity)
    return cap * 4 + 4 if s.values == "sign" else cap * 8


def payload_bytes(s: Strategy, abstract_params, shardings, mesh: Mesh) -> dict:
    """Bytes each device sends per training step for the learners' exchange (ring
    algorithms), from the payload shapes; the reduction inside a learner (fsdp, tensor)
    is the same for every strategy and not counted.

    Returns {"bytes_per_step" (all of it), "dense_bytes_per_step" (an all-reduce over
    every replica x data learner, for comparison), "inner_bytes_per_step" (hierarchical:
    the gradient all-reduce inside a replica, over fast links), "cross_bytes_per_step"
    (between learners)}.
    """
    leaves = jax.tree.leaves(abstract_params)
    specs = [
        sh.spec for sh in jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    ]
    blocks = [_block_size(x.shape, sp, mesh) for x, sp in zip(leaves, specs)]
    nbytes = float(sum(b * x.dtype.itemsize for b, x in zip(blocks, leaves)))
    learners_all = math.prod(mesh.shape[a] for a in LEARNER_AXES)
    n = s.num_learners if s.method != "allreduce" else learners_all
    inner = ring_allreduce_bytes(nbytes, s.data_parallel)  # hierarchical: inside a replica
    if s.method == "allreduce":
        cross = ring_allreduce_bytes(nbytes, n)
    elif s.method == "bmuf":
        cross = ring_allreduce_bytes(nbytes, n) / s.block_steps
    elif s.method == "gossip":
        cross = nbytes * (1 if n == 2 else 2)
    else:
        cross = (n - 1) * float(sum(gtc_message_bytes(b, s) for b in blocks))
    return {
        "bytes_per_step": inner + cross,
        "dense_bytes_per_step": ring_allreduce_bytes(nbytes, learners_all),
        "inner_bytes_per_step": inner,
        "cross_bytes_per_step": cross,
    }


def describe(s: Strategy, payload: dict) -> str:
    """One line: the strategy, its learners and settings, and its payload per step."""
    mib = lambda b: f"{b / 2**20:.3g} MiB"  # noqa: E731
    if s.method == "allreduce":
        return f"sync: allreduce, {mib(payload['bytes_per_step'])} sent per device per step"
    what = {
        "bmuf": f"block {s.block_steps}, eta {s.block_momentum:.4g}, zeta {s.block_lr:.4g}"
        + (", Nesterov" if s.nesterov else "")
        + f" (gain {bmuf_gain(s.block_momentum, s.block_lr, s.nesterov):.3g})"
        + (f", averaged every step for the first {s.dense_steps}" if s.dense_steps else ""),
        "gossip": "ring" + (", overlapped (neighbours one step old)" if s.overlap else ""),
        "gtc": (f"density {s.density:g}" if s.density > 0 else f"tau {s.tau:g}")
        + f", capacity {s.capacity:g}, {s.values} values",
    }[s.method]
    name = s.name + (f" ({s.method} across replicas)" if s.name == "hierarchical" else "")
    return (
        f"sync: {name} over {s.num_learners} learners ({' x '.join(s.learner_axes)}), {what}; "
        f"{mib(payload['bytes_per_step'])} sent per device per step (all-reduce: "
        f"{mib(payload['dense_bytes_per_step'])})"
    )
