"""Turns a corpus into ArrayRecord shards, normalization statistics and a tokenizer.

    python -m data_prep.prepare --format manifest|librispeech|kaldi|tfds --input PATH
        --output DIR --split NAME [--num_shards N | --hours_per_shard H] [--seed S]
        [--tokenizer char|bpe|unigram] [--vocab_size V] [--alphabet CHARS]
        [--min_duration S] [--max_duration S] [--sample_rate 16000]
        [--audio_format pcm_s16le|flac] [--runner DirectRunner] [other Beam options]

One Apache Beam pipeline (the shape of section IV of the 1M-hour paper in
``shared/references``: group by speaker early, equal shards, hierarchical shuffle,
statistics per shard in parallel, then summed):

    read items (--format reader, data_prep.readers) -> group by id, keep the first ->
    validate + decode + resample/downmix + encode record + per-record log-mel sums ->
    sum audio per speaker -> place speakers on shards (largest first onto the lightest shard;
    shard numbers permuted by --seed) -> group by shard -> write each shard in a seeded
    random order, summing its statistics -> per-shard metadata, skip/notice events,
    transcripts

The driver then writes ``DIR/<split>/{index.json, durations.npy, stats.json,
prep_report.json}`` (the statistics are the per-shard sums added in shard order) and, for
the train split, ``DIR/tokenizer/``. Everything lands in a staging directory first and
replaces ``DIR/<split>`` only when complete, so a re-run never mixes old and new shards.

Every input item is either written or skipped with a counted reason (num_input ==
num_written + sum of skips). Records keep the RAW text; tokenization happens in the
training input pipeline. The same inputs and flags give byte-identical outputs.

Runner: by default, and whenever ``--runner DirectRunner`` is given, the pipeline runs on
Beam's FnApiRunner in ``multi_processing`` mode with one worker per CPU (that is what the
DirectRunner runs batch pipelines on, minus its attempt to download the Prism runner, which
would ignore the worker count). Any other runner and all its options pass through
unchanged; with a distributed runner, ``--output`` must be a filesystem every worker and
the launching machine mount (e.g. NFS, gcsfuse), because shards are written with
ArrayRecord's local-file writer.

Default number of shards: one per ``--hours_per_shard`` (1) of written audio, rounded, at
least 1, at most the number of records and at most 100,000. One hour of 16 kHz int16 audio
is ~115 MB: big enough that per-file overheads vanish, small enough that every host of a
large job gets many shards; the cap bounds the file count (100,000 shards still hold 10 h each at a
million hours).

Memory: the shuffle carries references, not audio. Each worker bundle appends its encoded
records to a spill file under the staging directory, and the shard writers copy them from
there in shard order, so neither the DirectRunner's in-memory shuffle nor a writer ever holds
a shard's audio (2,000 utterances, 2.2 h: ~0.4 GB peak instead of ~1.9 GB).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import os
import shutil
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from absl import flags
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
)
from apache_beam.runners.runner import PipelineState

from data_prep.readers import (
    NO_SPEAKER,
    READERS,
    AudioError,
    Item,
    PrepareError,
    load_item_audio,
)
from jaxspeech.audio.features import LogMelConfig, mel_filterbank
from jaxspeech.data import records
from jaxspeech.data.tokenizer import (
    BLANK,
    UNK,
    Tokenizer,
    normalize_text,
    train_sentencepiece_tokenizer,
)

HOURS_PER_SHARD = 1.0
MAX_SHARDS = 100_000
MAX_EXAMPLES = 10

# Skip reasons (keys of prep_report.json["skipped"]).
EMPTY_TRANSCRIPT = "empty_transcript"
ZERO_LENGTH = "zero_length"
NON_FINITE = "non_finite_samples"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE_ID = "duplicate_id"
OUT_OF_ALPHABET = "out_of_alphabet"

# Items without a speaker are spread over this many pseudo-speaker groups per shard: enough
# for the placement to balance, few enough that the placement table stays small.
PSEUDO_SPEAKERS_PER_SHARD = 64

# Event kinds: a skip, or a notice about a written record.
SKIPPED, RESAMPLED, DOWNMIXED = "skipped", "resampled", "downmixed"
EVENTS, TEXTS = "events", "texts"  # Tagged-output names.


# =============================================================================================
# Configuration
# =============================================================================================


@dataclasses.dataclass(frozen=True)
class PrepConfig:
    """Everything the pipeline needs, parsed from flags."""

    format: str
    input: str
    output: str  # Absolute.
    split: str
    num_shards: int | None
    tokenizer: str
    vocab_size: int
    train_tokenizer: bool
    tokenizer_max_sentences: int
    min_duration: float
    max_duration: float
    sample_rate: int
    audio_format: str
    feature: LogMelConfig
    hours_per_shard: float = HOURS_PER_SHARD
    seed: int = 0  # Speaker-to-shard placement and record order within shards.
    alphabet: str | None = None  # Allowed characters of normalized text (None: any).
    # Reader options (data_prep.readers).
    allow_pipes: bool = False
    tfds_data_dir: str | None = None
    tfds_split: str | None = None  # None: --split.
    tfds_audio_key: str = "audio"
    tfds_text_key: str = "text"
    tfds_speaker_key: str = "speaker_id"
    tfds_id_key: str = "id"
    tfds_sample_rate: int | None = None  # None: from the audio feature's metadata.

    @property
    def split_dir(self) -> str:
        return os.path.join(self.output, self.split)


def _define_flags(fv: flags.FlagValues) -> None:
    d = dict(flag_values=fv)
    flags.DEFINE_string("format", "manifest", "Input format: " + ", ".join(sorted(READERS)), **d)
    flags.DEFINE_string(
        "input",
        None,
        "manifest: a JSON-lines file; librispeech: a split directory; kaldi: a data "
        "directory; tfds: a dataset name (with --tfds_data_dir).",
        **d,
    )
    flags.DEFINE_string("output", None, "Output data directory DIR.", **d)
    flags.DEFINE_string("split", None, "Split name; written to DIR/<split>/.", **d)
    flags.DEFINE_integer("num_shards", None, "Shards (default: see --hours_per_shard).", **d)
    flags.DEFINE_float(
        "hours_per_shard", HOURS_PER_SHARD, "Audio per shard when --num_shards is not given.", **d
    )
    flags.DEFINE_integer("seed", 0, "Seed of shard placement and in-shard order.", **d)
    flags.DEFINE_string(
        "alphabet",
        None,
        "Characters a normalized transcript may hold (space always); others are skipped "
        "as out_of_alphabet. Default: any.",
        **d,
    )
    flags.DEFINE_enum("tokenizer", "char", ["char", "bpe", "unigram"], "Tokenizer kind.", **d)
    flags.DEFINE_integer("vocab_size", 256, "bpe/unigram labels, blank included.", **d)
    flags.DEFINE_bool("train_tokenizer", None, "Train DIR/tokenizer (default: split==train).", **d)
    flags.DEFINE_integer(
        "tokenizer_max_sentences", 2_000_000, "SentencePiece trains on this many.", **d
    )
    flags.DEFINE_float("min_duration", 0.1, "Shorter audio (seconds) is skipped.", **d)
    flags.DEFINE_float("max_duration", 30.0, "Longer audio (seconds) is skipped.", **d)
    flags.DEFINE_integer("sample_rate", 16000, "Output sample rate; others are resampled.", **d)
    flags.DEFINE_enum("audio_format", "pcm_s16le", list(records.AUDIO_FORMATS), "Payload.", **d)
    flags.DEFINE_integer("n_fft", 512, "Stats: FFT size.", **d)
    flags.DEFINE_integer("win_length", 400, "Stats: window length (samples).", **d)
    flags.DEFINE_integer("hop_length", 160, "Stats: hop length (samples).", **d)
    flags.DEFINE_integer("num_mel_bins", 80, "Stats: mel bins.", **d)
    flags.DEFINE_float("fmin", 0.0, "Stats: lowest mel frequency (Hz).", **d)
    flags.DEFINE_float("fmax", None, "Stats: highest mel frequency (default sample_rate/2).", **d)
    flags.DEFINE_float("log_floor", 1e-6, "Stats: log(mel + log_floor).", **d)
    flags.DEFINE_bool("allow_pipes", False, "kaldi: run wav.scp entries that are commands.", **d)
    flags.DEFINE_string("tfds_data_dir", None, "tfds: the TFDS data directory.", **d)
    flags.DEFINE_string("tfds_split", None, "tfds: the TFDS split (default: --split).", **d)
    flags.DEFINE_string("tfds_audio_key", "audio", "tfds: the audio feature.", **d)
    flags.DEFINE_string("tfds_text_key", "text", "tfds: the transcript feature.", **d)
    flags.DEFINE_string("tfds_speaker_key", "speaker_id", "tfds: the speaker feature.", **d)
    flags.DEFINE_string("tfds_id_key", "id", "tfds: the id feature (else the index).", **d)
    flags.DEFINE_integer(
        "tfds_sample_rate", None, "tfds: audio rate (default: the feature's metadata).", **d
    )


def parse_args(argv: list[str]) -> tuple[PrepConfig, list[str]]:
    """Parses our flags from ``argv`` (argv[0] is the program) and returns the rest for Beam.

    Raises:
      PrepareError: a missing or invalid flag value.
    """
    fv = flags.FlagValues()  # A fresh set per call: parse_args may run many times in-process.
    _define_flags(fv)
    try:
        rest = fv(list(argv), known_only=True)
    except flags.Error as e:
        raise PrepareError(str(e)) from e
    for name in ("input", "output", "split"):
        if not fv[name].value:
            raise PrepareError(f"--{name} is required")
    if fv.format not in READERS:
        raise PrepareError(f"unknown --format {fv.format!r}; known: {', '.join(sorted(READERS))}")
    split = fv.split
    if os.sep in split or split.startswith(".") or split == "tokenizer":
        raise PrepareError(f"--split must be a plain directory name, got {split!r}")
    if not 0 <= fv.min_duration < fv.max_duration:
        raise PrepareError(f"need 0 <= --min_duration < --max_duration, got {fv.min_duration}")
    if fv.num_shards is not None and fv.num_shards < 1:
        raise PrepareError(f"--num_shards must be >= 1, got {fv.num_shards}")
    if not fv.hours_per_shard > 0:
        raise PrepareError(f"--hours_per_shard must be positive, got {fv.hours_per_shard}")
    if fv.alphabet is not None and fv.alphabet != fv.alphabet.lower():
        # Transcripts are checked after normalization, which lowercases them.
        raise PrepareError(f"--alphabet must be lowercase, got {fv.alphabet!r}")
    feature = LogMelConfig(
        sample_rate=fv.sample_rate,
        n_fft=fv.n_fft,
        win_length=fv.win_length,
        hop_length=fv.hop_length,
        num_mel_bins=fv.num_mel_bins,
        fmin=float(fv.fmin),
        fmax=float(fv.fmax if fv.fmax is not None else fv.sample_rate / 2),
        log_floor=float(fv.log_floor),
    )
    train_tok = fv.train_tokenizer if fv.train_tokenizer is not None else split == "train"
    cfg = PrepConfig(
        format=fv.format,
        input=fv.input,
        output=os.path.abspath(fv.output),
        split=split,
        num_shards=fv.num_shards,
        tokenizer=fv.tokenizer,
        vocab_size=fv.vocab_size,
        train_tokenizer=bool(train_tok),
        tokenizer_max_sentences=fv.tokenizer_max_sentences,
        min_duration=float(fv.min_duration),
        max_duration=float(fv.max_duration),
        sample_rate=fv.sample_rate,
        audio_format=fv.audio_format,
        feature=feature,
        hours_per_shard=float(fv.hours_per_shard),
        seed=fv.seed,
        alphabet=fv.alphabet,
        allow_pipes=bool(fv.allow_pipes),
        tfds_data_dir=fv.tfds_data_dir,
        tfds_split=fv.tfds_split,
        tfds_audio_key=fv.tfds_audio_key,
        tfds_text_key=fv.tfds_text_key,
        tfds_speaker_key=fv.tfds_speaker_key,
        tfds_id_key=fv.tfds_id_key,
        tfds_sample_rate=fv.tfds_sample_rate,
    )
    return cfg, rest[1:]


def pipeline_options(beam_args: list[str]) -> tuple[PipelineOptions, Any]:
    """Beam options from the pass-through flags, and the runner object to use (or None).

    DirectRunner (the default) becomes the FnApiRunner in multi_processing mode with one
    worker per CPU unless the flags say otherwise; other runners are left untouched.
    """
    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    runner_name = standard.runner or "DirectRunner"
    if runner_name not in ("DirectRunner", "SwitchingDirectRunner"):
        return options, None
    standard.runner = runner_name
    direct = options.view_as(DirectOptions)

    def given(flag: str) -> bool:
        return any(a == f"--{flag}" or a.startswith(f"--{flag}=") for a in beam_args)

    if not given("direct_running_mode"):
        direct.direct_running_mode = "multi_processing"
    if not given("direct_num_workers"):
        direct.direct_num_workers = os.cpu_count() or 1
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    return options, fn_runner.FnApiRunner()


# =============================================================================================
# Per-item work: validate, convert, encode, feature sums
# =============================================================================================


class Prepared(NamedTuple):
    """A reference to one validated, encoded utterance on its way to a shard.

    The record bytes wait in a spill file (``spill_path``, record ``spill_index``) so the
    shuffle moves ~1 KB per utterance instead of its audio: memory stays flat on the
    DirectRunner (which shuffles in memory) and a shard writer never holds its audio.
    """

    id: str
    speaker: str
    spill_path: str
    spill_index: int
    samples: int  # Audio length; integers make the shard placement exact and deterministic.
    duration: float
    normalized_text: str
    resampled: bool
    downmixed: bool
    frames: int  # Log-mel frames, and their per-bin float64 sums (F,) and sums of squares.
    mel_sum: np.ndarray
    mel_sum_sq: np.ndarray


@functools.cache
def _blas_controller() -> Any:
    # threadpoolctl comes with librosa (via scikit-learn); the controller is built once
    # because inspecting the loaded libraries costs milliseconds, applying it microseconds.
    import threadpoolctl

    return threadpoolctl.ThreadpoolController()


def log_mel(audio_i16: np.ndarray, feature: LogMelConfig) -> np.ndarray:
    """The statistics' features: (F, T) float32 log-mel of an int16 waveform (N,).

    Equals ``log(librosa.feature.melspectrogram(y, power=2.0, pad_mode="constant",
    norm="slaney", ...) + log_floor)`` with the filterbank cached and applied as a BLAS
    matmul: librosa rebuilds the filterbank per call and applies it with an einsum that
    took ~75% of the preparation time on two cores.
    """
    import librosa

    y = audio_i16.astype(np.float32) / 32768.0
    spectrum = librosa.stft(
        y,
        n_fft=feature.n_fft,
        hop_length=feature.hop_length,
        win_length=feature.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
    )
    power = np.square(np.abs(spectrum))  # (n_fft // 2 + 1, T) float32
    # One BLAS thread: parallelism comes from Beam workers, and OpenBLAS threads contending
    # for busy cores made this small matmul 40x slower (21 ms instead of 0.5 ms).
    with _blas_controller().limit(limits=1, user_api="blas"):
        mel = mel_filterbank(feature).T @ power
    return np.log(mel + np.float32(feature.log_floor))


def log_mel_sums(
    audio_i16: np.ndarray, feature: LogMelConfig
) -> tuple[int, np.ndarray, np.ndarray]:
    """(frames, per-bin sum (F,) float64, per-bin sum of squares (F,) float64)."""
    feats = log_mel(audio_i16, feature).astype(np.float64)
    return feats.shape[1], feats.sum(axis=1), np.square(feats).sum(axis=1)


class ValidateAndEncode(beam.DoFn):
    """Item -> Prepared, or a ("skipped", reason, id) event on the EVENTS output.

    Each bundle appends its records to its own spill file in ``spill_dir``; downstream
    reads them only after the bundle (and so the file) is complete. A retried bundle writes
    a new file, and the failed attempt's file is simply never referenced.
    """

    def __init__(self, cfg: PrepConfig, spill_dir: str):
        self._cfg = cfg
        self._spill_dir = spill_dir
        self._spill: Any = None

    def start_bundle(self) -> None:
        self._spill, self._spill_path, self._spill_count = None, "", 0

    def finish_bundle(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def _write_spill(self, record: bytes) -> tuple[str, int]:
        if self._spill is None:
            from array_record.python.array_record_module import ArrayRecordWriter

            self._spill_path = os.path.join(self._spill_dir, f"{uuid.uuid4().hex}.array_record")
            self._spill = ArrayRecordWriter(self._spill_path, "group_size:1")
        self._spill.write(record)
        self._spill_count += 1
        return self._spill_path, self._spill_count - 1

    def process(self, item: Item) -> Iterator[Any]:
        cfg = self._cfg

        def skip(reason: str) -> beam.pvalue.TaggedOutput:
            return beam.pvalue.TaggedOutput(EVENTS, (SKIPPED, reason, item.id))

        # Cheap checks first; an item with several problems reports the first one.
        if item.error is not None:
            yield skip(item.error)
            return
        normalized = normalize_text(item.text or "")
        if not normalized:
            yield skip(EMPTY_TRANSCRIPT)
            return
        if cfg.alphabet is not None and not set(normalized) <= set(cfg.alphabet) | {" "}:
            yield skip(OUT_OF_ALPHABET)
            return
        try:
            audio_nc, source_rate = load_item_audio(item, cfg)
        except AudioError as e:
            yield skip(e.reason)
            return
        if audio_nc.shape[0] == 0:
            yield skip(ZERO_LENGTH)
            return
        if not np.isfinite(audio_nc).all():
            yield skip(NON_FINITE)
            return
        seconds = audio_nc.shape[0] / source_rate
        if seconds < cfg.min_duration:
            yield skip(TOO_SHORT)
            return
        if seconds > cfg.max_duration:
            yield skip(TOO_LONG)
            return
        downmixed = audio_nc.shape[1] > 1
        audio = audio_nc.mean(axis=1) if downmixed else audio_nc[:, 0]
        resampled = source_rate != cfg.sample_rate
        if resampled:
            import soxr

            audio = soxr.resample(audio, source_rate, cfg.sample_rate)
        audio_i16 = records.to_int16(audio)
        record = records.encode_record(
            id=item.id,
            audio=audio_i16,
            sample_rate=cfg.sample_rate,
            text=item.text,
            speaker=item.speaker,
            audio_format=cfg.audio_format,
        )
        frames, mel_sum, mel_sum_sq = log_mel_sums(audio_i16, cfg.feature)
        spill_path, spill_index = self._write_spill(record)
        yield Prepared(
            id=item.id,
            speaker=item.speaker,
            spill_path=spill_path,
            spill_index=spill_index,
            samples=int(audio_i16.size),
            duration=audio_i16.size / cfg.sample_rate,
            normalized_text=normalized,
            resampled=resampled,
            downmixed=downmixed,
            frames=frames,
            mel_sum=mel_sum,
            mel_sum_sq=mel_sum_sq,
        )


# =============================================================================================
# Sharding and writing
# =============================================================================================


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
    return f"{split}-{shard:05d}-of-{num_shards:05d}.array_record"


def key_by_group(p: Prepared, num_shards: int) -> tuple[str, int]:
    return group_key(p.speaker, p.id, num_shards), p.samples


def key_by_shard(
    p: Prepared, placement: dict[str, int], num_shards: int
) -> tuple[tuple[int, int], Prepared]:
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


class KeepFirstOfId(beam.DoFn):
    """(id, Iterable[Item]) -> the item that comes first in the input; the others are
    skipped as duplicates (EVENTS), before any audio is read."""

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        item_id, items = element
        first, *rest = sorted(items, key=lambda it: (it.position, it.audio_path, it.start))
        yield first
        for _ in rest:
            yield beam.pvalue.TaggedOutput(EVENTS, (SKIPPED, DUPLICATE_ID, item_id))


def _read_spill(readers: dict[str, Any], p: Prepared) -> bytes:
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
                writer.write(_read_spill(spills, p))
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


Stats = tuple[int, np.ndarray, np.ndarray]  # (frames, per-bin sum (F,), sum of squares (F,))


def add_stats(total: Stats | None, x: Stats) -> Stats:
    """Adds zeroth, first and second order statistics (float64)."""
    if total is None:
        return int(x[0]), np.array(x[1], np.float64), np.array(x[2], np.float64)
    return total[0] + int(x[0]), total[1] + x[1], total[2] + x[2]


def stats_to_json(stats: Stats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {"count": stats[0], "sum": stats[1].tolist(), "sum_sq": stats[2].tolist()}


def combine_stats(per_shard: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Per-shard {count, sum, sum_sq} -> their total, summed in shard order (None: no frames).

    This is how statistics computed in parallel become the global ones: the sums of sums.
    """
    total = None
    for s in per_shard:
        if s is not None:
            total = add_stats(total, (s["count"], np.asarray(s["sum"]), np.asarray(s["sum_sq"])))
    return stats_to_json(total)


