"""A model and its training state from a config, on a mesh; a finished run loaded back.

The one place that turns `config.model` into an `ASRModel`, lays its parameters and
optimizer state out over the mesh, installs a run's assets (tokenizer, feature
statistics) and loads a run's parameters. Training, evaluation, the benchmarks and the
tests all build through here, never through an entry point.

Trees are pure nested dicts: `params` (the `nnx.Param`s), `model_vars` (the front end's
`FeatureStats`: {"frontend": {"mean", "std"}}) and the optax state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import optim
from jaxspeech.audio.features import LogMelConfig, stats_to_mean_std
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.errors import UserError
from jaxspeech.models import DTYPES, ENCODERS, model_from_arguments
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.parallel import sync as sync_lib

ASSETS = "assets"  # RUN/assets: the run's own tokenizer and feature statistics
TOKENIZER = "tokenizer"


# ---------------------------------------------------------------- mesh from config
def mesh_from_config(config: ConfigDict, devices: list | None = None) -> Mesh:
    """The device mesh of config.mesh's axis sizes (over `devices`, default all)."""
    sizes = {k: v for k, v in config.mesh.to_dict().items() if k != "rules"}
    return mesh_lib.make_mesh(sizes, devices=devices)


def rules_from_config(config: ConfigDict) -> rules.Rules:
    """config.mesh.rules as a logical -> mesh axis table (DEFAULT_RULES when the config
    predates the key). Use it with `rules.axis_rules(...)` around tracing and sharding."""
    return rules.rules_from_config(config.mesh.get("rules"))


# ---------------------------------------------------------------- model from config
def feature_config(config: ConfigDict) -> LogMelConfig:
    """The LogMelConfig of `config.features`."""
    return LogMelConfig(**config.features.to_dict())


def model_arguments(config: ConfigDict, vocab_size: int) -> dict:
    """`config.model`'s keyword arguments of `build_model`, JSON-able (the feature settings
    as a dict, the dtype by name): see `jaxspeech.models.model_from_arguments`."""
    m = config.model
    if m.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {m.dtype!r}")
    if m.encoder not in ENCODERS or m.encoder not in m:
        raise ValueError(
            f"model.encoder must be one of {sorted(ENCODERS)} with its settings under "
            f"config.model.<encoder>, got {m.encoder!r}"
        )
    specaug = None
    if config.specaug.enabled:
        specaug = {k: v for k, v in config.specaug.to_dict().items() if k != "enabled"}
    return {
        "encoder": m.encoder,
        "encoder_kwargs": m[m.encoder].to_dict(),
        "head": m.head,
        "transducer_kwargs": m.transducer.to_dict() if "rnnt" in m.head else None,
        "vocab_size": vocab_size,
        "feature_config": config.features.to_dict(),
        "specaug": specaug,
        "dtype": m.dtype,
    }


def make_model(config: ConfigDict, vocab_size: int, seed: int) -> nnx.Module:
    """Instantiate `config.model` (explicit keyword arguments, no config inside the model)."""
    return model_from_arguments(model_arguments(config, vocab_size), nnx.Rngs(params=seed))


def feature_stats(mean_f: np.ndarray, std_f: np.ndarray) -> dict:
    """The model's non-trainable variables: (F,) CMVN mean and standard deviation."""
    return {
        "frontend": {"mean": np.asarray(mean_f, np.float32), "std": np.asarray(std_f, np.float32)}
    }


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model's structure laid out on a mesh, with no array allocated.

    `params` and `model_vars` are pure dicts of ShapeDtypeStructs carrying their
    shardings (restore targets); `param_axes` holds each parameter's logical axes.
    """

    graphdef: Any
    params: dict
    model_vars: dict
    param_shardings: dict
    var_shardings: dict
    param_axes: dict
    mesh: Mesh

    @property
    def abstract(self) -> dict:
        """{"params", "model_vars"}: the restore target of a checkpoint's model item."""
        return {"params": self.params, "model_vars": self.model_vars}


