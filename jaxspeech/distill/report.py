"""What a labeling job reports: each process's line, the records it could not label, and
the split's summary (targets.json: totals, throughput) with its description."""

from __future__ import annotations

import os

import jax

from jaxspeech.common import storage
from jaxspeech.distill import records as trecords
from jaxspeech.distill.job import Job

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
        "data": storage.absolute(job.req.data),
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
