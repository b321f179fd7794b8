"""The training state: one pytree of arrays that the step takes and returns, and the
static parts beside it (the optimizer, its schedule, the sync strategy, the shardings).

`TrainState` holds arrays only (`step`, `params`, `model_vars`, `opt_state`, `sync`), so
`train_step(state, batch) -> (state, metrics)` passes it through `jax.jit` whole, with a
`TrainState` of shardings as its in/out shardings and the whole state donated.
`TrainSetup` holds what does not change from step to step. A trainer with several
models (the TTS generator and discriminator) keeps each model's parameters and
optimizer state under its own key of `params` / `opt_state`, with a matching tree of
optimizers in its setup; pipeline stages shard the same leaves over the stage axis.

Trees are pure nested dicts: `params` (the `nnx.Param`s), `model_vars` (the front end's
`FeatureStats`: {"frontend": {"mean", "std"}}; a synthesizer's also {"pitch": {"mean",
"std"}}, its targets' statistics, `tts.task`) and the optax state.
`init_train_state` builds the recognizer's; `state_on_mesh` any model's from its spec.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from jaxspeech.config import build
from jaxspeech.parallel import rules
from jaxspeech.parallel import sync as sync_lib
from jaxspeech.training import optim


def opt_shardings(
    tx: optax.GradientTransformation, params: dict, mesh: Mesh, param_shardings: dict
) -> Any:
    """Shardings of `tx`'s state for `params` (arrays or ShapeDtypeStructs): every
    parameter-shaped leaf (Adam's moments) sharded exactly like its parameter, so FSDP
    shards optimizer memory too; other leaves (step counts) replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        jax.eval_shape(tx.init, params),
        param_shardings,
        transform_non_params=lambda _: replicated,
    )


def init_opt_state(
    tx: optax.GradientTransformation, params: dict, mesh: Mesh, param_shardings: dict
) -> tuple[Any, Any]:
    """Optimizer state laid out by `opt_shardings`. Returns (state, its shardings).

    The shardings are given to `jit` explicitly: the moments are zeros that depend on no
    parameter value, so XLA alone would put them on one device.
    """
    shardings = opt_shardings(tx, params, mesh, param_shardings)
    return jax.jit(tx.init, out_shardings=shardings)(params), shardings


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything one training step reads and writes: arrays only, sharded over the mesh.

    step: () int32, the steps taken. params: the model that is evaluated and
    checkpointed as the run's model. model_vars: the feature statistics (constant).
    opt_state: the optimizer state; under a sync strategy other than all-reduce, the
    learners' optimizer states (leading learner axis). sync: the strategy's own state
    (the learners' parameters under bmuf and gossip, BMUF's momentum, GTC's residuals);
    {} under all-reduce. `TrainSetup.model_params` gives the model to evaluate.
    """

    step: Any
    params: Any
    model_vars: Any
    opt_state: Any
    sync: Any = dataclasses.field(default_factory=dict)

    def replace(self, **changes) -> TrainState:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class TrainSetup:
    """The static parts of training: the model's abstract layout, the optimizer and its
    schedule, the sync strategy, and a `TrainState` of the state's shardings."""

    spec: build.ModelSpec
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    strategy: sync_lib.Strategy
    shardings: TrainState
    _mean: Any = dataclasses.field(default=None, init=False, repr=False)  # jitted once

    def abstract_train(self, state: TrainState) -> dict:
        """Restore target of a checkpoint's train item (optimizer state, step, RNG, and the
        sync strategy's state if it has one): the checkpoint layout predates TrainState."""
        replicated = NamedSharding(self.spec.mesh, PartitionSpec())
        rng = jax.random.key_data(jax.random.key(0))
        out = {
            "opt_state": rules.abstract_like(state.opt_state, self.shardings.opt_state),
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
            "rng": jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated),
        }
        if self.strategy.has_state:
            out["sync"] = rules.abstract_like(state.sync, self.shardings.sync)
        return out

    def train_item(self, state: TrainState, rng: np.ndarray) -> dict:
        """A checkpoint's train item of `state` (replicated global arrays: Orbax refuses
        host-local arrays on many hosts); `rng` is the run's key data (its seed check)."""
        replicated = NamedSharding(self.spec.mesh, PartitionSpec())
        train = {
            "opt_state": state.opt_state,
            "step": state.step,
            "rng": jax.device_put(rng, replicated),
        }
        if self.strategy.has_state:  # learners' models, block momentum, GTC residuals
            train["sync"] = state.sync
        return train

    def restored(self, state: TrainState, model: dict, train: dict) -> TrainState:
        """`state` with a checkpoint's model and train items in place."""
        return state.replace(
            step=train["step"],
            params=model["params"],
            model_vars=model["model_vars"],
            opt_state=train["opt_state"],
            sync=train["sync"] if self.strategy.has_state else state.sync,
        )

    def model_params(self, state: TrainState) -> dict:
        """The model to evaluate and save: `params`, except under gossip, where it is the
        learners' mean (computed here, an all-reduce; the step never needs it)."""
        if self.strategy.method != "gossip":
            return state.params
        if self._mean is None:
            self._mean = jax.jit(
                sync_lib.mean_over_learners, out_shardings=self.spec.param_shardings
            )
        with jax.set_mesh(self.spec.mesh):
            return self._mean(state.sync["learners"])


