"""Speaker-grouped shards: how many, which speaker group goes on which shard, and writing
each shard in a seeded order from the spilled records."""

from __future__ import annotations

import heapq
import os
import zlib
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np

from data_prep.config import HOURS_PER_SHARD
from data_prep.readers.common import NO_SPEAKER
from data_prep.report import DOWNMIXED, EVENTS, RESAMPLED, TEXTS
from data_prep.stats import add_stats, stats_to_json
from data_prep.validate import Prepared

MAX_SHARDS = 100_000

# Items without a speaker are spread over this many pseudo-speaker groups per shard: enough
# for the placement to balance, few enough that the placement table stays small.
PSEUDO_SPEAKERS_PER_SHARD = 64


def default_num_shards(
    num_records: int, seconds: float, hours_per_shard: float = HOURS_PER_SHARD
) -> int:
    """One shard per ``hours_per_shard`` of audio, within [1, min(num_records, MAX_SHARDS)]."""
    by_hours = round(seconds / 3600.0 / hours_per_shard)
    return max(1, min(by_hours, num_records, MAX_SHARDS))


def group_key(speaker: str, item_id: str, num_shards: int) -> str:
    """The placement group of an utterance: its speaker, so a speaker's utterances share a
    shard (per-speaker processing and speaker-disjoint subsets stay shard-local); utterances
    without a speaker fall into one of PSEUDO_SPEAKERS_PER_SHARD * num_shards groups by
    crc32(id) (not hash(): that is salted per process)."""
    if speaker and speaker != NO_SPEAKER:
        return "speaker:" + speaker
    bucket = zlib.crc32(item_id.encode("utf-8")) % (PSEUDO_SPEAKERS_PER_SHARD * num_shards)
    return f"pseudo:{bucket}"


def place_groups(groups: list[tuple[str, int]], num_shards: int, seed: int) -> dict[str, int]:
    """Speaker groups -> shard index, shards of nearly equal audio.

    Longest-processing-time-first: groups by decreasing size, each to the shard with the
    least audio so far. No shard exceeds the mean by more than the largest group. Then the
    shard numbers are permuted by ``seed`` (the outer level of the hierarchical shuffle: which
    speakers sit next to each other in shard order is random, not sorted by size).

    Args:
      groups: (group key, audio samples) pairs, one per group.
    """
    order = sorted(groups, key=lambda g: (-g[1], g[0]))  # Deterministic: sizes are integers.
    heap = [(0, shard) for shard in range(num_shards)]
    placement = {}
    for key, size in order:
        load, shard = heapq.heappop(heap)
        placement[key] = shard
        heapq.heappush(heap, (load + size, shard))
    relabel = np.random.default_rng([seed, num_shards]).permutation(num_shards)
    return {key: int(relabel[shard]) for key, shard in placement.items()}


def shard_file_name(split: str, shard: int, num_shards: int) -> str:
    """``<split>-NNNNN-of-NNNNN.array_record``."""
    return f"{split}-{shard:05d}-of-{num_shards:05d}.array_record"


def key_by_group(p: Prepared, num_shards: int) -> tuple[str, int]:
    """(placement group, audio samples) of one utterance: summed into group sizes."""
    return group_key(p.speaker, p.id, num_shards), p.samples


def key_by_shard(
    p: Prepared, placement: dict[str, int], num_shards: int
) -> tuple[tuple[int, int], Prepared]:
    """((shard, num_shards), p): the key the shard writers are grouped by."""
    return (placement[group_key(p.speaker, p.id, num_shards)], num_shards), p


class CountAndSecondsFn(beam.CombineFn):
    """(count, seconds) of Prepared items."""

    def create_accumulator(self) -> tuple[int, float]:
        return 0, 0.0

    def add_input(self, acc: tuple[int, float], p: Prepared) -> tuple[int, float]:
        return acc[0] + 1, acc[1] + p.duration

    def merge_accumulators(self, accs: Any) -> tuple[int, float]:
        accs = list(accs)
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc: tuple[int, float]) -> tuple[int, float]:
        return acc


def read_spill(readers: dict[str, Any], p: Prepared) -> bytes:
    """The record bytes behind ``p`` (``readers`` caches one open reader per spill file)."""
    reader = readers.get(p.spill_path)
    if reader is None:
        from array_record.python.array_record_module import ArrayRecordReader

        # Reads jump between records in id order: no readahead.
        reader = ArrayRecordReader(p.spill_path, "readahead_buffer_size:0")
        readers[p.spill_path] = reader
    return reader.read([p.spill_index])[0]


class WriteShard(beam.DoFn):
    """Writes one shard in a seeded random order, and sums its normalization statistics.

    Input ((shard, num_shards), Iterable[Prepared]) with unique ids. Main output: the
    shard's metadata {shard, num_shards, path, num_records, seconds, durations (file order),
    stats {count, sum, sum_sq} of its log-mel frames}; EVENTS: resampled/downmixed notices;
    TEXTS: (id, normalized text) per written record.
    """

    def __init__(self, split_dir: str, split: str, emit_texts: bool, seed: int):
        self._split_dir = split_dir
        self._split = split
        self._emit_texts = emit_texts
        self._seed = seed

    def process(self, element: tuple[tuple[int, int], Any]) -> Iterator[Any]:
        from array_record.python.array_record_module import ArrayRecordWriter

        (shard, num_shards), items = element
        # The inner level of the hierarchical shuffle: sorting by id first makes the
        # permutation independent of the order the runner delivered the items in.
        by_id = sorted(items, key=lambda p: p.id)
        order = np.random.default_rng([self._seed, shard, num_shards]).permutation(len(by_id))
        name = shard_file_name(self._split, shard, num_shards)
        writer = ArrayRecordWriter(os.path.join(self._split_dir, name), "group_size:1")
        spills: dict[str, Any] = {}
        durations, stats = [], None
        try:
            for i in order:
                p = by_id[i]
                writer.write(read_spill(spills, p))
                durations.append(p.duration)
                # Per shard, in file order: the combined statistics do not depend on how the
                # runner bundled the work.
                stats = add_stats(stats, (p.frames, p.mel_sum, p.mel_sum_sq))
                if p.resampled:
                    yield beam.pvalue.TaggedOutput(EVENTS, (RESAMPLED, RESAMPLED, p.id))
                if p.downmixed:
                    yield beam.pvalue.TaggedOutput(EVENTS, (DOWNMIXED, DOWNMIXED, p.id))
                if self._emit_texts:
                    yield beam.pvalue.TaggedOutput(TEXTS, (p.id, p.normalized_text))
        finally:
            writer.close()
            for reader in spills.values():
                reader.close()
        yield {
            "shard": shard,
            "num_shards": num_shards,
            "path": name,
            "num_records": len(durations),
            "seconds": float(sum(durations)),
            "durations": durations,
            "stats": stats_to_json(stats),
        }