# =============================================================================================
# Aggregation (CombineFns) and hand-off to the launcher
# =============================================================================================


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


class TranscriptSampleFn(beam.CombineFn):
    """(id, normalized text) -> every character seen, and a deterministic sample of at most
    k texts (those with the smallest crc32 of the id): exact for the char tokenizer, bounded
    memory for SentencePiece."""

    def __init__(self, max_sentences: int):
        self._k = max_sentences

    def create_accumulator(self) -> tuple[set[str], list[tuple[int, str, str]], int]:
        return set(), [], 0

    def _prune(self, sample: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
        return heapq.nsmallest(self._k, sample) if len(sample) > 2 * self._k else sample

    def add_input(self, acc: Any, x: tuple[str, str]) -> Any:
        chars, sample, n = acc
        chars.update(x[1])
        sample.append((zlib.crc32(x[0].encode("utf-8")), x[0], x[1]))
        return chars, self._prune(sample), n + 1

    def merge_accumulators(self, accs: Any) -> Any:
        chars, sample, n = set(), [], 0
        for c, s, m in accs:
            chars |= c
            sample = self._prune(sample + s)
            n += m
        return chars, sample, n

    def extract_output(self, acc: Any) -> dict[str, Any]:
        chars, sample, n = acc
        texts = [text for _, _, text in heapq.nsmallest(self._k, sample)]
        return {"chars": sorted(chars), "texts": texts, "num_texts": n}


def write_json(value: Any, path: str) -> None:
    """Writes one element as JSON (the pipeline's hand-off of small results to the launcher)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def write_shard_meta(meta: dict[str, Any], parts_dir: str) -> None:
    """Hands one shard's metadata to the launcher (one small file per shard)."""
    write_json(meta, os.path.join(parts_dir, f"shard-{meta['shard']:05d}.json"))


def build_pipeline(p: beam.Pipeline, cfg: PrepConfig, staging_dir: str) -> None:
    """Adds the whole preparation to ``p``; results land in ``staging_dir`` and its _parts/.

    read -> keep the first item of each id -> validate, encode, spill -> count -> speaker
    groups -> placement (one small table) -> group by shard -> write shards
    """
    parts = os.path.join(staging_dir, "_parts")
    spill_dir = os.path.join(staging_dir, "_spill")
    items = READERS[cfg.format](p, cfg)
    _ = (
        items
        | "CountInput" >> beam.combiners.Count.Globally()
        | "WriteNumInput" >> beam.Map(write_json, os.path.join(parts, "num_input.json"))
    )
    # Items are tiny (path + text). Grouping them by id finds duplicates before any audio is
    # read, and spreads the heavy per-item work over workers instead of leaving it fused
    # with whichever worker listed the input.
    unique = (
        items
        | "KeyById" >> beam.Map(lambda it: (it.id, it))
        | "GroupById" >> beam.GroupByKey()
        | "KeepFirstOfId" >> beam.ParDo(KeepFirstOfId()).with_outputs(EVENTS, main="items")
    )
    validated = unique.items | "Validate" >> beam.ParDo(
        ValidateAndEncode(cfg, spill_dir)
    ).with_outputs(EVENTS, main="prepared")
    prepared = validated.prepared
    if cfg.num_shards is not None:
        num_shards = p | "NumShards" >> beam.Create([cfg.num_shards])
    else:
        num_shards = (
            prepared
            | "CountSeconds" >> beam.CombineGlobally(CountAndSecondsFn())
            | "NumShards" >> beam.MapTuple(default_num_shards, hours_per_shard=cfg.hours_per_shard)
        )
    _ = num_shards | "WriteNumShards" >> beam.Map(
        write_json, os.path.join(parts, "num_shards.json")
    )
    num_shards_side = beam.pvalue.AsSingleton(num_shards)
    placement = (
        prepared
        | "KeyByGroup" >> beam.Map(key_by_group, num_shards_side)
        | "SumGroups" >> beam.CombinePerKey(sum)
        | "ListGroups" >> beam.combiners.ToList()
        | "PlaceGroups" >> beam.Map(place_groups, num_shards_side, seed=cfg.seed)
    )
    written = (
        prepared
        | "KeyByShard"
        >> beam.Map(key_by_shard, beam.pvalue.AsSingleton(placement), num_shards_side)
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards"
        >> beam.ParDo(
            WriteShard(staging_dir, cfg.split, cfg.train_tokenizer, cfg.seed)
        ).with_outputs(EVENTS, TEXTS, main="shards")
    )
    _ = written.shards | "WriteShardMeta" >> beam.Map(write_shard_meta, parts)
    _ = (
        (unique[EVENTS], validated[EVENTS], written[EVENTS])
        | "AllEvents" >> beam.Flatten()
        | "SummarizeEvents" >> beam.CombineGlobally(EventSummaryFn())
        | "WriteEvents" >> beam.Map(write_json, os.path.join(parts, "events.json"))
    )
    if cfg.train_tokenizer:
        _ = (
            written[TEXTS]
            | "SampleTexts" >> beam.CombineGlobally(TranscriptSampleFn(cfg.tokenizer_max_sentences))
            | "WriteTexts" >> beam.Map(write_json, os.path.join(parts, "texts.json"))
        )


# =============================================================================================
# Launcher: staging, finalizing, report
# =============================================================================================


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _staging_path(output: str, name: str) -> str:
    """A fresh hidden directory next to the final one (same filesystem: rename works)."""
    return os.path.join(output, f".{name}.staging-{uuid.uuid4().hex[:8]}")


def _make_dirs(staging: str, subdirs: tuple[str, ...] = ()) -> str:
    try:
        for sub in ("", *subdirs):
            os.makedirs(os.path.join(staging, sub))
    except OSError as e:
        output = os.path.dirname(staging)
        raise PrepareError(f"output directory {output} is not writable: {e}") from e
    return staging


def _replace_dir(staging: str, final: str) -> None:
    """Moves ``staging`` to ``final``, replacing (never merging with) what was there."""
    if os.path.exists(final):
        old = f"{staging}.old"
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old)
    else:
        os.rename(staging, final)


