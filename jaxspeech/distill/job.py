"""A teacher-labeling job: the request and its checks, the loaded teacher on the mesh, and
the labeling of one shard (top-k targets per frame, written under a temporary name and
marked complete), resumable shard by shard (see `jaxspeech.teach`)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.distill import records as trecords
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import assets, loading
from jaxspeech.runs import checkpoint as ckpt_lib

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
        config = loading.load_run_config(req.teacher)
    except FileNotFoundError as e:
        raise UserError(f"--teacher: {e}") from e
    if "ctc" not in config.model.head.split("+"):
        raise UserError(
            f"--teacher {req.teacher} has model.head={config.model.head!r}: the targets are "
            "CTC posteriors, so the teacher needs a CTC head (ctc, ctc+rnnt or ctc+aed)"
        )
    tok_dir = os.path.join(req.teacher, assets.ASSETS, assets.TOKENIZER)
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
        local = storage.local_data(req.data, req.split)  # a URL: its mirror
        stats = os.path.join(local, req.split, "stats.json")
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
    run: loading.Run
    mesh: Mesh
    spec: pipeline_lib.BucketSpec
    infer: Callable  # (audio (B, S), audio_len (B,)) -> host numpy dict of make_infer_fn
    frame_samples: int
    prefetch: int

    @property
    def num_shards(self) -> int:
        return len(self.index.shard_paths)

    def shard_source(self, shard: int) -> str:
        """Where shard ``shard`` of the split lives, as markers record it: its URL when the
        data is on an object store (the local mirror differs from host to host)."""
        path = self.index.shard_paths[shard]
        if not storage.is_remote(self.req.data):
            return path
        return storage.join(self.req.data, self.req.split, os.path.basename(path))

    @property
    def vocab_size(self) -> int:
        return self.run.tokenizer.vocab_size

    @property
    def identity(self) -> dict:
        """What every marker of one job's output shares (a rerun must match it). The batch
        shapes are not part of it: a rerun on hosts with other device counts pads
        otherwise, which changes the numbers by float rounding only."""
        return {
            "teacher": storage.absolute(self.req.teacher),
            "step": self.run.step,
            "top_k": self.req.top_k,
            "vocab_size": self.vocab_size,
            "data": storage.absolute(self.req.data),
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
        run = loading.load_run(req.teacher, step=req.step, mesh=mesh, config=config)
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
        marker["source"] == job.shard_source(shard)
        and marker["source_records"] == marker["records"] == job.index.shard_num_records[shard]
        and trecords.file_size(path) == marker["bytes"]
    )
    if ok and job.pseudo_settings is not None:
        pseudo = marker.get("pseudo")
        ok = (
            pseudo is not None
            and pseudo["settings"] == job.pseudo_settings
            and trecords.file_size(
                files.inside(job.req.pseudo_split_dir, pseudo["path"], path + trecords.DONE_SUFFIX)
            )
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
