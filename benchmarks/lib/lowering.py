"""Compiling a train step for its HLO alone: abstract batches and the compiler options.

The arguments are `jax.ShapeDtypeStruct`s carrying their mesh shardings, so nothing is
initialized or transferred; the compiled text is read for its collectives
(benchmarks/lib/hlo.py). Used by benchmarks/scaling.py, benchmarks/sync.py,
benchmarks/pipeline.py and benchmarks/gpu_plan.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jax.sharding import Mesh
    from ml_collections import ConfigDict

# LLVM code generation at -O0: about 20% less compile time; the HLO passes that partition
# and combine collectives are unaffected (same collectives, bytes and FLOPs, checked on
# the data-parallel S step and the quick FSDP step).
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def abstract_batch(mesh: Mesh, utterances: int, seconds: float, config: ConfigDict) -> dict:
    """The train step's batch of `utterances` rows of `seconds` of audio as abstract arrays
    sharded along the mesh's batch axes (labels: the config's tokens per second)."""
    import jax
    import jax.numpy as jnp

    from jaxspeech.parallel import mesh as mesh_lib

    samples = int(seconds * config.features.sample_rate)
    labels = max(1, int(seconds * config.data.max_tokens_per_second))
    shapes = {
        "audio": ((utterances, samples), jnp.float32),
        "audio_len": ((utterances,), jnp.int32),
        "labels": ((utterances, labels), jnp.int32),
        "label_len": ((utterances,), jnp.int32),
        "weight": ((utterances,), jnp.float32),
        "label_overflow": ((utterances,), jnp.int32),
        "corrupt": ((utterances,), jnp.int32),
    }
    return {
        k: jax.ShapeDtypeStruct(s, d, sharding=mesh_lib.batch_sharding(mesh, len(s)))
        for k, (s, d) in shapes.items()
    }


def compile_train_step(
    config: ConfigDict, mesh: Mesh, batch_spec, opt_state: str = "params", donate: bool = False
):
    """The train step of `config` lowered and compiled on `mesh` with abstract arguments,
    as the train loop builds it (its logical-axis rules, TrainState shardings, donation).
    `batch_spec`: (utterances, seconds, vocab); `opt_state`: "params" (moments sharded like
    the parameters: the train loop's layout) or "replicated"; `donate`: the state donated
    (as the train loop does: memory plans then alias it).

    Returns (compiled, abstract parameters, compile seconds).
    """
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxspeech.config import build
    from jaxspeech.parallel import rules
    from jaxspeech.training import optim
    from jaxspeech.training import state as state_lib
    from jaxspeech.training import step as step_lib

    utterances, seconds, vocab = batch_spec
    table = build.rules_from_config(config)
    with rules.axis_rules(table):
        spec = build.abstract_model(config, vocab, mesh)
    tx, _ = optim.make_optimizer(config.optim, config.train.num_steps)
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(tx.init, spec.params)
    if opt_state == "params":
        o_shard = state_lib.opt_shardings(tx, spec.params, mesh, spec.param_shardings)
    elif opt_state == "replicated":
        o_shard = jax.tree.map(lambda _: replicated, abstract_opt)
    else:
        raise ValueError(f"--opt-state must be params or replicated, got {opt_state!r}")
    opt = rules.abstract_like(abstract_opt, o_shard)
    step_no = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    state = state_lib.TrainState(step_no, spec.params, spec.model_vars, opt)
    shardings = state_lib.TrainState(replicated, spec.param_shardings, spec.var_shardings, o_shard)
    batch = abstract_batch(mesh, utterances, seconds, config)
    step = jax.jit(
        step_lib.make_train_step(spec.graphdef, tx, 0, 0, config.loss),
        in_shardings=(shardings, None),
        out_shardings=(shardings, None),
        donate_argnums=(0,) if donate else (),
    )
    t0 = time.perf_counter()
    with rules.axis_rules(table), jax.set_mesh(mesh):
        compiled = step.lower(state, batch).compile(compiler_options=COMPILER_OPTIONS)
    return compiled, spec.params, time.perf_counter() - t0