def _summarize_events(events: dict[str, list[Any]]) -> dict[str, Any]:
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


def _finalize_shards(
    cfg: PrepConfig, staging: str
) -> tuple[list[dict[str, Any]], np.ndarray, dict[str, Any] | None]:
    """Collects shard metadata (writing empty files for shards no group was placed in);
    returns (shards, durations in file order, statistics combined over shards)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    parts = os.path.join(staging, "_parts")
    num_shards = int(_read_json(os.path.join(parts, "num_shards.json")))
    metas = {}
    for name in os.listdir(parts):
        if name.startswith("shard-"):
            meta = _read_json(os.path.join(parts, name))
            metas[meta["shard"]] = meta
    shards, durations, stats = [], [], []
    for shard in range(num_shards):
        meta = metas.get(shard)
        if meta is None:
            name = shard_file_name(cfg.split, shard, num_shards)
            ArrayRecordWriter(os.path.join(staging, name), "group_size:1").close()
            meta = {"path": name, "num_records": 0, "seconds": 0.0, "durations": [], "stats": None}
        shards.append({k: meta[k] for k in ("path", "num_records", "seconds")})
        durations.extend(meta["durations"])
        stats.append(meta["stats"])
    return shards, np.asarray(durations, np.float32), combine_stats(stats)


def _spread(values: list[float]) -> dict[str, float]:
    """min / mean / max of the shards' audio: how equal the shards came out."""
    v = np.asarray(values, np.float64)
    return {"min": float(v.min()), "mean": float(v.mean()), "max": float(v.max())}


