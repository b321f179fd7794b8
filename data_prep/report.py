"""The preparation report: skip and notice events, their counted summary with examples
(``prep_report.json``), and the lines printed about a finished preparation."""

from __future__ import annotations

import heapq
import os
from typing import Any

import apache_beam as beam
import numpy as np

MAX_EXAMPLES = 10

# Event kinds: a skip, or a notice about a written record.
SKIPPED, RESAMPLED, DOWNMIXED = "skipped", "resampled", "downmixed"
EVENTS, TEXTS = "events", "texts"  # Tagged-output names.


class EventSummaryFn(beam.CombineFn):
    """(kind, reason, id) events -> {"kind/reason": [count, up to k smallest ids]}."""

    def __init__(self, max_examples: int = MAX_EXAMPLES):
        self._k = max_examples

    def create_accumulator(self) -> dict[str, list[Any]]:
        return {}

    def add_input(self, acc: dict[str, list[Any]], event: tuple[str, str, str]) -> Any:
        kind, reason, item_id = event
        entry = acc.setdefault(f"{kind}/{reason}", [0, []])
        entry[0] += 1
        if item_id not in entry[1]:
            entry[1] = heapq.nsmallest(self._k, [*entry[1], item_id])
        return acc

    def merge_accumulators(self, accs: Any) -> dict[str, list[Any]]:
        merged: dict[str, list[Any]] = {}
        for acc in accs:
            for key, (count, examples) in acc.items():
                entry = merged.setdefault(key, [0, []])
                entry[0] += count
                entry[1] = heapq.nsmallest(self._k, set(entry[1]) | set(examples))
        return merged

    def extract_output(self, acc: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {key: [count, sorted(examples)] for key, (count, examples) in acc.items()}


def summarize_events(events: dict[str, list[Any]]) -> dict[str, Any]:
    """events.json -> the report's skipped / resampled / downmixed sections."""
    section: dict[str, Any] = {SKIPPED: {}, RESAMPLED: None, DOWNMIXED: None}
    for key in sorted(events):
        kind, reason = key.split("/", 1)
        count, examples = events[key]
        entry = {"count": count, "examples": examples}
        if kind == SKIPPED:
            section[SKIPPED][reason] = entry
        else:
            section[kind] = entry
    for kind in (RESAMPLED, DOWNMIXED):
        section[kind] = section[kind] or {"count": 0, "examples": []}
    return section


def spread(values: list[float]) -> dict[str, float]:
    """min / mean / max of the shards' audio: how equal the shards came out."""
    v = np.asarray(values, np.float64)
    return {"min": float(v.min()), "mean": float(v.mean()), "max": float(v.max())}


def format_report(report: dict[str, Any]) -> str:
    """A few human-readable lines about a finished preparation."""
    split_dir = report["split_dir"]
    lines = [
        f"{report['split']}: wrote {report['num_written']:,} of {report['num_input']:,} items "
        f"({report['hours_written']:.2f} h) into {report['num_shards']} shard(s) at {split_dir} "
        f"in {report['elapsed_s']:.1f} s"
    ]
    for reason, entry in report["skipped"].items():
        lines.append(
            f"  skipped {entry['count']:,} {reason}, e.g. {', '.join(entry['examples'][:3])}"
        )
    for kind in (RESAMPLED, DOWNMIXED):
        if report[kind]["count"]:
            lines.append(f"  {kind} {report[kind]['count']:,}")
    phonemes = report.get("phonemes")
    if phonemes:
        lines.append(
            f"  phonemes: {phonemes['utterances']:,} records "
            f"({phonemes['utterances_without']:,} without), {phonemes['num_phonemes']} "
            f"distinct in {os.path.join(split_dir, 'phonemes.json')}"
        )
    tok = report.get("tokenizer")
    if tok and "vocab_size" in tok:
        lines.append(f"  tokenizer: {tok['kind']}, {tok['vocab_size']} labels (blank included)")
    lines.append(f"  report: {os.path.join(split_dir, 'prep_report.json')}")
    return "\n".join(lines)
