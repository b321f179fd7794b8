"""Label a split with a teacher (every process calls `label_split`): the shards of this
process, then, on process 0, the summary and the pseudo-labelled split once every shard is
complete."""

from __future__ import annotations

import os
import time

import jax
import numpy as np

from jaxspeech.data import records
from jaxspeech.distill import job as job_lib
from jaxspeech.distill import pseudo, report
from jaxspeech.distill import records as trecords
from jaxspeech.parallel import mesh as mesh_lib


# ---------------------------------------------------------------- the job
def finish(job: job_lib.Job, planned: list[int], wall_s: float) -> dict | None:
    """Process 0, after this invocation's shards: targets.json (and the pseudo-label
    split's index) if every shard is complete; the summary, or None."""
    markers = {s: m for s in range(job.num_shards) if (m := job_lib.complete_marker(job, s))}
    if len(markers) < job.num_shards:
        print(
            f"targets: {len(markers)} of {job.num_shards} shards complete; run the same command "
            "again to label the rest (complete shards are kept)",
            flush=True,
        )
        return None
    summary = report.summarize(job, markers, planned, wall_s)
    if job.req.pseudo_dir:
        summary["pseudo_labels"] = pseudo.write_pseudo_split(job, markers)
    trecords.write_json(os.path.join(job.req.out_dir, trecords.SUMMARY_FILE), summary)
    print(report.describe(summary, job.req.out_dir), flush=True)
    return summary


def label_split(req: job_lib.Request) -> dict | None:
    """Run the job (every process calls it); process 0 returns targets.json's summary
    when every shard is complete, else None.

    Raises:
      UserError: see `job_lib.check_request`, `job_lib.load_job` and `job_lib.complete_marker`.
    """
    t0 = time.time()
    config, index = job_lib.check_request(req)
    job = job_lib.load_job(req, config, index)
    if req.pseudo_dir and jax.process_index() == 0:
        # Written again once every shard is complete: a split with an index is complete.
        stale = os.path.join(req.pseudo_split_dir, records.INDEX_FILE)
        if os.path.exists(stale):
            os.remove(stale)
    mine = list(range(jax.process_index(), job.num_shards, jax.process_count()))
    pending = [s for s in mine if job_lib.complete_marker(job, s) is None]
    todo = pending[: req.max_shards] if req.max_shards else pending
    # The one exchange between processes before the end: the shards each labels now, so
    # that every process knows which markers to wait for (not those --max_shards leaves).
    planned = sorted(s for shards in mesh_lib.allgather_json([todo]) for s in shards)
    done = []
    with jax.set_mesh(job.mesh):
        for shard in todo:
            done.append(label_shard(job, shard))
            report.report_missing(done[-1])
    print(report.process_line(job, done, len(mine) - len(pending), len(mine), time.time() - t0))
    # Every process waits for the others' shards, not only process 0: one that left early
    # would wait in jax.distributed's shutdown barrier instead, which gives up after 300 s.
    job_lib.wait_for_markers(job, [s for s in planned if s not in todo])
    if jax.process_index() != 0:
        return None
    return finish(job, planned, time.time() - t0)


def label_shard(job: job_lib.Job, shard: int) -> dict:
    """Targets (and pseudo-labels) of input shard `shard`, then its completion marker."""
    t0 = time.time()
    name = trecords.targets_name(shard, job.num_shards)
    path = os.path.join(job.req.out_dir, name)
    if os.path.exists(path + trecords.DONE_SUFFIX):
        os.remove(path + trecords.DONE_SUFFIX)  # a stale marker must never outlive its shard
    items = job_lib.shard_targets(job, shard)
    heads = [head for _, head in items]
    durations = job.index.durations[job.shard_slice(shard)].astype(np.float64)
    labelled = [j for j, h in enumerate(heads) if h["missing"] is None]
    marker = {
        "job": job.identity,
        "shard": name,
        "records": len(items),
        "bytes": trecords.write_file(path, [data for data, _ in items]),
        "record_bytes": sum(len(data) for data, _ in items),
        "source": job.shard_source(shard),
        "source_records": job.index.shard_num_records[shard],
        "audio_seconds": float(durations[labelled].sum()),
        "frames": sum(h["frames"] for h in heads),
        "confidence_sum": float(sum(heads[j]["confidence"] for j in labelled)),
        "missing": [
            {"index": j, "id": h["id"], **h["missing"]}
            for j, h in enumerate(heads)
            if h["missing"] is not None
        ],
        "process": jax.process_index(),
        "batch_shapes": [list(shape[:2]) for shape in job.spec.shapes()],
    }
    if job.req.pseudo_dir:
        marker["pseudo"] = pseudo.write_pseudo_shard(job, shard, heads)
    marker["seconds"] = round(time.time() - t0, 3)
    trecords.write_json(path + trecords.DONE_SUFFIX, marker)
    return marker