def _train_tokenizer(cfg: PrepConfig, texts: dict[str, Any]) -> Tokenizer:
    if cfg.tokenizer == "char":
        return Tokenizer(kind="char", vocab=[BLANK, UNK, *texts["chars"]])
    try:
        return train_sentencepiece_tokenizer(
            texts["texts"], model_type=cfg.tokenizer, vocab_size=cfg.vocab_size
        )
    except ValueError as e:
        raise PrepareError(f"{e}; try a smaller --vocab_size") from e


def _finalize(cfg: PrepConfig, staging: str, start_time: float) -> dict[str, Any]:
    """Turns the pipeline's outputs in ``staging`` into the split's files; returns the report."""
    parts = os.path.join(staging, "_parts")
    shards, durations, stats = _finalize_shards(cfg, staging)
    records.write_split_index(
        staging,
        shards,
        durations,
        extra={
            "split": cfg.split,  # The staging directory's name is not the split's.
            "sample_rate": cfg.sample_rate,
            "audio_format": cfg.audio_format,
            "format": cfg.format,
            "input": cfg.input,
            "num_shards": len(shards),
        },
    )
    if stats is not None:
        write_json({"feature": cfg.feature.as_dict(), **stats}, os.path.join(staging, "stats.json"))
    events = _summarize_events(_read_json(os.path.join(parts, "events.json")))
    num_input = int(_read_json(os.path.join(parts, "num_input.json")))
    num_written = int(durations.size)
    num_skipped = sum(e["count"] for e in events[SKIPPED].values())
    if num_input != num_written + num_skipped:  # An invariant; failing it is a bug here.
        raise RuntimeError(
            f"lost items: {num_input} in, {num_written} written, {num_skipped} skipped"
        )
    report = {
        "split": cfg.split,
        "format": cfg.format,
        "input": cfg.input,
        "num_input": num_input,
        "num_written": num_written,
        "hours_written": float(durations.astype(np.float64).sum() / 3600.0),
        "num_shards": len(shards),
        "shard_hours": _spread([s["seconds"] / 3600.0 for s in shards]),
        "skipped": events[SKIPPED],
        "resampled": events[RESAMPLED],
        "downmixed": events[DOWNMIXED],
        "split_dir": cfg.split_dir,
        "elapsed_s": 0.0,
    }
    if cfg.train_tokenizer and num_written:
        # A failure here (e.g. --vocab_size too large for the corpus) is reported, not
        # raised: the shards are good and worth keeping; prepare() raises it afterwards.
        try:
            tokenizer = _train_tokenizer(cfg, _read_json(os.path.join(parts, "texts.json")))
        except PrepareError as e:
            report["tokenizer"] = {"kind": cfg.tokenizer, "error": str(e)}
        else:
            tok_staging = _make_dirs(_staging_path(cfg.output, "tokenizer"))
            tokenizer.save(tok_staging)
            _replace_dir(tok_staging, os.path.join(cfg.output, "tokenizer"))
            report["tokenizer"] = {"kind": cfg.tokenizer, "vocab_size": tokenizer.vocab_size}
    shutil.rmtree(parts)
    shutil.rmtree(os.path.join(staging, "_spill"))
    report["elapsed_s"] = round(time.time() - start_time, 3)
    write_json(report, os.path.join(staging, "prep_report.json"))
    return report


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
    tok = report.get("tokenizer")
    if tok and "vocab_size" in tok:
        lines.append(f"  tokenizer: {tok['kind']}, {tok['vocab_size']} labels (blank included)")
    lines.append(f"  report: {os.path.join(split_dir, 'prep_report.json')}")
    return "\n".join(lines)


