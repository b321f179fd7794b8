"""The order of the training data: fixed batch shapes (`BucketSpec`) and the plan of every
step's batch (`BatchPlan`), a pure function of (seed, step).

`BatchPlan` gives every utterance a speed factor and a duration bucket per epoch, and every
process computes the same sequence of buckets (so all hosts draw the same batch shape at the
same step and no host waits on another) while filling its batches only with the records of
its own shards (`owned_records`). `jaxspeech.data.pipeline` reads and pads what it plans.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

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

    def prefix(self, k: int) -> BucketSpec:
        """The first k buckets alone (their shapes unchanged)."""
        if not 1 <= k <= len(self.boundaries):
            raise ValueError(f"a prefix of 1-{len(self.boundaries)} buckets, not {k}")
        b, s, m = self.boundaries[:k], self.batch_sizes[:k], self.max_labels[:k]
        return BucketSpec(b, s, m, self.sample_rate)


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


def owned_records(shard_num_records: Sequence[int], process: int, process_count: int) -> np.ndarray:
    """The record indices one process reads, ascending.

    Whole shards, ``shards[process::process_count]``, when there are at least as many shards
    as processes: each host opens only its own files, which is what lets thousands of hosts
    read a corpus without all of them touching every shard. A split with fewer shards than
    processes (a small dev set) is dealt record by record instead, ``records[process::P]``.
    Either way the processes' sets are disjoint and cover every record.
    """
    counts = np.asarray(shard_num_records, np.int64)
    if len(counts) >= process_count:
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        mine = range(process, len(counts), process_count)
        parts = [np.arange(starts[s], starts[s] + counts[s]) for s in mine]
        return np.concatenate(parts) if parts else np.zeros((0,), np.int64)
    return np.arange(process, int(counts.sum()), process_count, dtype=np.int64)


class PlannedBatch(NamedTuple):
    """One step's host-local batch: which bucket, which records, at which speed."""

    bucket: int
    indices: np.ndarray  # (b,) record indices, PAD_INDEX for padding rows
    speeds: np.ndarray  # (b,) speed-perturbation factors (1.0: none)
    epoch: int


