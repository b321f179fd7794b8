"""The teacher-target record, the file names of a targets directory, and its reader.

A target record is self-describing bytes, like a shard record (`jaxspeech.data.records`):

    b"JTT1" | uint32 little-endian header length | UTF-8 JSON header
            | indices (T' x K, little-endian int16 or int32) | log-probs (T' x K, float16 LE)

The JSON header holds ``{id, num_frames, k, index_dtype, transcript, confidence, missing}``:
T' = ``num_frames`` teacher (encoder) frames, each with its K most probable labels, best
first, and their log-posteriors. ``index_dtype`` is "int16" when the vocabulary fits (V <=
32767), else "int32". ``transcript`` is the teacher's greedy CTC transcript and
``confidence`` its score (`jaxspeech.teach`). A record whose utterance could not
be labelled (unreadable, longer than the teacher's last bucket) keeps its place with
``missing`` = {"kind", "reason"}, zero frames, no arrays and ``confidence`` null, so record
j of targets shard i is always the target of record j of input shard i.

A targets directory ``OUT/<split>/`` holds, per input shard i of n,
``targets-<i:05d>-of-<n:05d>.array_record`` and its completion marker ``<that>.done.json``,
and, once every shard is complete, ``targets.json`` (the summary `read_targets` opens).
Files are written under a temporary name (``<name>.tmp``) and renamed when complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxspeech.common import files
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records as data_records

MAGIC = b"JTT1"
SUMMARY_FILE = "targets.json"
DONE_SUFFIX = ".done.json"
TEMP_SUFFIX = ".tmp"
INDEX_DTYPES = {"int16": "<i2", "int32": "<i4"}
LOGPROB_DTYPE = "<f2"

_HEADER_KEYS = ("id", "num_frames", "k", "index_dtype", "transcript", "confidence", "missing")


def index_dtype(vocab_size: int) -> str:
    """The smallest index type that holds every label id of a `vocab_size` vocabulary."""
    return "int16" if vocab_size <= np.iinfo(np.int16).max else "int32"


def targets_name(shard: int, num_shards: int) -> str:
    """File name of the targets of input shard `shard` of `num_shards`."""
    return f"targets-{shard:05d}-of-{num_shards:05d}.array_record"


def split_shard_name(split: str, shard: int, num_shards: int) -> str:
    """The file name `data_prep.prepare` gives shard `shard` of a prepared split."""
    return f"{split}-{shard:05d}-of-{num_shards:05d}.array_record"


def write_file(path: str, items: Sequence[bytes]) -> int:
    """ArrayRecord file `path` of `items`, written under a temporary name and renamed when
    complete (a kill leaves no file under the final name); returns its size in bytes."""
    from array_record.python.array_record_module import ArrayRecordWriter

    tmp = path + TEMP_SUFFIX
    if os.path.exists(tmp):
        os.remove(tmp)  # a half-written file of a killed run: redone from scratch
    writer = ArrayRecordWriter(tmp, "group_size:1")  # one record per chunk: random access
    try:
        for item in items:
            writer.write(item)
    finally:
        writer.close()
    os.replace(tmp, path)
    return os.path.getsize(path)


def write_json(path: str, value: Any) -> None:
    """`path` replaced atomically (a reader never sees half a file)."""
    files.atomic_write(path, json.dumps(value, indent=1, ensure_ascii=False))


def file_size(path: str) -> int | None:
    """Bytes of `path`, None when it does not exist."""
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def encode_target_record(
    *,
    id: str,
    indices: np.ndarray,
    logprobs: np.ndarray,
    transcript: str,
    confidence: float | None,
    index_dtype: str,
    k: int,
    missing: dict[str, str] | None = None,
) -> bytes:
    """Serializes one utterance's teacher targets.

    Args:
      id: the utterance id ("" when the input record was unreadable).
      indices: (T', K) label ids per frame, best first ((0, K) for a missing record).
      logprobs: (T', K) their log-posteriors (stored as float16).
      transcript: the teacher's greedy transcript.
      confidence: the transcript's score; None for a missing record.
      index_dtype: "int16" or "int32" (`index_dtype`).
      k: K, kept in the header so that a missing record still says it.
      missing: {"kind", "reason"} when the utterance has no targets.

    Returns:
      The record bytes (see the module docstring for the layout).
    """
    if index_dtype not in INDEX_DTYPES:
        raise ValueError(f"index_dtype must be one of {sorted(INDEX_DTYPES)}, got {index_dtype!r}")
    indices, logprobs = np.asarray(indices), np.asarray(logprobs)
    if indices.ndim != 2 or indices.shape != logprobs.shape or indices.shape[1] != k:
        raise ValueError(
            f"indices {indices.shape} and logprobs {logprobs.shape} must both be (T', {k})"
        )
    if missing is not None and indices.shape[0]:
        raise ValueError("a missing record has no frames")
    info = np.iinfo(np.dtype(INDEX_DTYPES[index_dtype]))
    if indices.size and (indices.min() < 0 or indices.max() > info.max):
        raise ValueError(f"label ids outside [0, {info.max}] for {index_dtype}")
    header = {
        "id": str(id),
        "num_frames": int(indices.shape[0]),
        "k": int(k),
        "index_dtype": index_dtype,
        "transcript": str(transcript),
        "confidence": None if confidence is None else float(confidence),
        "missing": missing,
    }
    payload = (
        indices.astype(INDEX_DTYPES[index_dtype]).tobytes()
        + logprobs.astype(LOGPROB_DTYPE).tobytes()
    )
    return data_records.frame(MAGIC, header, payload)


def decode_target_record(data: bytes) -> dict[str, Any]:
    """Parses a target record.

    Returns:
      {id, num_frames: T', k: K, index_dtype, transcript, confidence (None when missing),
       missing ({"kind", "reason"} or None), indices: (T', K) int16|int32,
       logprobs: (T', K) float16}; the arrays are read-only views of `data`.

    Raises:
      ValueError: the bytes are not a target record (magic, lengths or header).
    """
    header, payload = data_records.unframe(data, MAGIC, _HEADER_KEYS, "target record")
    if header["index_dtype"] not in INDEX_DTYPES:
        raise ValueError(f"corrupt target record: index_dtype {header['index_dtype']!r}")
    shape = (int(header["num_frames"]), int(header["k"]))
    idx_dtype = np.dtype(INDEX_DTYPES[header["index_dtype"]])
    idx_bytes = shape[0] * shape[1] * idx_dtype.itemsize
    if len(payload) != idx_bytes + shape[0] * shape[1] * 2:
        raise ValueError(
            f"corrupt target record {header['id']!r}: payload of {len(payload)} bytes "
            f"for {shape} {header['index_dtype']} indices and float16 log-probs"
        )
    indices = np.frombuffer(payload[:idx_bytes], idx_dtype).reshape(shape)
    logprobs = np.frombuffer(payload[idx_bytes:], LOGPROB_DTYPE).reshape(shape)
    return header | {"indices": indices, "logprobs": logprobs}


class TargetsReader:
    """The targets of a finished job by (input shard, record index), for a training
    loader: ``reader[i, j]`` is the target of record j of input shard i. Picklable (shards
    open lazily), with the input pipeline's retries of transient read errors.

    Attributes:
      summary: the job's ``targets.json`` (teacher, step, K, V, frame rate, totals).
      shard_num_records: (n,) records per shard.
    """

    def __init__(self, split_dir: str, summary: dict[str, Any]):
        self.summary = summary
        source = os.path.join(split_dir, SUMMARY_FILE)  # the shards it names stay inside
        self.paths = [files.inside(split_dir, s["path"], source) for s in summary["shards"]]
        self.shard_num_records = [int(s["num_records"]) for s in summary["shards"]]
        self._reader = reader_lib.RecordReader(self.paths, self.shard_num_records)

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        """The target of record `index` of input shard `shard` (`decode_target_record`)."""
        shard, index = key
        if not (0 <= shard < len(self.paths) and 0 <= index < self.shard_num_records[shard]):
            raise IndexError(f"no target ({shard}, {index}) in {len(self.paths)} shards")
        return self.read_positions([int(self._reader.starts[shard]) + index])[0]

    def read_positions(self, positions: Sequence[int]) -> list[dict[str, Any]]:
        """The targets of the split's records at global `positions` (shards in index order,
        records in file order: the input pipeline's record indices), in that order.

        Raises:
          ValueError: a target that cannot be read (named, with the count).
        """
        data, faults, _ = self._reader.read([int(p) for p in positions])
        if faults:
            named = "; ".join(f"{f.shard}[{f.index}]: {f.error}" for f in faults[:3])
            raise ValueError(f"{len(faults)} unreadable targets ({named})")
        return [decode_target_record(d) for d in data]


def read_targets(output: str, split: str) -> TargetsReader:
    """The targets `python -m jaxspeech.teach --output OUT --split NAME` wrote.

    Raises:
      FileNotFoundError: OUT/NAME has no targets.json: the job has not finished (run it
        again: complete shards are skipped).
      reader.ShardError: a shard the summary lists is missing or of another record count.
    """
    split_dir = os.path.join(output, split)
    path = os.path.join(split_dir, SUMMARY_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: the targets job for {split!r} has not finished; run it again "
            "(complete shards are kept)"
        )
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    reader = TargetsReader(split_dir, summary)
    reader_lib.check_shards(reader.paths, reader.shard_num_records)
    return reader