def init_train_state(
    config: ConfigDict,
    vocab_size: int,
    mesh: Mesh,
    mean_f: np.ndarray,
    std_f: np.ndarray,
    *,
    tx: optax.GradientTransformation | None = None,
) -> tuple[TrainState, TrainSetup]:
    """The recognizer's parameters (seeded by config.seed), feature statistics and the
    optimizer of `config.optim` (or `tx`) with its state, all laid out on `mesh`, with the
    state of `config.sync`'s strategy (jaxspeech.parallel.sync), at step 0.

    Raises:
      SyncConfigError: a sync strategy this config or mesh cannot serve.
    """
    strategy = sync_lib.strategy_from_config(config.get("sync"), dict(mesh.shape))
    spec = build.abstract_model(config, vocab_size, mesh)
    params = build.init_params(config, vocab_size, spec, config.seed)
    model_vars = jax.device_put(build.feature_stats(mean_f, std_f), spec.var_shardings)
    return state_on_mesh(config, strategy, spec, params, model_vars, tx=tx)


def state_on_mesh(
    config: ConfigDict,
    strategy: sync_lib.Strategy,
    spec: build.ModelSpec,
    params: dict,
    model_vars: dict,
    *,
    tx: optax.GradientTransformation | None = None,
) -> tuple[TrainState, TrainSetup]:
    """Any model's step-0 `TrainState` and its `TrainSetup`: `params` and `model_vars`
    (laid out by `spec`), the optimizer of `config.optim` (or `tx`) with its state, and
    `strategy`'s state."""
    mesh = spec.mesh
    schedule: optax.Schedule = lambda step: 0.0  # noqa: E731
    if tx is None:
        tx, schedule = optim.make_optimizer(config.optim, int(config.train.num_steps))
    if strategy.method != "allreduce":
        opt_state, opt_shard, sync_state, sync_shard = init_learners(strategy, tx, params, spec)
    else:
        opt_state, opt_shard = init_opt_state(tx, params, mesh, spec.param_shardings)
        sync_state, sync_shard = {}, {}
    replicated = NamedSharding(mesh, PartitionSpec())
    state = TrainState(
        jax.device_put(jnp.int32(0), replicated), params, model_vars, opt_state, sync_state
    )
    shardings = TrainState(
        replicated, spec.param_shardings, spec.var_shardings, opt_shard, sync_shard
    )
    return state, TrainSetup(spec, tx, schedule, strategy, shardings)


def init_learners(
    strategy: sync_lib.Strategy,
    tx: optax.GradientTransformation,
    params: dict,
    spec: build.ModelSpec,
) -> tuple[Any, Any, dict, dict]:
    """Every learner with a fresh optimizer state, stacked on a leading learner axis
    sharded over the learner axes, and the strategy's own state: each learner's copy of
    `params` ("learners", bmuf and gossip), BMUF's block momentum, or GTC's residuals
    (zeros). Returns (optimizer states, their shardings, sync state, its shardings)."""
    axes, n = strategy.learner_axes, strategy.num_learners
    learner_p = sync_lib.learner_shardings(spec.param_shardings, axes)
    one_opt = opt_shardings(tx, params, spec.mesh, spec.param_shardings)
    learner_o = sync_lib.learner_shardings(one_opt, axes)
    learners = jax.jit(lambda p: sync_lib.stack(p, n), out_shardings=learner_p)(params)
    opt_state = jax.jit(jax.vmap(tx.init), out_shardings=learner_o)(learners)
    if strategy.method == "gtc":  # one shared model; the residuals start empty
        zeros = jax.jit(lambda p: jax.tree.map(jnp.zeros_like, p), out_shardings=learner_p)
        return opt_state, learner_o, {"residual": zeros(learners)}, {"residual": learner_p}
    state, shardings = {"learners": learners}, {"learners": learner_p}
    if strategy.method == "bmuf":
        zeros = jax.jit(
            lambda p: jax.tree.map(jnp.zeros_like, p), out_shardings=spec.param_shardings
        )
        state["momentum"], shardings["momentum"] = zeros(params), spec.param_shardings
    return opt_state, learner_o, state, shardings
