"""What the loader yields and the training step reads: the batch arrays, their ranks, and
their shardings (rows split over the mesh's batch axes)."""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding

from jaxspeech.parallel import mesh as mesh_lib

# Host batch arrays and their ranks: what the loader yields and the step reads.
BATCH_RANKS = {
    "audio": 2,
    "audio_len": 1,
    "labels": 2,
    "label_len": 1,
    "weight": 1,
    "label_overflow": 1,
    "corrupt": 1,
}


# With soft targets (config.distill.targets): a teacher's per-frame top-k for the rows of the
# untranscribed stream (zeros elsewhere): token indices and log-probabilities (B, T', k),
# the teacher's frame counts, and which rows learn from them.
SOFT_TARGET_RANKS = {
    "teacher_idx": 3,
    "teacher_logp": 3,
    "teacher_len": 1,
    "soft": 1,
    "no_target": 1,  # untranscribed rows the teacher could not label: counted, not trained
}


def batch_shardings(mesh: Mesh, *, soft_targets: bool = False) -> dict[str, NamedSharding]:
    """Every batch array split by rows over the mesh's batch axes."""
    ranks = BATCH_RANKS | (SOFT_TARGET_RANKS if soft_targets else {})
    return {k: mesh_lib.batch_sharding(mesh, nd) for k, nd in ranks.items()}
