"""Grain input pipeline: this process's shards -> decode -> augment -> bucket -> pad -> batch.

The order of the data is a pure function of (seed, step), `jaxspeech.data.plan`'s
`BatchPlan` (re-exported here); this module reads, augments and pads what it plans. The
Grain iterator over the plan is checkpointable, and since the plan is stateless a restore
resumes on exactly the next batch, in any number of worker processes.

Batches (host-local, B = global batch / process count) are dicts of numpy arrays:
  audio (B, S) float32, audio_len (B,) int32, labels (B, U) int32,
  label_len (B,) int32, weight (B,) float32 (0 for padding or skipped rows),
  label_overflow (B,) int32 (1 where the transcript was too long for the bucket),
  corrupt (B,) int32 (1 where the record could not be read or decoded: a padding row),
plus host-side values (`HOST_KEYS`, popped before the arrays go to devices): "faults", a
list of {record, shard, index, error} for the corrupt rows, "read_retries", the reads tried
again, and with_text: "text" and "id" lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import grain
import numpy as np

from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.plan import (  # noqa: F401 - re-exported: the pipeline's public names
    PAD_INDEX,
    BatchPlan,
    BucketSpec,
    PlannedBatch,
    ShortFirstPlan,
    make_bucket_spec,
    owned_records,
)
from jaxspeech.data.tokenizer import Tokenizer, normalize_text

HOST_KEYS = ("faults", "read_retries", "text", "id", "stream")


def pop_host_values(batch: dict) -> dict:
    """Removes (and returns) a batch's host-side values; the arrays stay."""
    return {k: batch.pop(k) for k in HOST_KEYS if k in batch}


# augment(audio (N,) float32, rng, speed) -> (speed_perturbed_length(N, speed),) float32: the
# host-side waveform augmentation (audio.augment.WaveformAugmenter), injected by the caller
# so that this package stays free of audio code.
Augment = Callable[[np.ndarray, np.random.Generator, float], np.ndarray]


def empty_batch(rows: int, samples: int, max_labels: int) -> dict[str, np.ndarray]:
    """A host batch of `rows` padding rows: (rows, samples) audio, (rows, max_labels)
    labels. Padding rows get a full-length silent input and no labels (a finite loss) and
    weight 0; callers fill the real rows in place."""
    return {
        "audio": np.zeros((rows, samples), np.float32),
        "audio_len": np.full((rows,), samples, np.int32),
        "labels": np.zeros((rows, max_labels), np.int32),
        "label_len": np.zeros((rows,), np.int32),
        "weight": np.zeros((rows,), np.float32),
        "label_overflow": np.zeros((rows,), np.int32),
        "corrupt": np.zeros((rows,), np.int32),
    }


