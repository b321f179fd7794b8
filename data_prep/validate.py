"""Per-item work: drop duplicate ids, validate each item, decode, resample/downmix, encode
its record, sum its log-mel statistics and spill the record for the shard writers.

Phoneme fields (data_prep.phoneme_fields) are checked by the reader; here they are fitted
to the measured duration, and required with --require_phonemes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np

from data_prep import phoneme_fields
from data_prep.config import PrepConfig
from data_prep.readers.audio import load_item_audio
from data_prep.readers.common import AudioError, Item
from data_prep.report import EVENTS, SKIPPED
from data_prep.stats import feature_sums
from jaxspeech.data import records
from jaxspeech.data.tokenizer import normalize_text

# Skip reasons (keys of prep_report.json["skipped"]).
EMPTY_TRANSCRIPT = "empty_transcript"
ZERO_LENGTH = "zero_length"
NON_FINITE = "non_finite_samples"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE_ID = "duplicate_id"
OUT_OF_ALPHABET = "out_of_alphabet"


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
    # Feature frames, and their per-feature float64 sums (F,) and sums of squares: of the
    # log-mel bins, or of the MFCCs with --features mfcc (stats.feature_sums).
    frames: int
    mel_sum: np.ndarray
    mel_sum_sq: np.ndarray
    phonemes: tuple[str, ...] = ()  # empty: an ASR record (for the split's inventory)


class KeepFirstOfId(beam.DoFn):
    """(id, Iterable[Item]) -> the item that comes first in the input; the others are
    skipped as duplicates (EVENTS), before any audio is read."""

    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        item_id, items = element
        first, *rest = sorted(items, key=lambda it: (it.position, it.audio_path, it.start))
        yield first
        for _ in rest:
            yield beam.pvalue.TaggedOutput(EVENTS, (SKIPPED, DUPLICATE_ID, item_id))


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

    def _record(self, item: Item, audio_i16: np.ndarray) -> bytes | None:
        """The record of an item and its final (N,) int16 audio; None when the item's
        phoneme ends do not fit the audio's duration."""
        cfg = self._cfg
        ends = None
        if item.phonemes is not None:
            # The record's duration: after resampling, which can shift it by a sample.
            ends = phoneme_fields.fit_ends(item.phoneme_ends, audio_i16.size / cfg.sample_rate)
            if ends is None:
                return None
        return records.encode_record(
            id=item.id,
            audio=audio_i16,
            sample_rate=cfg.sample_rate,
            text=item.text,
            speaker=item.speaker,
            audio_format=cfg.audio_format,
            phonemes=None if ends is None else " ".join(item.phonemes),
            phoneme_ends=ends,
        )

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
        if cfg.require_phonemes and item.phonemes is None:
            yield skip(phoneme_fields.MISSING_PHONEMES)
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
        record = self._record(item, audio_i16)
        if record is None:
            yield skip(phoneme_fields.PHONEME_DURATION_MISMATCH)
            return
        frames, mel_sum, mel_sum_sq = feature_sums(audio_i16, cfg.feature)
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
            phonemes=item.phonemes or (),
        )