def prepare(argv: list[str]) -> dict[str, Any]:
    """Runs the preparation for ``argv`` (argv[0] is the program name); returns the report.

    Raises:
      PrepareError: a user mistake (bad flag, missing input, unwritable output, no records).
    """
    cfg, beam_args = parse_args(argv)
    start = time.time()
    options, runner = pipeline_options(beam_args)
    p = beam.Pipeline(runner=runner, options=options)
    staging = _staging_path(cfg.output, cfg.split)
    try:
        build_pipeline(p, cfg, staging)  # Raises for a missing input before anything is written.
    except PrepareError:
        # Beam removes the pipeline's local temp directory only when the pipeline runs.
        shutil.rmtree(p.local_tempdir, ignore_errors=True)
        raise
    _make_dirs(staging, subdirs=("_parts", "_spill"))
    try:
        result = p.run()
        state = result.wait_until_finish()
        if state not in (None, PipelineState.DONE):
            raise RuntimeError(f"pipeline ended in state {state}")
        report = _finalize(cfg, staging, start)
        _replace_dir(staging, cfg.split_dir)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    if report["num_written"] == 0:
        raise PrepareError(
            f"no records written from {cfg.input}: all {report['num_input']} items were skipped "
            f"(see {os.path.join(cfg.split_dir, 'prep_report.json')})"
        )
    if "error" in report.get("tokenizer", {}):
        raise PrepareError(
            f"{cfg.split_dir} was written but the tokenizer was not: {report['tokenizer']['error']}"
        )
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: prints a summary, or one ``error:`` line and returns 2."""
    argv = list(sys.argv if argv is None else argv)
    if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]):
        fv = flags.FlagValues()
        _define_flags(fv)
        print(__doc__)
        print(fv.get_help())
        return 0
    try:
        report = prepare(argv)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0


if __name__ == "__main__":
    # Run the copy imported under its real name: Beam workers unpickle DoFns and elements by
    # module path, and "__main__" in a worker is the worker itself.
    from data_prep import prepare as _prepare

    sys.exit(_prepare.main())
