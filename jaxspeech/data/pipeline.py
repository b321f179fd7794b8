"""Grain input pipeline: shards -> per-host slice -> decode -> pad to a bucket shape -> batch.

The order of the data is a pure function of (seed, step): `BatchPlan` assigns
every utterance to a duration bucket, shuffles each bucket with a per-epoch
seed, cuts fixed-size *global* batches and shuffles their order. Every process
computes the same plan and loads only its own contiguous slice of each global
batch, so all hosts draw the same bucket (and shape) at the same step and no
host waits on another. The Grain iterator over the plan is checkpointable, and
since the plan is stateless a restore resumes on exactly the next batch.

Batches (host-local, B = global batch / process count) are dicts of numpy arrays:
  audio (B, S) float32, audio_len (B,) int32, labels (B, U) int32,
  label_len (B,) int32, weight (B,) float32 (0 for padding or skipped rows),
  label_overflow (B,) int32 (1 where the transcript was too long for the bucket).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import grain
import numpy as np

from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, normalize_text

PAD_INDEX = -1


@dataclasses.dataclass(frozen=True)
class BucketSpec:
    """Fixed batch shapes: bucket b holds utterances of duration <= boundaries[b] seconds."""

    boundaries: tuple[float, ...]  # seconds, ascending
    batch_sizes: tuple[int, ...]  # global batch size of each bucket
    max_labels: tuple[int, ...]  # label padding of each bucket
    sample_rate: int

    def num_samples(self, bucket: int) -> int:
        return int(round(self.boundaries[bucket] * self.sample_rate))

    def shapes(self) -> list[tuple[int, int, int]]:
        """(global batch, samples, labels) per bucket: every shape the train step will see."""
        return [
            (self.batch_sizes[b], self.num_samples(b), self.max_labels[b])
            for b in range(len(self.boundaries))
        ]


def make_bucket_spec(
    boundaries: Sequence[float],
    batch_seconds: float,
    max_tokens_per_second: float,
    sample_rate: int,
    multiple_of: int = 1,
) -> BucketSpec:
    """Batch size per bucket from an audio budget: about `batch_seconds` of padded audio each.

    Batch sizes are rounded down to a multiple of `multiple_of` (the number of
    batch shards times processes) and are at least `multiple_of`.
    """
    bounds = tuple(float(b) for b in boundaries)
    if not bounds or any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
        raise ValueError(f"bucket boundaries must be positive and ascending, got {boundaries}")
    sizes = tuple(
        max(multiple_of, int(batch_seconds / b) // multiple_of * multiple_of) for b in bounds
    )
    labels = tuple(int(math.ceil(b * max_tokens_per_second)) for b in bounds)
    return BucketSpec(bounds, sizes, labels, sample_rate)


def assign_buckets(durations: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """(N,) seconds -> (N,) bucket index, -1 for utterances longer than the last boundary."""
    idx = np.searchsorted(np.asarray(boundaries), durations, side="left")
    return np.where(idx < len(boundaries), idx, -1).astype(np.int32)


class BatchPlan:
    """Deterministic global batches over an epoch-repeated corpus; plan[i] is step i's batch.

    Each entry is (bucket, indices) with `indices` of length batch_sizes[bucket]
    (record indices, PAD_INDEX where the bucket's last batch is short). Nothing is
    dropped: every in-range utterance appears exactly once per epoch.
    """

    def __init__(
        self,
        durations: np.ndarray,
        spec: BucketSpec,
        *,
        seed: int,
        shuffle: bool,
        num_epochs: int | None = None,
    ):
        self.spec = spec
        self.seed = seed
        self.shuffle = shuffle
        self.buckets = assign_buckets(durations, spec.boundaries)
        self.members = [np.flatnonzero(self.buckets == b) for b in range(len(spec.boundaries))]
        self.too_long = np.flatnonzero(self.buckets < 0)
        self.batches_per_epoch = sum(
            -(-len(m) // bs) for m, bs in zip(self.members, spec.batch_sizes)
        )
        if self.batches_per_epoch == 0:
            raise ValueError("no utterance fits the bucket boundaries; nothing to batch")
        self.num_epochs = num_epochs
        self._cache: tuple[int, tuple] | None = None

    def __len__(self) -> int:
        # Training iterates "forever": a length far beyond any run keeps Grain's index finite.
        epochs = self.num_epochs if self.num_epochs is not None else 1_000_000
        return self.batches_per_epoch * epochs

    def epoch(self, epoch: int) -> tuple[tuple[int, np.ndarray], ...]:
        """All (bucket, indices) batches of one epoch, in order (the last epoch is cached)."""
        cached = self._cache
        if cached is not None and cached[0] == epoch:
            return cached[1]
        batches = self._make_epoch(epoch)
        self._cache = (epoch, batches)
        return batches

    def _make_epoch(self, epoch: int) -> tuple[tuple[int, np.ndarray], ...]:
        rng = np.random.default_rng([self.seed, epoch])
        batches = []
        for b, members in enumerate(self.members):
            bs = self.spec.batch_sizes[b]
            order = rng.permutation(members) if self.shuffle else members
            pad = (-len(order)) % bs
            order = np.concatenate([order, np.full(pad, PAD_INDEX, np.int64)])
            batches += [(b, order[i : i + bs]) for i in range(0, len(order), bs)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return tuple(batches)

    def __getitem__(self, step: int) -> tuple[int, np.ndarray]:
        return self.epoch(step // self.batches_per_epoch)[step % self.batches_per_epoch]


def process_slice(indices: np.ndarray, process_index: int, process_count: int) -> np.ndarray:
    """This process's contiguous part of a global batch (its rows of the global array)."""
    n = len(indices)
    if n % process_count:
        raise ValueError(f"global batch {n} is not divisible by {process_count} processes")
    per = n // process_count
    return indices[process_index * per : (process_index + 1) * per]


class LoadBatch:
    """Reads, decodes and pads one host-local batch. Picklable (opens shards lazily per worker)."""

    def __init__(
        self,
        shard_paths: Sequence[str],
        tokenizer_dir: str,
        spec: BucketSpec,
        process_index: int,
        process_count: int,
        with_text: bool = False,
    ):
        self.shard_paths = list(shard_paths)
        self.tokenizer_dir = tokenizer_dir
        self.spec = spec
        self.process_index = process_index
        self.process_count = process_count
        self.with_text = with_text
        self._source = None
        self._tokenizer = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_source", "_tokenizer")}

    def __setstate__(self, state):
        self.__dict__.update(state, _source=None, _tokenizer=None)

    @property
    def source(self) -> grain.sources.ArrayRecordDataSource:
        if self._source is None:
            self._source = grain.sources.ArrayRecordDataSource(self.shard_paths)
        return self._source

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.load(self.tokenizer_dir)
        return self._tokenizer

    def __call__(self, planned: tuple[int, np.ndarray]) -> dict:
        bucket, global_indices = planned
        indices = process_slice(np.asarray(global_indices), self.process_index, self.process_count)
        b, s, u = len(indices), self.spec.num_samples(bucket), self.spec.max_labels[bucket]
        out = {
            "audio": np.zeros((b, s), np.float32),
            # Padding rows get a full-length silent input and no labels: finite loss, weight 0.
            "audio_len": np.full((b,), s, np.int32),
            "labels": np.zeros((b, u), np.int32),
            "label_len": np.zeros((b,), np.int32),
            "weight": np.zeros((b,), np.float32),
            "label_overflow": np.zeros((b,), np.int32),
        }
        texts, ids = [""] * b, [""] * b
        real = [i for i in range(b) if indices[i] != PAD_INDEX]
        raw = self.source.__getitems__([int(indices[i]) for i in real]) if real else []
        for row, data in zip(real, raw):
            rec = records.decode_record(data)
            audio = rec["audio"]
            if len(audio) > s:
                raise ValueError(
                    f"record {rec['id']} has {len(audio)} samples, more than its bucket's {s}: "
                    "the split index does not match the shards; re-run data_prep.prepare"
                )
            text = normalize_text(rec["text"])
            labels = self.tokenizer.encode(text)
            texts[row], ids[row] = text, rec["id"]
            out["audio"][row, : len(audio)] = audio.astype(np.float32) / 32768.0
            out["audio_len"][row] = len(audio)
            if len(labels) > u:
                # Too many tokens for this bucket's fixed label width: counted, never truncated.
                out["label_overflow"][row] = 1
                continue
            out["labels"][row, : len(labels)] = labels
            out["label_len"][row] = len(labels)
            out["weight"][row] = 1.0
        if self.with_text:
            out["text"] = texts
            out["id"] = ids
        return out


@dataclasses.dataclass
class Pipeline:
    """A split's plan and loader; `iterator()` gives the checkpointable Grain iterator."""

    plan: BatchPlan
    load: LoadBatch
    index: records.SplitIndex
    num_workers: int = 0
    prefetch: int = 2

    def dataset(self, start_step: int = 0) -> grain.IterDataset:
        ds = grain.MapDataset.source(self.plan)[start_step:].map(self.load)
        read = grain.ReadOptions(
            num_threads=max(1, self.prefetch), prefetch_buffer_size=self.prefetch
        )
        it = ds.to_iter_dataset(read)
        if self.num_workers > 0:
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.num_workers))
        return it

    def iterator(self) -> grain.DatasetIterator:
        return iter(self.dataset())

    def describe(self) -> str:
        spec = self.plan.spec
        shapes = ", ".join(
            f"<={bd:g}s: {bs}x{s}" for bd, (bs, s, _) in zip(spec.boundaries, spec.shapes())
        )
        return (
            f"{self.index.num_records} utterances, {self.index.seconds / 3600:.2f} h, "
            f"{self.plan.batches_per_epoch} batches/epoch, "
            f"{len(self.plan.too_long)} longer than {spec.boundaries[-1]:g}s skipped; "
            f"buckets {shapes}"
        )


def make_pipeline(
    *,
    data_dir: str,
    split: str,
    tokenizer_dir: str,
    spec: BucketSpec,
    seed: int,
    train: bool,
    process_index: int = 0,
    process_count: int = 1,
    num_workers: int = 0,
    prefetch: int = 2,
) -> Pipeline:
    """Pipeline over `data_dir/split` prepared by `python -m data_prep.prepare`.

    train=True: shuffled, epoch-repeated. train=False: one pass in corpus order.
    """
    index = records.read_split_index(data_dir, split)
    if index.sample_rate != spec.sample_rate:
        raise ValueError(
            f"{data_dir}/{split} is at {index.sample_rate} Hz but the config expects "
            f"{spec.sample_rate} Hz"
        )
    for bs in spec.batch_sizes:
        if bs % process_count:
            raise ValueError(f"global batch {bs} is not divisible by {process_count} processes")
    plan = BatchPlan(
        index.durations, spec, seed=seed, shuffle=train, num_epochs=None if train else 1
    )
    load = LoadBatch(
        index.shard_paths, tokenizer_dir, spec, process_index, process_count, with_text=not train
    )
    return Pipeline(plan, load, index, num_workers=num_workers, prefetch=prefetch)
