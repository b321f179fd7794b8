"""Library objects from a config: the device mesh and its logical-axis rules, the model
(explicit keyword arguments: models never see the config) and its abstract, sharded
layout (`ModelSpec`), and the input settings every job shares (retries, corrupt-record
budget, training bucket shapes). Training, evaluation, export and distillation all build
through here."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.common.errors import UserError
from jaxspeech.config import defaults, sections
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.models import DTYPES, ENCODERS, model_from_arguments
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules


# ---------------------------------------------------------------- mesh from config
def mesh_from_config(config: ConfigDict, devices: list | None = None) -> Mesh:
    """The device mesh of config.mesh's axis sizes (over `devices`, default all)."""
    sizes = {k: v for k, v in config.mesh.to_dict().items() if k != "rules"}
    return mesh_lib.make_mesh(sizes, devices=devices)


def rules_from_config(config: ConfigDict) -> rules.Rules:
    """config.mesh.rules as a logical -> mesh axis table (the default table when the config
    predates the key). Use it with `rules.axis_rules(...)` around tracing and sharding."""
    return rules.rules_from_config(defaults.lookup(config, "mesh.rules"))


# ---------------------------------------------------------------- model from config
def feature_config(config: ConfigDict) -> LogMelConfig:
    """The LogMelConfig of `config.features`."""
    return LogMelConfig(**config.features.to_dict())


def compute_dtype(config: ConfigDict) -> str:
    """The run's compute dtype name ("float32", "bfloat16"): its task's key
    (model.dtype, tts.dtype, vocoder.dtype: `sections.DTYPE_KEYS`)."""
    task = sections.task_of(config)
    return str(defaults.lookup(config, sections.DTYPE_KEYS[task]))


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
        "encoder_kwargs": m[m.encoder].to_dict() | pipeline_kwargs(config),
        "head": m.head,
        "transducer_kwargs": m.transducer.to_dict() if "rnnt" in m.head else None,
        "decoder_kwargs": m.decoder.to_dict() | pipeline_kwargs(config, "decoder")
        if "aed" in m.head.split("+")
        else None,
        "vocab_size": vocab_size,
        "feature_config": config.features.to_dict(),
        "specaug": specaug,
        "dtype": m.dtype,
    }


def pipeline_kwargs(config: ConfigDict, stack: str = "encoder") -> dict:
    """The pipeline settings (`config.pipeline`) of a layer stack that can be pipelined:
    the Conformer encoder's (none for the LSTM) or the attention decoder's. A run whose
    config predates them reads the defaults, which change nothing on a mesh without a
    stage axis."""
    if stack == "encoder" and config.model.encoder != "conformer":
        return {}
    p = defaults.lookup(config, "pipeline")
    repeats = int(p["repeats"]) if p["schedule"] == "circular" else 1
    return {
        "pipeline_microbatches": int(p["microbatches"]),
        "pipeline_repeats": repeats,
        "pipeline_gather_once": bool(defaults.lookup(config, "pipeline.gather_weights_once")),
    }


def pipeline_rows(config: ConfigDict, mesh: Mesh) -> int:
    """The factor a training batch's rows need for the pipeline: its microbatches on a
    mesh with a stage axis > 1 (every microbatch keeps the whole data sharding), else 1."""
    if dict(mesh.shape).get("stage", 1) <= 1:
        return 1
    return int(defaults.lookup(config, "pipeline.microbatches"))


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


def model_spec(make: Callable[[int], nnx.Module], model_vars: dict, mesh: Mesh) -> ModelSpec:
    """The abstract, sharded layout of the model `make(seed)` builds, with `model_vars`
    (host arrays outside the model: the target statistics) replicated."""
    model = nnx.eval_shape(lambda: make(0))
    graphdef, params = nnx.split(model, nnx.Param)
    p_shard = rules.state_shardings(params, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    v_shard = jax.tree.map(lambda _: replicated, model_vars)
    return ModelSpec(
        graphdef=graphdef,
        params=rules.abstract_like(nnx.to_pure_dict(params), p_shard),
        model_vars=rules.abstract_like(model_vars, v_shard),
        param_shardings=p_shard,
        var_shardings=v_shard,
        param_axes=rules.state_axes(params),
        mesh=mesh,
    )


def abstract_model(config: ConfigDict, vocab_size: int, mesh: Mesh) -> ModelSpec:
    """`config.model` traced abstractly and sharded by the logical-axis rules on `mesh`."""
    model = nnx.eval_shape(lambda: make_model(config, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    p_shard = rules.state_shardings(params, mesh)
    v_shard = rules.state_shardings(model_vars, mesh)
    return ModelSpec(
        graphdef=graphdef,
        params=rules.abstract_like(nnx.to_pure_dict(params), p_shard),
        model_vars=rules.abstract_like(nnx.to_pure_dict(model_vars), v_shard),
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


def train_bucket_spec(config: ConfigDict, mesh: Mesh) -> pipeline_lib.BucketSpec:
    """The training batch shapes: every micro-batch splits evenly over the mesh's batch
    shards, and every loader shard (and process) gets equal rows."""
    grad_accum = int(config.train.grad_accum)
    if grad_accum < 1:
        raise UserError(f"train.grad_accum must be >= 1, got {grad_accum}")
    loader_shards = int(config.data.loader_shards)
    if loader_shards < 0 or (loader_shards and loader_shards % jax.process_count()):
        raise UserError(
            f"data.loader_shards={loader_shards} must be 0 (one per process) or a multiple of "
            f"the {jax.process_count()} processes"
        )
    multiple_of = math.lcm(
        mesh_lib.num_batch_shards(mesh) * grad_accum * pipeline_rows(config, mesh),
        loader_shards or jax.process_count(),
    )
    return pipeline_lib.make_bucket_spec(
        config.data.bucket_boundaries,
        config.data.batch_seconds,
        config.data.max_tokens_per_second,
        config.features.sample_rate,
        multiple_of=multiple_of,
    )


def retry_policy(config: ConfigDict) -> reader_lib.RetryPolicy:
    """How the loaders retry transient read errors (`data.read_retries`, `read_backoff_s`;
    the defaults' for a run saved before these keys existed)."""
    try:
        return reader_lib.RetryPolicy(
            int(defaults.lookup(config, "data.read_retries")),
            defaults.lookup(config, "data.read_backoff_s"),
        )
    except ValueError as e:
        raise UserError(f"config.data: {e}") from e


def loader_settings(config: ConfigDict, *, train: bool) -> dict[str, Any]:
    """What every split pipeline (`data.pipeline.make_pipeline`, `tts.batch.make_tts_pipeline`,
    `vocoder.batch.make_vocoder_pipeline`) takes from the config, as their keyword arguments
    (`data.pipeline.Loading`'s fields): the seed, this process's place among the processes,
    the batches read ahead and the read retries; in training (`train`) also the loader
    shards and Grain workers (an evaluation pass reads in order in this process)."""
    settings = {
        "seed": config.seed,
        "train": train,
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "prefetch": config.data.prefetch,
        "retry": retry_policy(config),
    }
    if train:
        settings["loader_shards"] = int(config.data.loader_shards)
        settings["num_workers"] = config.data.num_workers
    return settings


def max_corrupt_fraction(config: ConfigDict) -> float:
    """data.max_corrupt_fraction (the default for runs saved before the key existed)."""
    return float(defaults.lookup(config, "data.max_corrupt_fraction"))