class LoadBatch:
    """Reads, decodes, augments and pads one host-local batch. Picklable (opens shards
    lazily per worker).

    The augmentation of a row draws from ``default_rng([augment_seed, epoch, 4, record])``: the
    same for a record in an epoch however many workers load it and whenever it is resumed.
    Epochs before ``augment_from_epoch`` are not augmented.
    A record that cannot be read or decoded becomes a padding row marked ``corrupt`` and is
    listed in the batch's "faults"; that depends only on the stored bytes, so the batch
    shapes and the rest of the data stay what they would be.
    """

    def __init__(
        self,
        shard_paths: Sequence[str],
        shard_num_records: Sequence[int],
        tokenizer_dir: str,
        spec: BucketSpec,
        with_text: bool = False,
        augment: Augment | None = None,
        augment_seed: int = 0,
        augment_from_epoch: int = 0,
        records_in_paths: np.ndarray | None = None,
        retry: reader_lib.RetryPolicy = reader_lib.DEFAULT_RETRY,
    ):
        """Args:
        shard_paths: the shards this process opens; shard_num_records: their record counts.
        records_in_paths: the (ascending) global record indices those shards hold, in
          order; None when ``shard_paths`` is the whole split.
        retry: how transient read errors are retried.
        """
        self.shard_paths = list(shard_paths)
        self.records_in_paths = records_in_paths
        self.tokenizer_dir = tokenizer_dir
        self.spec = spec
        self.with_text = with_text
        self.augment = augment
        self.augment_seed = augment_seed
        self.augment_from_epoch = augment_from_epoch
        self.reader = reader_lib.RecordReader(self.shard_paths, shard_num_records, retry)
        self._tokenizer = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_tokenizer"}

    def __setstate__(self, state):
        self.__dict__.update(state, _tokenizer=None)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.load(self.tokenizer_dir)
        return self._tokenizer

    def read(self, indices: np.ndarray) -> tuple[list[dict | None], list[dict], int]:
        """Decoded records of global `indices` (None where one is unusable), the faults
        {record: global index, shard: path, index: inside the shard, error}, and the number
        of reads tried again."""
        local = indices
        if self.records_in_paths is not None:
            local = np.searchsorted(self.records_in_paths, indices)
        raw, faults, retries = self.reader.read([int(i) for i in local])
        bad = {f.position: f for f in faults}
        out: list[dict | None] = []
        reports = []
        for record, position, data in zip(indices, local, raw):
            error = bad[int(position)].error if data is None else None
            rec = None
            if data is not None:
                try:
                    rec = records.decode_record(data)
                except ValueError as e:  # stored bytes that passed the checksum yet are no record
                    error = str(e)
            if rec is None:
                shard, index = self.reader.locate(int(position))
                reports.append(
                    {
                        "record": int(record),
                        "shard": self.shard_paths[shard],
                        "index": index,
                        "error": error,
                    }
                )
            out.append(rec)
        return out, reports, retries

    def fault(self, record: int, error: str) -> dict:
        """The fault report of global record `record` that `read` gave as usable but a
        task's loader cannot use (`problem`): {record, shard, index, error}, as `read`'s."""
        local = record
        if self.records_in_paths is not None:
            local = int(np.searchsorted(self.records_in_paths, record))
        shard, index = self.reader.locate(local)
        return {"record": record, "shard": self.shard_paths[shard], "index": index, "error": error}

    # The three hooks a task's loader overrides (`tts.batch`, `vocoder.batch`): its padding
    # rows, what makes a readable record unusable, and one record -> one example row.
    HOST_TEXT = True  # with_text adds the rows' transcripts ("text") beside their ids

    def empty(self, planned: PlannedBatch) -> dict[str, np.ndarray]:
        """The batch of `planned` as padding rows, which `fill` fills in place."""
        bucket = planned.bucket
        b, s = len(planned.indices), self.spec.num_samples(bucket)
        return empty_batch(b, s, self.spec.max_labels[bucket])

    def problem(self, rec: dict) -> str | None:
        """Why a decoded record cannot be used (a corrupt row, reported in "faults"), or
        None: every record with audio and a transcript serves the recognizer."""
        return None

    def fill(self, out: dict, row: int, rec: dict, planned: PlannedBatch) -> str:
        """Puts one usable record into row `row` of `out` (augmented from the augmentation
        epoch on); returns its normalized transcript. A transcript too long for the bucket
        is counted (label_overflow), never truncated: the row keeps weight 0."""
        s, u = out["audio"].shape[1], out["labels"].shape[1]
        audio = reader_lib.audio_float32(rec)
        if self.augment is not None and planned.epoch >= self.augment_from_epoch:
            # Tag 4: a stream apart from the plan's (seed, epoch, 1|2|3) ones.
            record = int(planned.indices[row])
            rng = np.random.default_rng([self.augment_seed, planned.epoch, 4, record])
            audio = self.augment(audio, rng, float(planned.speeds[row]))
        check_fits(rec, audio, s)
        text = normalize_text(rec["text"])
        labels = self.tokenizer.encode(text)
        out["audio"][row, : len(audio)] = audio
        out["audio_len"][row] = len(audio)
        if len(labels) > u:
            out["label_overflow"][row] = 1
            return text
        out["labels"][row, : len(labels)] = labels
        out["label_len"][row] = len(labels)
        out["weight"][row] = 1.0
        return text

    def __call__(self, planned: PlannedBatch) -> dict:
        """One host batch: the planned records read (`read`), each usable one `fill`ed into
        its row, the others padding rows marked corrupt with their reason in "faults"."""
        indices = np.asarray(planned.indices)
        b = len(indices)
        out = self.empty(planned)
        texts, ids = [""] * b, [""] * b
        real = [i for i in range(b) if indices[i] != PAD_INDEX]
        recs, out["faults"], out["read_retries"] = self.read(indices[real]) if real else ([], [], 0)
        for row, rec in zip(real, recs):
            problem = None if rec is None else self.problem(rec)
            if rec is None or problem is not None:
                out["corrupt"][row] = 1
                if problem is not None:  # an unreadable record is in "faults" already
                    out["faults"].append(self.fault(int(indices[row]), problem))
                continue
            texts[row], ids[row] = self.fill(out, row, rec, planned), rec["id"]
        if self.with_text:
            if self.HOST_TEXT:
                out["text"] = texts
            out["id"] = ids
        return out


