"""What every task's evaluation shares, whatever it scores (the recognizer's
`evaluation.scoring`, the synthesizer's and the vocoder's training evaluations): which
splits it scores, the buckets one pass over a split is batched in, and the check that
the pass covered the whole split within the corrupt-record budget.

Light on purpose (no decoding, no tokenizer): the task packages import it to name their
splits without the recognizer's scoring stack."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.config import build, validate
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import faults


def parse_splits(text: str) -> list[str]:
    """ "dev,test" -> ["dev", "test"]: the splits evaluation scores, in order (the first
    one's metric chooses the best checkpoint; `jaxspeech.config.validate.split_names`).

    Raises:
      UserError: an empty name or a split named twice.
    """
    try:
        return validate.split_names(text)
    except ValueError as e:
        raise UserError(str(e)) from e


def eval_bucket_spec(
    config: ConfigDict, durations: np.ndarray, multiple_of: int
) -> pipeline_lib.BucketSpec:
    """Eval buckets (else the training ones) plus one up to the longest utterance of
    (N,) `durations` (seconds), each batch's rows a multiple of `multiple_of`.

    The extra bucket makes sure every utterance of the split is scored.
    """
    bounds = list(config.data.eval_bucket_boundaries or config.data.bucket_boundaries)
    longest = float(durations.max()) if len(durations) else 0.0
    if longest > bounds[-1]:
        bounds.append(float(math.ceil(longest)))
    return pipeline_lib.make_bucket_spec(
        bounds,
        config.data.batch_seconds,
        config.data.max_tokens_per_second,
        config.features.sample_rate,
        multiple_of=multiple_of,
    )


def split_buckets(
    config: ConfigDict, mesh: Mesh, index: records.SplitIndex
) -> pipeline_lib.BucketSpec:
    """`eval_bucket_spec` of the split (its `index`), each batch's rows divided by the
    mesh's batch shards and the processes."""
    multiple_of = math.lcm(mesh_lib.num_batch_shards(mesh), jax.process_count())
    return eval_bucket_spec(config, index.durations, multiple_of)


def gather_rows(
    config: ConfigDict,
    split: str,
    index: records.SplitIndex,
    rows: list[dict],
    skipped: int,
    fault_log: faults.FaultLog,
) -> tuple[list[dict], int]:
    """This process's utterance rows (each with an "id") and skipped records -> all
    processes' (rows sorted by id, skipped summed), checked to cover the whole split and
    charged against data.max_corrupt_fraction (`fault_log`: the pass's faults by shard).

    Raises:
      RuntimeError: the rows and the skipped records are not the whole split.
      faults.CorpusDamaged: more skipped records than the budget.
    """
    skipped = int(mesh_lib.sum_over_processes(np.array([skipped]))[0])
    rows = sorted(mesh_lib.allgather_json(rows), key=lambda r: r["id"])
    if len(rows) + skipped != index.num_records:
        raise RuntimeError(
            f"scored {len(rows)} and skipped {skipped} of {index.num_records} utterances "
            f"of {split}; evaluation must cover the whole split"
        )
    faults.CorruptBudget(index.num_records, build.max_corrupt_fraction(config), split).add(
        0, skipped, fault_log.by_shard
    )
    return rows, skipped