def abstract_model(config: ConfigDict, vocab_size: int, mesh: Mesh) -> ModelSpec:
    """`config.model` traced abstractly and sharded by the logical-axis rules on `mesh`."""
    model = nnx.eval_shape(lambda: make_model(config, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    p_shard = rules.state_shardings(params, mesh)
    v_shard = rules.state_shardings(model_vars, mesh)
    return ModelSpec(
        graphdef=graphdef,
        params=ckpt_lib.abstract_like(nnx.to_pure_dict(params), p_shard),
        model_vars=ckpt_lib.abstract_like(nnx.to_pure_dict(model_vars), v_shard),
        param_shardings=p_shard,
        var_shardings=v_shard,
        param_axes=rules.state_axes(params),
        mesh=mesh,
    )


def init_params(config: ConfigDict, vocab_size: int, spec: ModelSpec, seed: int) -> dict:
    """Freshly initialized parameters, created in place on their shards (never whole on
    one device)."""

    def init():
        return nnx.to_pure_dict(nnx.state(make_model(config, vocab_size, seed), nnx.Param))

    return jax.jit(init, out_shardings=spec.param_shardings)()


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


@dataclasses.dataclass
class TrainState:
    """Everything one training step reads and writes, sharded over the mesh.

    `params` is the model that is evaluated and checkpointed as the run's model. Under a
    sync strategy other than all-reduce, `opt_state` holds the learners' optimizer states
    (leading learner axis) and `sync_state` the strategy's own state (the learners'
    parameters under bmuf and gossip, BMUF's momentum, GTC's residuals);
    `model_params()` then gives the model to evaluate. All-reduce: `sync_state` = {}.
    """

    spec: ModelSpec
    params: dict
    model_vars: dict
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    opt_state: Any
    opt_shardings: Any
    strategy: sync_lib.Strategy = dataclasses.field(default_factory=sync_lib.Strategy)
    sync_state: dict = dataclasses.field(default_factory=dict)
    sync_shardings: dict = dataclasses.field(default_factory=dict)
    _mean: Any = dataclasses.field(default=None, init=False, repr=False)  # jitted once

    @property
    def abstract_train(self) -> dict:
        """Restore target of a checkpoint's train item (optimizer state, step, RNG, and the
        sync strategy's state if it has one)."""
        replicated = NamedSharding(self.spec.mesh, PartitionSpec())
        rng = jax.random.key_data(jax.random.key(0))
        out = {
            "opt_state": ckpt_lib.abstract_like(self.opt_state, self.opt_shardings),
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
            "rng": jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated),
        }
        if self.strategy.has_state:
            out["sync"] = ckpt_lib.abstract_like(self.sync_state, self.sync_shardings)
        return out

    def model_params(self) -> dict:
        """The model to evaluate and save: `params`, except under gossip, where it is the
        learners' mean (computed here, an all-reduce; the step never needs it)."""
        if self.strategy.method != "gossip":
            return self.params
        if self._mean is None:
            self._mean = jax.jit(
                sync_lib.mean_over_learners, out_shardings=self.spec.param_shardings
            )
        with jax.set_mesh(self.spec.mesh):
            return self._mean(self.sync_state["learners"])


def init_train_state(
    config: ConfigDict,
    vocab_size: int,
    mesh: Mesh,
    mean_f: np.ndarray,
    std_f: np.ndarray,
    *,
    tx: optax.GradientTransformation | None = None,
) -> TrainState:
    """Parameters (seeded by config.seed), feature statistics and the optimizer of
    `config.optim` (or `tx`) with its state, all laid out on `mesh`, with the state of
    `config.sync`'s strategy (jaxspeech.parallel.sync).

    Raises:
      SyncConfigError: a sync strategy this config or mesh cannot serve.
    """
    strategy = sync_lib.strategy_from_config(config.get("sync"), dict(mesh.shape))
    spec = abstract_model(config, vocab_size, mesh)
    params = init_params(config, vocab_size, spec, config.seed)
    model_vars = jax.device_put(feature_stats(mean_f, std_f), spec.var_shardings)
    schedule: optax.Schedule = lambda step: 0.0  # noqa: E731
    if tx is None:
        tx, schedule = optim.make_optimizer(config.optim, int(config.train.num_steps))
    if strategy.method != "allreduce":
        opt_state, opt_shardings, sync_state, sync_shardings = init_learners(
            strategy, tx, params, spec
        )
    else:
        opt_state, opt_shardings = init_opt_state(tx, params, mesh, spec.param_shardings)
        sync_state, sync_shardings = {}, {}
    return TrainState(
        spec,
        params,
        model_vars,
        tx,
        schedule,
        opt_state,
        opt_shardings,
        strategy,
        sync_state,
        sync_shardings,
    )


def init_learners(
    strategy: sync_lib.Strategy, tx: optax.GradientTransformation, params: dict, spec: ModelSpec
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


# ---------------------------------------------------------------- a run's assets
def install_assets(config: ConfigDict, workdir: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Copy the data's tokenizer and feature statistics into RUN/assets (first run only).

    Returns (tokenizer dir, mean (F,), std (F,)). A resumed run keeps its own
    assets; if the data directory's tokenizer changed since, that is an error.
    """
    data_dir, split = config.data.dir, config.data.train_split
    src_tok = os.path.join(data_dir, TOKENIZER)
    stats_path = os.path.join(data_dir, split, "stats.json")
    for p in (src_tok, stats_path):
        if not os.path.exists(p):
            raise UserError(
                f"{p} not found: data.dir={data_dir!r} is not a prepared corpus "
                f"(run `python -m data_prep.prepare ... --output {data_dir} --split {split}`)"
            )
    assets = os.path.join(workdir, ASSETS)
    dst_tok = os.path.join(assets, TOKENIZER)
    if jax.process_index() == 0 and not os.path.exists(dst_tok):
        os.makedirs(assets, exist_ok=True)
        shutil.copytree(src_tok, dst_tok + ".tmp", dirs_exist_ok=True)
        shutil.copy(stats_path, os.path.join(assets, "stats.json"))
        os.replace(dst_tok + ".tmp", dst_tok)
    _wait_for(dst_tok)
    if Tokenizer.load(src_tok).vocab_size != Tokenizer.load(dst_tok).vocab_size:
        raise UserError(
            f"the tokenizer in {src_tok} differs from this run's ({dst_tok}); "
            "use a new --workdir for a re-prepared corpus"
        )
    with open(os.path.join(assets, "stats.json")) as f:
        stats = json.load(f)
    expected = feature_config(config).as_dict()
    got = {k: stats["feature"].get(k) for k in expected}
    if any(
        not (got[k] == v or (isinstance(v, float) and math.isclose(got[k] or 0.0, v)))
        for k, v in expected.items()
    ):
        raise UserError(
            f"feature statistics in {stats_path} were computed with {got}, but the config "
            f"asks for {expected}; re-run data_prep.prepare with matching feature flags"
        )
    mean, std = stats_to_mean_std(stats["count"], stats["sum"], stats["sum_sq"])
    return dst_tok, mean, std


def _wait_for(path: str, timeout_s: float = 300.0) -> None:
    """Other processes wait for process 0 to install the assets (shared filesystem)."""
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout_s:
            raise UserError(f"{path} did not appear: is RUN on a filesystem all hosts share?")
        time.sleep(0.5)


# ---------------------------------------------------------------- a finished run
def load_run_config(workdir: str) -> ConfigDict:
    """The resolved config a run was trained with (RUN/config.json)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {workdir} is not a jaxspeech run directory "
            "(train one with `python -m jaxspeech.train --workdir ...`)"
        )
    with open(path) as f:
        return ConfigDict(json.load(f))


@dataclasses.dataclass
class Run:
    """A trained run loaded for inference: its config, tokenizer and one checkpoint's
    parameters and feature statistics on `spec.mesh`."""

    config: ConfigDict
    tokenizer_dir: str
    tokenizer: Tokenizer
    step: int
    spec: ModelSpec
    params: dict
    model_vars: dict


def load_run(
    workdir: str,
    *,
    step: int | None = None,
    mesh: Mesh | None = None,
    config: ConfigDict | None = None,
) -> Run:
    """Load RUN's checkpoint `step` (default: the latest) onto `mesh` (default: the run's
    own `config.mesh` over this job's devices). The parameter fingerprint is verified.
    `config`: the run's config with settings that leave the parameters as they are (the
    attention chunk size a streaming model is decoded with, say); default RUN's own.

    Raises:
      FileNotFoundError: `workdir` is not a run directory.
      CheckpointError: no such step, another model's checkpoint, or a corrupt one.
    """
    config = config or load_run_config(workdir)
    tokenizer_dir = os.path.join(workdir, ASSETS, TOKENIZER)
    tokenizer = Tokenizer.load(tokenizer_dir)
    if mesh is None:
        mesh = mesh_from_config(config)
    spec = abstract_model(config, tokenizer.vocab_size, mesh)
    step, model = ckpt_lib.load_model(workdir, spec.abstract, step)
    return Run(config, tokenizer_dir, tokenizer, step, spec, model["params"], model["model_vars"])