def check_fits(rec: dict, audio: np.ndarray, samples: int) -> None:
    """Raises ValueError when a record's audio is longer than its bucket's `samples`: the
    split index and the shards disagree."""
    if len(audio) > samples:
        raise ValueError(
            f"record {rec['id']} has {len(audio)} samples, more than its bucket's {samples}: "
            "the split index does not match the shards; re-run data_prep.prepare"
        )


@dataclasses.dataclass
class Pipeline:
    """A split's plan and loader; `iterator()` gives the checkpointable Grain iterator."""

    plan: BatchPlan | ShortFirstPlan
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
        plan = self.plan
        mine = sum(len(plan.owners[q]) for q in plan.shards)
        return (
            f"{self.index.num_records} utterances, {self.index.seconds / 3600:.2f} h; "
            f"this process reads {mine} of them from {len(self.load.shard_paths)} of "
            f"{len(self.index.shard_paths)} shards; {plan.batches_per_epoch} batches/epoch "
            f"({100 * plan.padding_fraction():.1f}% padding rows), "
            f"{len(plan.too_long)} longer than {spec.boundaries[-1]:g}s skipped; "
            f"{len(spec.boundaries)} batch shapes (global): {shapes}"
            + (f"; {plan.describe()}" if isinstance(plan, ShortFirstPlan) else "")
        )


