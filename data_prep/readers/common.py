"""What every reader shares: :class:`Item`, the errors, the shared skip reasons, and the
``--format`` registry (:data:`READERS`, filled by :func:`register_reader`)."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np

# Skip reasons of more than one format (keys of prep_report.json["skipped"]); each format's
# own are in its module.
NO_SPEAKER = "unknown"  # The speaker of an item whose input names none.
MISSING_AUDIO = "missing_audio"
UNDECODABLE_AUDIO = "undecodable_audio"
SEGMENT_OUT_OF_RANGE = "segment_out_of_range"
MISSING_TRANSCRIPT = "missing_transcript"  # Audio that no transcript line names.
BAD_SEGMENT = "bad_offset_or_duration"  # A segment start < 0, duration <= 0, or not numbers.
CHANNEL_OUT_OF_RANGE = "channel_out_of_range"  # A channel the audio does not have.
# Audio longer than --max_duration by its file header, skipped unread (the key of
# validate.TOO_LONG, which skips it when it is known only once decoded).
TOO_LONG_AUDIO = "too_long"


class PrepareError(Exception):
    """A user mistake; the CLI prints it as one line."""


class AudioError(Exception):
    """An item's audio cannot be had; ``reason`` is its skip reason."""

    def __init__(self, reason: str, message: str = ""):
        super().__init__(message or reason)
        self.reason = reason


class Item(NamedTuple):
    """One input utterance before validation.

    ``error`` is a skip reason found by the reader; ``position`` is the item's place in the
    input (among items sharing an id, the first position is written, the rest are skipped).
    """

    id: str
    audio_path: str
    text: str | None
    speaker: str
    error: str | None = None
    position: int = 0
    start: float = 0.0  # Segment start (seconds) within the decoded audio.
    end: float | None = None  # Segment end (seconds); None: the end of the audio.
    # Columns of the decoded (N, C) audio to keep (then averaged, as every multi-channel
    # input is); None: all of them.
    channels: tuple[int, ...] | None = None
    # Phonemes spoken and the second each ends at, relative to the item's audio (the
    # segment); both None when the input has none (data_prep.phoneme_fields; only the
    # manifest reader reads them).
    phonemes: tuple[str, ...] | None = None
    phoneme_ends: tuple[float, ...] | None = None
    # audio_path "pipe:<command>" is a command the input format defines (a Kaldi wav.scp
    # "command |", a Lhotse command source): only such items run one (readers/pipes.py).
    pipe: bool = False


# Positions of items read from several files: file index * this + the item's place in its
# file, so positions are unique and ordered over all files (the first of a duplicated id
# is the one written).
FILE_STRIDE = 10**9


def decode_audio_bytes(data: bytes) -> tuple[np.ndarray, int]:
    """An encoded sound file held in memory (a tar member, a dataset row) as
    ((N, C) float32, sample_rate).

    Raises:
      Exception: anything libsndfile cannot decode.
    """
    import soundfile as sf

    audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return audio, int(rate)


def finite_number(value: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (bools and strings too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


ReaderFn = Callable[[beam.Pipeline, Any], beam.PCollection]
READERS: dict[str, ReaderFn] = {}


def register_reader(name: str) -> Callable[[ReaderFn], ReaderFn]:
    """Registers a reader for ``--format name``: ``fn(pipeline, cfg) -> PCollection[Item]``.

    A reader raises PrepareError for a missing input before the pipeline runs, and emits an
    Item with ``error`` set for an input entry it cannot parse (it is counted, not dropped).
    """

    def register(fn: ReaderFn) -> ReaderFn:
        READERS[name] = fn
        return fn

    return register