class BatchPlan:
    """Deterministic batches over an epoch-repeated corpus; ``plan[step]`` is one step's
    host-local batch: the rows of the loader shards ``shards`` (this process's), in order.

    The corpus is split into loader shards (``owners``: the records of each); a global
    batch is every loader shard's rows, in shard order, and a process serves a contiguous
    run of loader shards. By default there is one loader shard per process; a fixed count
    (a multiple of every process count used) makes the global batches the same for any
    number of processes, e.g. a 2-host run and its 1-host replay.

    Per epoch: every record gets a speed factor (seeded; 1.0 if the perturbed audio would
    not fit the last bucket) and the bucket of its perturbed length. Bucket b gets
    ``n_b = max over loader shards of ceil(records of that shard in b / shard batch size)``
    batches, and the order of buckets over the epoch is one seeded permutation, so every
    process computes the same bucket sequence and draws the same batch shape at every step
    (no host waits on another for a different shape). Each loader shard fills its n_b
    batches of bucket b with a seeded permutation of its own records of bucket b, padded
    with PAD_INDEX. Nothing is dropped: every record that fits the last bucket appears
    exactly once per epoch in exactly one loader shard.

    With one speed, every epoch has the same number of batches; with several, epochs differ
    slightly and their starts are found by counting (only bucket counts per epoch, cached).
    Epochs before ``augment_from_epoch`` are planned without speed perturbation (a recipe
    that must leave CTC's blank plateau on clean data first).
    """

    def __init__(
        self,
        durations: np.ndarray,
        spec: BucketSpec,
        *,
        seed: int,
        shuffle: bool,
        owners: Sequence[np.ndarray] | None = None,
        shards: Sequence[int] = (0,),
        num_epochs: int | None = None,
        speeds: Sequence[float] = (1.0,),
        augment_from_epoch: int = 0,
    ):
        self.spec = spec
        if augment_from_epoch < 0:
            raise ValueError(f"augment_from_epoch must be >= 0, got {augment_from_epoch}")
        self.augment_from_epoch = int(augment_from_epoch)
        self.seed = seed
        self.shuffle = shuffle
        self.owners = [np.arange(len(durations))] if owners is None else list(owners)
        self.shards = tuple(int(q) for q in shards)
        if not self.shards or any(not 0 <= q < len(self.owners) for q in self.shards):
            raise ValueError(f"loader shards {shards} not in 0..{len(self.owners) - 1}")
        self.num_epochs = num_epochs
        self.speeds = np.asarray(speeds, np.float64)
        if self.speeds.size == 0 or np.any(self.speeds <= 0):
            raise ValueError(f"speeds must be positive, got {speeds}")
        num_shards = len(self.owners)
        for bs in spec.batch_sizes:
            if bs % num_shards:
                raise ValueError(
                    f"global batch {bs} is not divisible by {num_shards} loader shards"
                )
        # Rows per loader shard; this process's batch is len(shards) times that.
        self.local_batch_sizes = np.array([bs // num_shards for bs in spec.batch_sizes])
        durations = np.asarray(durations, np.float64)
        self.samples = np.round(durations * spec.sample_rate).astype(np.int64)
        self.bucket_samples = np.array([spec.num_samples(b) for b in range(len(spec.boundaries))])
        self.owner_of = np.full(len(durations), -1, np.int64)
        for q, mine in enumerate(self.owners):
            self.owner_of[mine] = q
        if np.any(self.owner_of < 0):
            raise ValueError("the owners do not cover every record")
        self.too_long = np.flatnonzero(self.samples > self.bucket_samples[-1])
        self._counts: dict[int, np.ndarray] = {}  # epoch -> (num_buckets,) batches
        self._starts = [0]  # _starts[e]: first step of epoch e (as far as counted)
        self._cache: tuple[int, tuple[PlannedBatch, ...]] | None = None
        # Grain's read threads call plan[step] concurrently: counting epoch starts reads
        # and appends `_starts`, and unlocked two threads appended the same start twice,
        # which served later epochs' batches at the wrong steps (with speed perturbation).
        self._lock = threading.Lock()
        self.batches_per_epoch = self.batches_in_epoch(0)
        if self.batches_per_epoch == 0:
            raise ValueError("no utterance fits the bucket boundaries; nothing to batch")

    @property
    def perturbs_speed(self) -> bool:
        return not (self.speeds.size == 1 and self.speeds[0] == 1.0)

    # ---- per-epoch decisions (identical on every process)
    def _speeds_and_buckets(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(N,) speed factor and (N,) bucket (-1: too long) of every record in ``epoch``."""
        n = len(self.samples)
        if not self.perturbs_speed or epoch < self.augment_from_epoch:
            factors, lengths = np.ones(n), self.samples
        else:
            factors = np.random.default_rng([self.seed, epoch, 1]).choice(self.speeds, n)
            # The same arithmetic as audio.augment.speed_perturbed_length (halves round up).
            lengths = np.floor(self.samples / factors + 0.5).astype(np.int64)
            misfit = lengths > self.bucket_samples[-1]
            factors = np.where(misfit, 1.0, factors)
            lengths = np.where(misfit, self.samples, lengths)
        buckets = np.searchsorted(self.bucket_samples, lengths, side="left")
        return factors, np.where(buckets < len(self.bucket_samples), buckets, -1)

    def _batches_per_bucket(self, buckets: np.ndarray) -> np.ndarray:
        """(num_buckets,) n_b: the most batches any loader shard needs for bucket b."""
        fits = buckets >= 0
        nb = len(self.bucket_samples)
        # One bincount over (process, bucket) pairs: linear in N, unlike np.add.at.
        flat = np.bincount(
            self.owner_of[fits] * nb + buckets[fits], minlength=len(self.owners) * nb
        )
        per = flat.reshape(len(self.owners), nb)
        return (-(-per // self.local_batch_sizes[None, :])).max(axis=0)

    def batches_in_epoch(self, epoch: int) -> int:
        if not self.perturbs_speed:
            epoch = 0  # Every epoch has the same buckets.
        if epoch not in self._counts:
            self._counts[epoch] = self._batches_per_bucket(self._speeds_and_buckets(epoch)[1])
        return int(self._counts[epoch].sum())

    def epoch_of(self, step: int) -> tuple[int, int]:
        """(epoch, position within the epoch) of a step."""
        if not self.perturbs_speed:
            return divmod(step, self.batches_per_epoch)
        with self._lock:
            while self._starts[-1] <= step:
                epoch = len(self._starts) - 1
                self._starts.append(self._starts[-1] + self.batches_in_epoch(epoch))
            epoch = int(np.searchsorted(self._starts, step, side="right")) - 1
            return epoch, step - self._starts[epoch]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # locks do not pickle; each process (Grain worker) gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        if self.num_epochs is None:
            # Training iterates "forever": a length far beyond any run keeps Grain's index finite.
            return self.batches_per_epoch * 1_000_000
        return sum(self.batches_in_epoch(e) for e in range(self.num_epochs))

    def epoch(self, epoch: int) -> tuple[PlannedBatch, ...]:
        """This process's batches of one epoch, in order (the last epoch is cached)."""
        with self._lock:
            cached = self._cache
            if cached is not None and cached[0] == epoch:
                return cached[1]
            batches = self._make_epoch(epoch)
            self._cache = (epoch, batches)
            return batches

    def _make_epoch(self, epoch: int) -> tuple[PlannedBatch, ...]:
        factors, buckets = self._speeds_and_buckets(epoch)
        counts = self._batches_per_bucket(buckets)
        sequence = np.repeat(np.arange(len(counts)), counts)  # The bucket of each batch.
        if self.shuffle:
            sequence = np.random.default_rng([self.seed, epoch, 2]).permutation(sequence)
        parts: list[list[np.ndarray]] = [[] for _ in counts]  # per bucket, per loader shard
        for q in self.shards:
            shard_rng = np.random.default_rng([self.seed, epoch, 3, q])
            mine = self.owners[q]
            for b, n_b in enumerate(counts):
                members = mine[buckets[mine] == b]
                if self.shuffle:
                    members = shard_rng.permutation(members)
                lb = int(self.local_batch_sizes[b])
                padded = np.full(n_b * lb, PAD_INDEX, np.int64)
                padded[: len(members)] = members
                parts[b].append(padded.reshape(n_b, lb))
        # rows[b]: (n_b, local batch) record indices of bucket b, padded; shards side by side.
        rows = [np.concatenate(p, axis=1) for p in parts]
        taken = np.zeros(len(counts), np.int64)
        batches = []
        for b in sequence:
            idx = rows[b][taken[b]]
            taken[b] += 1
            speed = np.where(idx == PAD_INDEX, 1.0, factors[np.maximum(idx, 0)])
            batches.append(PlannedBatch(int(b), idx, speed.astype(np.float32), epoch))
        return tuple(batches)

    def __getitem__(self, step: int) -> PlannedBatch:
        epoch, position = self.epoch_of(step)
        return self.epoch(epoch)[position]

    def padding_fraction(self, epoch: int = 0) -> float:
        """Share of this process's rows in ``epoch`` that are padding."""
        batches = self.epoch(epoch)
        rows = sum(len(b.indices) for b in batches)
        return sum(int(np.sum(b.indices == PAD_INDEX)) for b in batches) / max(rows, 1)


class ShortFirstPlan:
    """A curriculum: `short` for steps [0, steps), then `main` from its step 0.

    `short` plans the same corpus with only the shortest of `main`'s buckets (its spec is a
    prefix of main's: the same batch shapes, nothing new to compile): short utterances
    first, like SortaGrad's sorted first epoch (Deep Speech 2). Epochs count passes over
    what is read: the short phase's passes are epochs 0 .. passes - 1 (the last one cut
    short), main's epoch e is epoch passes + e. So an augmentation that starts at epoch A
    starts in whichever phase reaches it: `short` is planned with augment_from_epoch A and
    `main` with max(0, A - passes) (`plan_split`). Indexed by step like `BatchPlan`, so
    Grain's iterator state resumes it exactly.
    """

    def __init__(self, short: BatchPlan, main: BatchPlan, steps: int):
        if short.spec != main.spec.prefix(len(short.spec.boundaries)):
            raise ValueError("the short phase's buckets must be the first of the main plan's")
        if steps <= 0:
            raise ValueError(f"a short-first phase needs steps > 0, got {steps}")
        self.short, self.main, self.steps = short, main, int(steps)
        self.passes = self.num_passes(short, steps)

    def __getattr__(self, name: str):
        # The rest is the main plan's: its spec, owners, shards, batches_per_epoch, too_long.
        if name in ("spec", "owners", "shards", "batches_per_epoch", "too_long"):
            return getattr(self.main, name)
        raise AttributeError(name)

    @staticmethod
    def num_passes(short: BatchPlan, steps: int) -> int:
        """The epochs of `short` that its first `steps` steps reach."""
        return short.epoch_of(steps - 1)[0] + 1

    def __len__(self) -> int:
        return self.steps + len(self.main)

    def __getitem__(self, step: int) -> PlannedBatch:
        if step < self.steps:
            return self.short[step]
        planned = self.main[step - self.steps]
        return planned._replace(epoch=planned.epoch + self.passes)

    def epoch_of(self, step: int) -> tuple[int, int]:
        """(epoch, position within it), epochs counted over both phases."""
        if step < self.steps:
            return self.short.epoch_of(step)
        epoch, position = self.main.epoch_of(step - self.steps)
        return epoch + self.passes, position

    def padding_fraction(self, epoch: int = 0) -> float:
        """The main plan's, in its own epoch `epoch`."""
        return self.main.padding_fraction(epoch)

    def describe(self) -> str:
        """The phase in words, for the loader's description."""
        plan = self.short
        fits = plan.samples <= plan.bucket_samples[-1]
        records = sum(int(np.sum(fits[plan.owners[q]])) for q in plan.shards)
        # Batches, not steps: under a distillation schedule (mixing.MixedPlan) the phase
        # is the labeled stream's first batches.
        return (
            f"the first {self.steps} batches: only the {records} utterances <= "
            f"{plan.spec.boundaries[-1]:g}s ({plan.batches_per_epoch} batches a pass; epochs "
            f"0-{self.passes - 1}), then every utterance (epoch {self.passes} on)"
        )