def _check_settings(
    index: records.SplitIndex,
    spec: BucketSpec,
    where: str,
    process_index: int,
    process_count: int,
    speeds: Sequence[float],
    augment: Augment | None,
    loader_shards: int,
) -> int:
    """`make_pipeline`'s settings against the split at `where` (DATA_DIR/SPLIT, its
    `index`): returns the number of loader shards.

    Raises:
      ValueError: settings that do not fit the split.
    """
    if index.sample_rate != spec.sample_rate:
        raise ValueError(
            f"{where} is at {index.sample_rate} Hz but the config expects {spec.sample_rate} Hz"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process {process_index} of {process_count}?")
    if tuple(speeds) != (1.0,) and augment is None:
        raise ValueError("speed perturbation needs the augment function that applies it")
    num_shards = loader_shards or process_count
    if num_shards % process_count:
        raise ValueError(
            f"data.loader_shards={loader_shards} must be a multiple of the "
            f"{process_count} processes"
        )
    return num_shards


def _checked_files(
    index: records.SplitIndex, mine: range, num_shards: int
) -> tuple[list[str], list[int], bool]:
    """The shard files this process reads for its loader shards `mine`, checked
    (`reader.check_shards`): (paths, record counts, by_file). by_file: each loader shard's
    records lie in its own files (at least one file per loader shard); else every file is
    read.

    Raises:
      reader.ShardError: a file is missing, unreadable or holds another number of records.
    """
    by_file = len(index.shard_paths) >= num_shards
    files = sorted(f for q in mine for f in range(q, len(index.shard_paths), num_shards))
    if not by_file:
        files = list(range(len(index.shard_paths)))
    paths = [index.shard_paths[f] for f in files]
    counts = [index.shard_num_records[f] for f in files]
    reader_lib.check_shards(paths, counts)
    return paths, counts, by_file


def plan_split(
    index: records.SplitIndex,
    spec: BucketSpec,
    where: str,
    *,
    seed: int,
    train: bool,
    process_index: int = 0,
    process_count: int = 1,
    loader_shards: int = 0,
    speeds: Sequence[float] = (1.0,),
    augment: Augment | None = None,
    augment_from_epoch: int = 0,
    short_first_steps: int = 0,
    short_first_seconds: float = 0.0,
) -> tuple[BatchPlan | ShortFirstPlan, list[str], list[int], np.ndarray | None]:
    """This process's plan over the split at `where` (its `index`) and the shard files it
    reads, checked: (plan, paths, record counts, the global indices those files hold or
    None when every file is read). Shared by every loader (ASR's and text-to-speech's).
    short_first_steps > 0 (training): for that many steps only the utterances of the
    buckets up to `short_first_seconds` (one of spec's boundaries), and epochs, which
    `augment_from_epoch` counts, count that phase's passes first (`ShortFirstPlan`).

    Raises:
      ValueError: settings that do not fit the split.
      reader.ShardError: a shard this process reads is missing or damaged.
    """
    num_shards = _check_settings(
        index, spec, where, process_index, process_count, speeds, augment, loader_shards
    )
    owners = [owned_records(index.shard_num_records, q, num_shards) for q in range(num_shards)]
    per = num_shards // process_count
    mine = range(process_index * per, (process_index + 1) * per)
    kw = dict(seed=seed, owners=owners, shards=mine, speeds=speeds if train else (1.0,))
    short, passes = None, 0
    if train and short_first_steps > 0:
        short = _short_plan(index.durations, spec, short_first_seconds, augment_from_epoch, kw)
        passes = ShortFirstPlan.num_passes(short, short_first_steps)
    plan = BatchPlan(
        index.durations,
        spec,
        shuffle=train,
        num_epochs=None if train else 1,
        augment_from_epoch=max(0, augment_from_epoch - passes),  # epochs after the phase's
        **kw,
    )
    if short is not None:
        plan = ShortFirstPlan(short, plan, short_first_steps)
    paths, counts, by_file = _checked_files(index, mine, num_shards)
    in_paths = np.sort(np.concatenate([owners[q] for q in mine])) if by_file else None
    return plan, paths, counts, in_paths


def _short_plan(
    durations: np.ndarray, spec: BucketSpec, seconds: float, augment_from_epoch: int, kw: dict
) -> BatchPlan:
    """The short-first phase's plan: spec's buckets up to `seconds`, with the run's own
    seed (its first pass is the plan of a corpus of only those utterances)."""
    if seconds not in spec.boundaries:
        raise ValueError(
            f"the short-first phase's limit {seconds:g}s must be one of the bucket "
            f"boundaries {spec.boundaries}"
        )
    if not np.any(durations <= seconds):
        raise ValueError(
            f"no utterance of the split is <= {seconds:g}s: the short-first phase would read "
            "nothing (raise data.short_first_seconds, or data.short_first_steps=0 for none)"
        )
    prefix = spec.prefix(spec.boundaries.index(seconds) + 1)
    return BatchPlan(durations, prefix, shuffle=True, augment_from_epoch=augment_from_epoch, **kw)


@dataclasses.dataclass(frozen=True)
class Loading:
    """How this process loads a split, whatever the task's examples: the plan's seed,
    training (shuffled, epoch-repeated) or one ordered pass, this process's place among
    `process_count`, the loader shards (0: one per process), Grain worker processes,
    batches read ahead, and how transient read errors are retried."""

    seed: int
    train: bool
    process_index: int = 0
    process_count: int = 1
    loader_shards: int = 0
    num_workers: int = 0
    prefetch: int = 2
    retry: reader_lib.RetryPolicy = reader_lib.DEFAULT_RETRY


# A task's loader over this process's shard files: (the buckets, the files' paths, their
# record counts, the global indices they hold or None for the whole split) -> the loader.
MakeLoad = Callable[[BucketSpec, list[str], list[int], np.ndarray | None], LoadBatch]


def split_pipeline(
    data_dir: str,
    split: str,
    spec: BucketSpec | Callable[[records.SplitIndex], BucketSpec],
    loading: Loading,
    make_load: MakeLoad,
    **plan_options,
) -> Pipeline:
    """The skeleton of every task's pipeline (`make_pipeline`, `tts.batch`'s,
    `vocoder.batch`'s): the split's index, this process's plan and shard files
    (`plan_split`, with `plan_options`), and the task's loader over those files. `spec`:
    the buckets, or a function of the split's index giving them.

    Raises:
      FileNotFoundError: the split was never prepared.
      reader.ShardError: a shard this process reads is missing or damaged.
      ValueError: settings that do not fit the split.
    """
    index = records.read_split_index(data_dir, split)
    if callable(spec):
        spec = spec(index)
    plan, paths, counts, in_paths = plan_split(
        index,
        spec,
        f"{data_dir}/{split}",
        seed=loading.seed,
        train=loading.train,
        process_index=loading.process_index,
        process_count=loading.process_count,
        loader_shards=loading.loader_shards,
        **plan_options,
    )
    load = make_load(spec, paths, counts, in_paths)
    return Pipeline(plan, load, index, num_workers=loading.num_workers, prefetch=loading.prefetch)


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
    loader_shards: int = 0,
    num_workers: int = 0,
    prefetch: int = 2,
    speeds: Sequence[float] = (1.0,),
    augment: Augment | None = None,
    augment_from_epoch: int = 0,
    short_first_steps: int = 0,
    short_first_seconds: float = 0.0,
    with_text: bool | None = None,
    retry: reader_lib.RetryPolicy = reader_lib.DEFAULT_RETRY,
) -> Pipeline:
    """Pipeline over `data_dir/split` prepared by `python -m data_prep.prepare`.

    train=True: shuffled, epoch-repeated, with speed perturbation over ``speeds`` and the
    ``augment`` function applied to every waveform from epoch ``augment_from_epoch`` on
    (earlier epochs: neither); short_first_steps > 0: first that many steps of only the
    utterances up to the bucket boundary short_first_seconds, whose passes count as the
    first epochs (`ShortFirstPlan`). train=False: one pass in corpus order,
    no augmentation. The corpus is split into ``loader_shards`` (0: one per process; else
    a multiple of ``process_count``) by `owned_records`; each process serves a contiguous
    run of them and reads only their records. Batches carry "text" and "id" lists when
    ``with_text`` (default: for evaluation only). ``retry``: transient read errors.

    Raises:
      FileNotFoundError: the split was never prepared.
      reader.ShardError: a shard this process reads is missing, unreadable or holds
        another number of records than the index says (checked here, before any work).
      ValueError: settings that do not fit the split.
    """
    loading = Loading(
        seed, train, process_index, process_count, loader_shards, num_workers, prefetch, retry
    )

    def load(spec: BucketSpec, paths: list[str], counts: list[int], in_paths) -> LoadBatch:
        return LoadBatch(
            paths,
            counts,
            tokenizer_dir,
            spec,
            with_text=not train if with_text is None else with_text,
            augment=augment if train else None,
            augment_seed=seed,
            augment_from_epoch=augment_from_epoch,
            records_in_paths=in_paths,
            retry=retry,
        )

    return split_pipeline(
        data_dir,
        split,
        spec,
        loading,
        load,
        speeds=speeds,
        augment=augment,
        augment_from_epoch=augment_from_epoch,
        short_first_steps=short_first_steps,
        short_first_seconds=short_first_seconds,
    )
