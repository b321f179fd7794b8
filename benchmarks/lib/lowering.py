"""Compiling a train step for its HLO alone: abstract batches and the compiler options.

The arguments are `jax.ShapeDtypeStruct`s carrying their mesh shardings, so nothing is
initialized or transferred; the compiled text is read for its collectives
(benchmarks/lib/hlo.py). Used by benchmarks/scaling.py and benchmarks/sync.py.
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
