"""Pseudo-labels from a teacher's targets: the prepared split `python -m
jaxspeech.teach --pseudo_labels PDIR` writes (the confident records with the
teacher's transcripts, the source's audio and statistics, the teacher's tokenizer).
Called by `jaxspeech.teach` per shard and once at the end."""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

import numpy as np

from jaxspeech.common import storage
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, normalize_text
from jaxspeech.distill import records as trecords
from jaxspeech.runs import assets

if TYPE_CHECKING:  # the job's state (the job itself never imports this module)
    from jaxspeech.distill.job import Job

PSEUDO_REPORT = "pseudo_labels.json"
DROP_REASONS = ("missing", "empty_transcript", "low_confidence")  # of a pseudo-label


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def drop_reason(head: dict, min_confidence: float) -> str | None:
    """Why an utterance gets no pseudo-label, or None when it is kept."""
    if head["missing"] is not None:
        return "missing"
    if not normalize_text(head["transcript"]):  # what prepare skips as an empty transcript
        return "empty_transcript"
    if head["confidence"] < min_confidence:
        return "low_confidence"
    return None


def write_pseudo_shard(job: Job, shard: int, heads: list[dict]) -> dict:
    """PDIR/NAME's shard `shard`: the source records kept, with the teacher's transcript.
    Returns its marker entry {path, num_records, seconds, kept, dropped, bytes, settings}."""
    path, count = job.index.shard_paths[shard], job.index.shard_num_records[shard]
    kept, dropped = [], dict.fromkeys(DROP_REASONS, 0)
    for j, head in enumerate(heads):
        reason = drop_reason(head, job.req.min_confidence)
        if reason is None:
            kept.append(j)
        else:
            dropped[reason] += 1
    data, faults, _ = reader_lib.RecordReader([path], [count]).read(kept)
    if faults:  # they were read a moment ago: the storage is failing now
        raise RuntimeError(f"{path}[{faults[0].index}] became unreadable: {faults[0].error}")
    items = []
    for j, raw in zip(kept, data):
        rec, fmt = records.decode_record(raw), records.decode_header(raw)["audio_format"]
        items.append(
            records.encode_record(
                id=rec["id"],
                audio=rec["audio"],
                sample_rate=rec["sample_rate"],
                text=heads[j]["transcript"],
                speaker=rec["speaker"],
                audio_format=fmt,
            )
        )
    name = trecords.split_shard_name(job.req.split, shard, job.num_shards)
    size = trecords.write_file(os.path.join(job.req.pseudo_split_dir, name), items)
    seconds = float(job.index.durations[job.shard_slice(shard)][kept].astype(np.float64).sum())
    return {
        "path": name,
        "num_records": len(kept),
        "seconds": seconds,
        "kept": kept,
        "dropped": dropped,
        "bytes": size,
        "settings": job.pseudo_settings,
    }


def _copy_tokenizer(src: str, data_dir: str) -> None:
    """DATA/tokenizer := `src` (kept when it is the same tokenizer already)."""
    dst = os.path.join(data_dir, assets.TOKENIZER)
    if os.path.isdir(dst) and Tokenizer.load(dst) == Tokenizer.load(src):
        return
    tmp = dst + trecords.TEMP_SUFFIX
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)


def write_pseudo_split(job: Job, markers: dict[int, dict]) -> dict:
    """PDIR/NAME's index, durations, statistics and report, and PDIR/tokenizer, from the
    complete shards' markers; the index last. Returns the report."""
    req, n = job.req, job.num_shards
    pseudo = [markers[s]["pseudo"] for s in range(n)]
    durations = [job.index.durations[job.shard_slice(s)][p["kept"]] for s, p in enumerate(pseudo)]
    source_dir = os.path.join(storage.local_data(req.data, req.split), req.split)
    report = {
        "source": storage.absolute(storage.join(req.data, req.split)),
        "teacher": storage.absolute(req.teacher),
        "step": job.run.step,
        "min_confidence": req.min_confidence,
        "num_input": job.index.num_records,
        "num_kept": sum(p["num_records"] for p in pseudo),
        "hours_kept": _hours(sum(p["seconds"] for p in pseudo)),
        "dropped": {k: sum(p["dropped"][k] for p in pseudo) for k in DROP_REASONS},
        "stats": "copied from the source split (the same audio; these records are a subset)",
    }
    shutil.copy(
        os.path.join(source_dir, "stats.json"), os.path.join(req.pseudo_split_dir, "stats.json")
    )
    _copy_tokenizer(job.run.tokenizer_dir, req.pseudo_dir)
    trecords.write_json(os.path.join(req.pseudo_split_dir, PSEUDO_REPORT), report)
    with open(os.path.join(source_dir, records.INDEX_FILE), encoding="utf-8") as f:
        audio_format = json.load(f).get("audio_format", "pcm_s16le")
    records.write_split_index(
        req.pseudo_split_dir,
        [{k: p[k] for k in ("path", "num_records", "seconds")} for p in pseudo],
        np.concatenate([np.zeros(0, np.float32), *durations]),
        extra={
            "split": req.split,
            "sample_rate": job.index.sample_rate,
            "audio_format": audio_format,
            "num_shards": n,
            "pseudo_labels": {
                k: report[k] for k in ("source", "teacher", "step", "min_confidence")
            },
        },
    )
    return report
