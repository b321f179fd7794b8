"""Teacher targets for distillation and pseudo-labels: `python -m jaxspeech.distill.targets`.

    python -m jaxspeech.distill.targets --teacher RUN --data DIR --split NAME --top_k K \
        --output OUT [--step S] [--batch_seconds X] [--max_shards N] \
        [--pseudo_labels PDIR [--min_confidence C]] [multi-host flags]

A CTC teacher (a run with a CTC head) labels a prepared split: per input shard i of n it
writes ``OUT/NAME/targets-<i>-of-<n>.array_record``, one target record per input record in
the same order (`jaxspeech.distill.records`): the K most probable labels of every teacher
frame with their float16 log-posteriors, the greedy CTC transcript (decoded as evaluation's
ctc_greedy decodes) and its confidence. `read_targets(OUT, NAME)` reads them back by
(shard, index).

Confidence = exp(mean over the T' frames of log max_v p_t(v)): the geometric mean of the
greedy path's per-frame posterior, P(greedy path) ** (1 / T'). It is normalized by length
(long and short utterances compare), lies in (0, 1], and, unlike the arithmetic mean of the
max posteriors, a few near-uniform frames (where a word is likely wrong) pull it down
multiplicatively instead of being averaged away by the many confident blank frames. It is
computed in float32; exp(mean(logprobs[:, 0])) of a record gives it back to float16
rounding. An utterance with no frames scores 0.

Multi-host: every process joins the `jax.distributed` job, restores the teacher onto a mesh
of its own local devices and labels the input shards i with i % P == p. Inference needs no
collective, so no process waits for another while labelling; the processes exchange their
lists of shards once at the start, and at the end each waits for the completion markers of
every shard of this invocation; process 0 then writes ``OUT/NAME/targets.json`` (teacher,
step, K, V, frame rate, totals, throughput) once every shard is complete.

Resumable: a shard is written under a temporary name, renamed when complete, then marked
with ``<shard>.done.json`` (records, bytes, the source shard and its record count). A rerun
skips a shard whose marker matches and redoes any other from scratch; `--max_shards N`
labels at most N shards per process and invocation (time-limited queues). Batches have the
teacher's fixed evaluation bucket shapes, in eval mode, so the bytes are the same however
the job is split, stopped and restarted (same devices per process).

Records that cannot be read, and utterances longer than the teacher's last bucket, get a
target record marked missing (alignment holds); they are counted and reported with the
reason, never dropped silently.

`--pseudo_labels PDIR` also writes the prepared split PDIR/NAME (one shard per input shard,
index, durations, stats.json copied from DIR/NAME: the same audio, a subset of it) of the
records whose confidence >= `--min_confidence`, the transcript replaced by the teacher's
(audio samples unchanged), and PDIR/tokenizer, the teacher's own (its transcripts and
target indices are in the teacher's labels). ``index.json`` is written last, once every
shard is complete, so a split with an index is a complete one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import cli
from jaxspeech import state as state_lib
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.distill import pseudo
from jaxspeech.distill import records as trecords
from jaxspeech.errors import UserError
from jaxspeech.parallel import mesh as mesh_lib

_POLL_S = 1.0  # how often a finished process looks for the other processes' markers
_WAIT_REPORT_S = 60.0  # how often it says what it is waiting for


@dataclasses.dataclass(frozen=True)
class Request:
    """The command line of a targets job."""

    teacher: str
    data: str
    split: str
    top_k: int
    output: str
    step: int | None = None
    batch_seconds: float | None = None  # None: the teacher's data.batch_seconds
    pseudo_dir: str | None = None
    min_confidence: float = 0.0
    max_shards: int | None = None  # None: every shard of this process

    @property
    def out_dir(self) -> str:
        return os.path.join(self.output, self.split)

    @property
    def pseudo_split_dir(self) -> str | None:
        return os.path.join(self.pseudo_dir, self.split) if self.pseudo_dir else None


# ---------------------------------------------------------------- checks
def _same(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def check_request(req: Request) -> tuple[ConfigDict, records.SplitIndex]:
    """The teacher's config and the split's index, once the request is known to be doable.

    Raises:
      UserError: no such run, a teacher without a CTC head, K outside [1, V], no such
        split, an unusable output or pseudo-label directory, bad numbers.
    """
    try:
        config = state_lib.load_run_config(req.teacher)
    except FileNotFoundError as e:
        raise UserError(f"--teacher: {e}") from e
    if "ctc" not in config.model.head.split("+"):
        raise UserError(
            f"--teacher {req.teacher} has model.head={config.model.head!r}: the targets are "
            "CTC posteriors, so the teacher needs a CTC head (ctc or ctc+rnnt)"
        )
    tok_dir = os.path.join(req.teacher, state_lib.ASSETS, state_lib.TOKENIZER)
    try:
        vocab = Tokenizer.load(tok_dir).vocab_size
    except (OSError, ValueError) as e:
        raise UserError(f"--teacher: the run's tokenizer cannot be read: {e}") from e
    if not 1 <= req.top_k <= vocab:
        raise UserError(
            f"--top_k must be in [1, {vocab}] (the teacher's labels, blank included), "
            f"got {req.top_k}"
        )
    if req.batch_seconds is not None and req.batch_seconds <= 0:
        raise UserError(f"--batch_seconds must be positive, got {req.batch_seconds}")
    if req.max_shards is not None and req.max_shards < 1:
        raise UserError(f"--max_shards must be >= 1, got {req.max_shards}")
    try:
        index = records.read_split_index(req.data, req.split)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"--data/--split: {e}") from e
    if index.sample_rate != config.features.sample_rate:
        raise UserError(
            f"{req.data}/{req.split} is at {index.sample_rate} Hz, the teacher at "
            f"{config.features.sample_rate} Hz"
        )
    _check_outputs(req)
    return config, index


def _check_outputs(req: Request) -> None:
    """OUT/NAME (and PDIR/NAME) exist and are writable, and overwrite no input."""
    dirs = [("--output", req.output)]
    if req.pseudo_dir:
        dirs.append(("--pseudo_labels", req.pseudo_dir))
        if not 0.0 <= req.min_confidence <= 1.0:
            raise UserError(f"--min_confidence must be in [0, 1], got {req.min_confidence}")
        if _same(req.pseudo_dir, req.output):
            raise UserError("--pseudo_labels must be another directory than --output")
        stats = os.path.join(req.data, req.split, "stats.json")
        if not os.path.isfile(stats):
            raise UserError(
                f"{stats} not found: the pseudo-label split copies the source split's "
                "feature statistics (re-prepare DIR/NAME with data_prep.prepare)"
            )
    for flag, path in dirs:
        if _same(path, req.data) or _same(path, req.teacher):
            raise UserError(f"{flag} {path} must not be the data directory or the teacher run")
        split_dir = os.path.join(path, req.split)
        try:
            os.makedirs(split_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"{flag}: cannot create {split_dir}: {e}") from e
        if not os.access(split_dir, os.W_OK):
            raise UserError(f"{flag}: {split_dir} is not writable")


# ---------------------------------------------------------------- the teacher
def make_infer_fn(graphdef, k: int, index_dtype: str) -> Callable:
    """infer(params, model_vars, audio (B, S), audio_len (B,)) -> {indices (B, T', K),
    logprobs (B, T', K) float16, greedy (B, T') argmax labels, lengths (B,) frames,
    confidence (B,) float32}: only the top-k leaves the device, never (B, T', V)."""

    @jax.jit
    def infer(params, model_vars, audio_bs, audio_len_b):
        model = nnx.merge(graphdef, params, model_vars)
        enc, lengths = model(audio_bs, audio_len_b, train=False)
        logits = model.ctc_logits(enc)  # (B, T', V) float32
        logp = jax.nn.log_softmax(logits, axis=-1)
        top_lp, top_ids = jax.lax.top_k(logp, k)  # (B, T', K), best first
        valid = jnp.arange(logp.shape[1])[None, :] < lengths[:, None]
        mean_log_max = jnp.sum(jnp.where(valid, top_lp[..., 0], 0.0), axis=1) / jnp.maximum(
            lengths, 1
        )
        return {
            "indices": top_ids.astype(index_dtype),
            "logprobs": top_lp.astype(jnp.float16),
            # Evaluation's ctc_greedy: the argmax of the logits (ties: the lowest label).
            "greedy": ctc_decoding.greedy_ids(logits),
            "lengths": lengths,
            "confidence": jnp.where(lengths > 0, jnp.exp(mean_log_max), 0.0),
        }

    return infer


@dataclasses.dataclass
class Job:
    """A request with its teacher loaded on this process's devices and its split."""

    req: Request
    index: records.SplitIndex
    run: state_lib.Run
    mesh: Mesh
    spec: pipeline_lib.BucketSpec
    infer: Callable  # (audio (B, S), audio_len (B,)) -> host numpy dict of make_infer_fn
    frame_samples: int
    prefetch: int

    @property
    def num_shards(self) -> int:
        return len(self.index.shard_paths)

    @property
    def vocab_size(self) -> int:
        return self.run.tokenizer.vocab_size

    @property
    def identity(self) -> dict:
        """What every marker of one job's output shares (a rerun must match it). The batch
        shapes are not part of it: a rerun on hosts with other device counts pads
        otherwise, which changes the numbers by float rounding only."""
        return {
            "teacher": os.path.abspath(self.req.teacher),
            "step": self.run.step,
            "top_k": self.req.top_k,
            "vocab_size": self.vocab_size,
            "data": os.path.abspath(self.req.data),
            "split": self.req.split,
            "num_shards": self.num_shards,
        }

    @property
    def pseudo_settings(self) -> dict | None:
        if not self.req.pseudo_dir:
            return None
        return {
            "dir": os.path.abspath(self.req.pseudo_dir),
            "min_confidence": self.req.min_confidence,
        }

    def shard_slice(self, shard: int) -> slice:
        start = sum(self.index.shard_num_records[:shard])
        return slice(start, start + self.index.shard_num_records[shard])


def load_job(req: Request, config: ConfigDict, index: records.SplitIndex) -> Job:
    """The teacher restored onto a mesh of this process's own devices.

    The run's own mesh.rules are not used: on a data-only mesh every parameter is whole on
    each device, and the default rules put the batch on that axis.

    Raises:
      UserError: no such checkpoint, or an unreadable one.
    """
    mesh = mesh_lib.make_mesh({"data": -1}, devices=jax.local_devices())
    try:
        run = state_lib.load_run(req.teacher, step=req.step, mesh=mesh, config=config)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(f"--teacher: {e}") from e
    bounds = config.data.eval_bucket_boundaries or config.data.bucket_boundaries
    spec = pipeline_lib.make_bucket_spec(
        bounds,
        req.batch_seconds or config.data.batch_seconds,
        config.data.max_tokens_per_second,
        config.features.sample_rate,
        multiple_of=mesh_lib.num_batch_shards(mesh),
    )
    dtype = trecords.index_dtype(run.tokenizer.vocab_size)
    infer = make_infer_fn(run.spec.graphdef, req.top_k, dtype)

    def on_host(audio: np.ndarray, audio_len: np.ndarray) -> dict:
        arrays = {
            k: jax.device_put(v, mesh_lib.batch_sharding(mesh, v.ndim))
            for k, v in (("audio", audio), ("audio_len", audio_len))
        }
        out = infer(run.params, run.model_vars, arrays["audio"], arrays["audio_len"])
        return jax.device_get(out)

    model = nnx.merge(run.spec.graphdef, run.params, run.model_vars)
    return Job(req, index, run, mesh, spec, on_host, model.frame_samples, config.data.prefetch)


# ---------------------------------------------------------------- one shard
def _encode(job: Job, rid: str, indices, logprobs, transcript, confidence, missing=None):
    """(record bytes, the header fields the marker and the pseudo-labels need)."""
    k = job.req.top_k
    dtype = trecords.index_dtype(job.vocab_size)
    if missing is not None:
        indices, logprobs = np.zeros((0, k), dtype), np.zeros((0, k), np.float16)
    data = trecords.encode_target_record(
        id=rid,
        indices=indices,
        logprobs=logprobs,
        transcript=transcript,
        confidence=confidence,
        index_dtype=dtype,
        k=k,
        missing=missing,
    )
    head = {"id": rid, "frames": len(indices), "transcript": transcript}
    return data, head | {"confidence": confidence, "missing": missing}


def _missing(job: Job, rid: str, kind: str, reason: str):
    return _encode(job, rid, None, None, "", None, {"kind": kind, "reason": reason})


def _too_long(job: Job, reader: reader_lib.RecordReader, j: int, seconds: float):
    """The missing target of record j, too long for the last bucket (its id read)."""
    data, faults, _ = reader.read([j])
    if faults:
        return _missing(job, "", "unreadable", faults[0].error)
    try:
        rid = records.decode_header(data[0])["id"]
    except ValueError as e:
        return _missing(job, "", "unreadable", str(e))
    last = job.spec.boundaries[-1]
    return _missing(
        job,
        rid,
        "too_long",
        f"{seconds:.2f} s is longer than the teacher's last bucket ({last:g} s)",
    )


def _batch_targets(job: Job, planned: pipeline_lib.PlannedBatch, batch: dict) -> dict:
    """{record index in the shard: (bytes, head)} of one loaded batch."""
    out = job.infer(batch["audio"], batch["audio_len"])
    labels = ctc_decoding.collapse(out["greedy"], out["lengths"], job.run.tokenizer.blank_id)
    errors = {int(f["record"]): f["error"] for f in batch["faults"]}
    result = {}
    for row, j in enumerate(int(i) for i in planned.indices):
        if j == pipeline_lib.PAD_INDEX:
            continue
        if batch["corrupt"][row]:
            result[j] = _missing(job, "", "unreadable", errors[j])
            continue
        n = int(out["lengths"][row])
        result[j] = _encode(
            job,
            batch["id"][row],
            out["indices"][row, :n],
            out["logprobs"][row, :n],
            job.run.tokenizer.decode(labels[row]),
            float(out["confidence"][row]),
        )
    return result


def shard_targets(job: Job, shard: int) -> list[tuple[bytes, dict]]:
    """Every record's (target bytes, head) of input shard `shard`, in the shard's order.

    The shard's records are batched by the teacher's buckets, in order within each bucket
    (`BatchPlan` without shuffling): fixed shapes, so the same bytes on every run.
    """
    path, count = job.index.shard_paths[shard], job.index.shard_num_records[shard]
    durations = job.index.durations[job.shard_slice(shard)]
    reader = reader_lib.RecordReader([path], [count])
    samples = np.round(durations.astype(np.float64) * job.spec.sample_rate)
    fits = samples <= job.spec.num_samples(len(job.spec.boundaries) - 1)
    result = {
        int(j): _too_long(job, reader, int(j), float(durations[j])) for j in np.flatnonzero(~fits)
    }
    if fits.any():
        plan = pipeline_lib.BatchPlan(durations, job.spec, seed=0, shuffle=False, num_epochs=1)
        load = pipeline_lib.LoadBatch([path], [count], job.run.tokenizer_dir, job.spec, True)
        pipe = pipeline_lib.Pipeline(plan, load, job.index, prefetch=job.prefetch)
        for planned, batch in zip(plan.epoch(0), pipe.dataset(), strict=True):
            result.update(_batch_targets(job, planned, batch))
    return [result[j] for j in range(count)]


def label_shard(job: Job, shard: int) -> dict:
    """Targets (and pseudo-labels) of input shard `shard`, then its completion marker."""
    t0 = time.time()
    name = trecords.targets_name(shard, job.num_shards)
    path = os.path.join(job.req.out_dir, name)
    if os.path.exists(path + trecords.DONE_SUFFIX):
        os.remove(path + trecords.DONE_SUFFIX)  # a stale marker must never outlive its shard
    items = shard_targets(job, shard)
    heads = [head for _, head in items]
    durations = job.index.durations[job.shard_slice(shard)].astype(np.float64)
    labelled = [j for j, h in enumerate(heads) if h["missing"] is None]
    marker = {
        "job": job.identity,
        "shard": name,
        "records": len(items),
        "bytes": trecords.write_file(path, [data for data, _ in items]),
        "record_bytes": sum(len(data) for data, _ in items),
        "source": job.index.shard_paths[shard],
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


# ---------------------------------------------------------------- markers
def complete_marker(job: Job, shard: int) -> dict | None:
    """Shard `shard`'s marker if the shard is complete for this job, else None.

    Raises:
      UserError: the marker was written by another job (another teacher, step, K, data).
    """
    path = os.path.join(job.req.out_dir, trecords.targets_name(shard, job.num_shards))
    try:
        with open(path + trecords.DONE_SUFFIX, encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if marker.get("job") != job.identity:
        raise UserError(
            f"{path} holds the targets of another job ({marker.get('job')}, this one is "
            f"{job.identity}): use another --output, or remove it"
        )
    ok = (
        marker["source"] == job.index.shard_paths[shard]
        and marker["source_records"] == marker["records"] == job.index.shard_num_records[shard]
        and trecords.file_size(path) == marker["bytes"]
    )
    if ok and job.pseudo_settings is not None:
        pseudo = marker.get("pseudo")
        ok = (
            pseudo is not None
            and pseudo["settings"] == job.pseudo_settings
            and trecords.file_size(os.path.join(job.req.pseudo_split_dir, pseudo["path"]))
            == pseudo["bytes"]
        )
    return marker if ok else None


def wait_for_markers(job: Job, shards: list[int]) -> dict[int, dict]:
    """Blocks until every shard of `shards` is complete; {shard: marker}. A dead peer
    ends the wait: jax.distributed terminates the other processes once its heartbeats
    stop (--heartbeat_timeout_s)."""
    found: dict[int, dict] = {}
    last_report = time.time()
    while True:
        for s in shards:
            if s not in found and (marker := complete_marker(job, s)) is not None:
                found[s] = marker
        if len(found) == len(shards):
            return found
        if time.time() - last_report > _WAIT_REPORT_S:
            left = sorted(set(shards) - set(found))
            print(f"targets: waiting for {len(left)} shard(s) of other processes: {left[:8]}")
            last_report = time.time()
        time.sleep(_POLL_S)


# ---------------------------------------------------------------- the summary
CONFIDENCE = "exp(mean over frames of log max_v p_t(v)) = P(greedy path) ** (1 / T')"


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def process_line(job: Job, done: list[dict], complete: int, mine: int, wall_s: float) -> str:
    """This process's console line: what it labelled in this invocation, and how fast."""
    audio_s = sum(m["audio_seconds"] for m in done)
    kinds = [r["kind"] for m in done for r in m["missing"]]
    return (
        f"targets: process {jax.process_index()} of {jax.process_count()}: labelled "
        f"{len(done)} of its {mine} shard(s) ({complete} already complete), "
        f"{sum(m['records'] for m in done)} utterances, {_hours(audio_s):.4f} h of audio in "
        f"{wall_s:.1f} s: {_hours(audio_s) / max(wall_s, 1e-9):.5f} h of audio per second "
        f"({audio_s / max(wall_s, 1e-9):.1f} x real time); {kinds.count('unreadable')} "
        f"unreadable, {kinds.count('too_long')} too long"
    )


def report_missing(marker: dict, limit: int = 10) -> None:
    """Print the utterances of a shard that got no targets, with why (the marker and
    targets.json list them all)."""
    for r in marker["missing"][:limit]:
        print(f"targets: {marker['source']}[{r['index']}] {r['id']!r}: {r['kind']}: {r['reason']}")
    if len(marker["missing"]) > limit:
        print(f"targets: ... and {len(marker['missing']) - limit} more in {marker['shard']}")


def _throughput(markers: dict[int, dict], planned: list[int], wall_s: float) -> dict:
    """Totals over every shard (per process-second of labelling) and over this invocation
    (all processes, per second of process 0's wall time, start-up and waits included)."""
    audio_s = sum(m["audio_seconds"] for m in markers.values())
    shard_s = sum(m["seconds"] for m in markers.values())
    now_s = sum(markers[s]["audio_seconds"] for s in planned)
    return {
        "shard_seconds": round(shard_s, 3),
        "audio_hours_per_process_second": _hours(audio_s) / max(shard_s, 1e-9),
        "invocation": {
            "processes": jax.process_count(),
            "shards": len(planned),
            "audio_hours": _hours(now_s),
            "wall_seconds": round(wall_s, 3),
            "audio_hours_per_second": _hours(now_s) / max(wall_s, 1e-9),
            "real_time_factor": now_s / max(wall_s, 1e-9),
        },
    }


def summarize(job: Job, markers: dict[int, dict], planned: list[int], wall_s: float) -> dict:
    """targets.json: the teacher, the format, the totals over every shard, throughput."""
    ms = [markers[s] for s in range(job.num_shards)]
    missing = [dict(r, shard=s) for s, m in enumerate(ms) for r in m["missing"]]
    num_records = sum(m["records"] for m in ms)
    audio_s, frames = sum(m["audio_seconds"] for m in ms), sum(m["frames"] for m in ms)
    out_bytes, record_bytes = sum(m["bytes"] for m in ms), sum(m["record_bytes"] for m in ms)
    full_bytes = frames * job.vocab_size * 2  # (T' x V) float16 per utterance
    config, rate = job.run.config, job.spec.sample_rate
    labelled = num_records - len(missing)
    return {
        "teacher": os.path.abspath(job.req.teacher),
        "step": job.run.step,
        "k": job.req.top_k,
        "vocab_size": job.vocab_size,
        "index_dtype": trecords.index_dtype(job.vocab_size),
        "logprob_dtype": "float16",
        "sample_rate": rate,
        "hop_length": int(config.features.hop_length),
        "subsampling": job.frame_samples // int(config.features.hop_length),
        "frame_samples": job.frame_samples,
        "frame_rate_hz": rate / job.frame_samples,
        "confidence": {
            "definition": CONFIDENCE,
            "mean": sum(m["confidence_sum"] for m in ms) / max(labelled, 1),
        },
        "data": os.path.abspath(job.req.data),
        "split": job.req.split,
        "num_shards": job.num_shards,
        "num_records": num_records,
        "num_labelled": labelled,
        "missing": {
            "count": len(missing),
            "by_kind": {
                k: sum(r["kind"] == k for r in missing) for k in ("unreadable", "too_long")
            },
            "records": missing,
        },
        "audio_hours": _hours(audio_s),
        "source_hours": _hours(job.index.seconds),
        "frames": frames,
        # The files (ArrayRecord files grow in 64 KiB blocks, which dominates on tiny
        # shards) and the records themselves (the format's own cost).
        "output_bytes": out_bytes,
        "bytes_per_audio_hour": out_bytes / max(_hours(audio_s), 1e-12),
        "record_bytes": record_bytes,
        "record_bytes_per_audio_hour": record_bytes / max(_hours(audio_s), 1e-12),
        "full_posterior_bytes": full_bytes,
        "full_posterior_ratio": full_bytes / max(out_bytes, 1),
        "full_posterior_ratio_records": full_bytes / max(record_bytes, 1),
        "throughput": _throughput(markers, planned, wall_s),
        "shards": [
            {"path": m["shard"], "num_records": m["records"]}
            | {k: m[k] for k in ("bytes", "record_bytes", "source", "audio_seconds", "seconds")}
            for m in ms
        ],
    }


def describe(summary: dict, out_dir: str) -> str:
    """The console lines of a finished job."""
    s, inv = summary, summary["throughput"]["invocation"]
    lines = [
        f"targets: {s['split']}: {s['num_records']} records in {s['num_shards']} shard(s) -> "
        f"{out_dir} (teacher {s['teacher']} step {s['step']}, top {s['k']} of "
        f"{s['vocab_size']} labels, {s['frames']} frames at {s['frame_rate_hz']:g} Hz)",
        f"  labelled {s['audio_hours']:.4f} h of audio; {s['missing']['count']} missing "
        f"({s['missing']['by_kind']}), listed in targets.json; mean confidence "
        f"{s['confidence']['mean']:.3f}",
        f"  output {s['output_bytes']:,} bytes in files, {s['bytes_per_audio_hour']:,.0f} per "
        f"hour of audio ({s['record_bytes']:,} in records, "
        f"{s['record_bytes_per_audio_hour']:,.0f} per hour); full float16 posteriors "
        f"(T' x V x 2) would take {s['full_posterior_bytes']:,} bytes: "
        f"{s['full_posterior_ratio']:.2f} x the files, "
        f"{s['full_posterior_ratio_records']:.2f} x the records",
        f"  this invocation: {inv['processes']} process(es), {inv['shards']} shard(s), "
        f"{inv['audio_hours']:.4f} h of audio in {inv['wall_seconds']:.1f} s: "
        f"{inv['audio_hours_per_second']:.5f} h of audio per second "
        f"({inv['real_time_factor']:.1f} x real time)",
    ]
    if "pseudo_labels" in s:
        p = s["pseudo_labels"]
        lines.append(
            f"  pseudo-labels: kept {p['num_kept']} of {p['num_input']} ({p['hours_kept']:.4f} h) "
            f"with confidence >= {p['min_confidence']:g}; dropped {p['dropped']}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the job
def finish(job: Job, planned: list[int], wall_s: float) -> dict | None:
    """Process 0, after this invocation's shards: targets.json (and the pseudo-label
    split's index) if every shard is complete; the summary, or None."""
    markers = {s: m for s in range(job.num_shards) if (m := complete_marker(job, s))}
    if len(markers) < job.num_shards:
        print(
            f"targets: {len(markers)} of {job.num_shards} shards complete; run the same command "
            "again to label the rest (complete shards are kept)",
            flush=True,
        )
        return None
    summary = summarize(job, markers, planned, wall_s)
    if job.req.pseudo_dir:
        summary["pseudo_labels"] = pseudo.write_pseudo_split(job, markers)
    trecords.write_json(os.path.join(job.req.out_dir, trecords.SUMMARY_FILE), summary)
    print(describe(summary, job.req.out_dir), flush=True)
    return summary


def label_split(req: Request) -> dict | None:
    """Run the job (every process calls it); process 0 returns targets.json's summary
    when every shard is complete, else None.

    Raises:
      UserError: see `check_request`, `load_job` and `complete_marker`.
    """
    t0 = time.time()
    config, index = check_request(req)
    job = load_job(req, config, index)
    if req.pseudo_dir and jax.process_index() == 0:
        # Written again once every shard is complete: a split with an index is complete.
        stale = os.path.join(req.pseudo_split_dir, records.INDEX_FILE)
        if os.path.exists(stale):
            os.remove(stale)
    mine = list(range(jax.process_index(), job.num_shards, jax.process_count()))
    pending = [s for s in mine if complete_marker(job, s) is None]
    todo = pending[: req.max_shards] if req.max_shards else pending
    # The one exchange between processes before the end: the shards each labels now, so
    # that every process knows which markers to wait for (not those --max_shards leaves).
    planned = sorted(s for shards in mesh_lib.allgather_json([todo]) for s in shards)
    done = []
    with jax.set_mesh(job.mesh):
        for shard in todo:
            done.append(label_shard(job, shard))
            report_missing(done[-1])
    print(process_line(job, done, len(mine) - len(pending), len(mine), time.time() - t0))
    # Every process waits for the others' shards, not only process 0: one that left early
    # would wait in jax.distributed's shutdown barrier instead, which gives up after 300 s.
    wait_for_markers(job, [s for s in planned if s not in todo])
    if jax.process_index() != 0:
        return None
    return finish(job, planned, time.time() - t0)


# ---------------------------------------------------------------- command line
FLAGS = flags.FLAGS


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """This command's flags (the multi-host ones come from `mesh.define_flags`)."""
    flags.DEFINE_string("teacher", None, "Run directory of the CTC teacher.", flag_values=fv)
    flags.DEFINE_string("data", None, "Prepared data directory.", flag_values=fv)
    flags.DEFINE_string("split", None, "Split of --data to label.", flag_values=fv)
    flags.DEFINE_integer("top_k", None, "Labels kept per frame, in [1, V].", flag_values=fv)
    flags.DEFINE_string("output", None, "Targets directory: OUT/<split>/.", flag_values=fv)
    for name in ("teacher", "data", "split", "top_k", "output"):
        flags.mark_flag_as_required(name, flag_values=fv)
    flags.DEFINE_integer("step", None, "Teacher checkpoint (default: latest).", flag_values=fv)
    flags.DEFINE_float(
        "batch_seconds",
        None,
        "Padded audio per batch (default: the teacher's data.batch_seconds).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "max_shards",
        None,
        "Label at most this many shards per process in this invocation, then stop (a "
        "time-limited queue); run again to continue.",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "pseudo_labels",
        None,
        "Also write a prepared split PDIR/<split> of the confident utterances with the "
        "teacher's transcripts.",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "min_confidence",
        None,
        "With --pseudo_labels: keep utterances of at least this confidence (default 0).",
        flag_values=fv,
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    if FLAGS.min_confidence is not None and not FLAGS.pseudo_labels:
        cli.usage_error("--min_confidence needs --pseudo_labels")
    req = Request(
        teacher=FLAGS.teacher,
        data=FLAGS.data,
        split=FLAGS.split,
        top_k=FLAGS.top_k,
        output=FLAGS.output,
        step=FLAGS.step,
        batch_seconds=FLAGS.batch_seconds,
        pseudo_dir=FLAGS.pseudo_labels,
        min_confidence=FLAGS.min_confidence or 0.0,
        max_shards=FLAGS.max_shards,
    )
    cli.run_job(lambda: label_split(req))


if __name__ == "__main__":
    mesh_lib.define_flags()
    define_flags()
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
