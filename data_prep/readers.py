"""Readers: ``--format`` -> a PCollection of :class:`Item`, and the audio loader for items.

A reader only lists utterances (id, where the audio is, transcript, speaker); the
validation, decoding and encoding happen once, for every format alike, in
``data_prep.prepare``. Where the audio of an item is, ``Item.audio_path``:

- a local path or a Beam filesystem URL (``gs://...``): any libsndfile format;
- ``pipe:<shell command>``: a Kaldi ``wav.scp`` pipe whose stdout is a sound file (only
  with ``--allow_pipes``, since it runs a command);
- ``tfds:<index>``: record ``index`` of the TFDS dataset named by ``--input``.

``Item.start``/``Item.end`` cut a segment (seconds) out of the decoded audio (Kaldi
``segments``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

MANIFEST_LINES_PER_CHUNK = 2_000

# Skip reasons found while reading (keys of prep_report.json["skipped"]).
MALFORMED = "malformed_manifest_line"
MISSING_AUDIO = "missing_audio"
UNDECODABLE_AUDIO = "undecodable_audio"
SEGMENT_OUT_OF_RANGE = "segment_out_of_range"


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


def _is_remote(path: str) -> bool:
    return "://" in path


def _manifest_chunks(path: str, lines_per_chunk: int) -> list[tuple[int, int, int]]:
    """Splits a manifest into (byte_start, byte_end, first_line_number) ranges.

    One sequential scan in the launcher; workers then read their ranges in parallel and still
    know each line's number (for error examples).
    """
    chunks, start, offset, line_no, first_line = [], 0, 0, 0, 1
    with FileSystems.open(path, compression_type="uncompressed") as f:
        for line in f:
            offset += len(line)
            line_no += 1
            if line_no - first_line + 1 == lines_per_chunk:
                chunks.append((start, offset, first_line))
                start, first_line = offset, line_no + 1
    if offset > start:
        chunks.append((start, offset, first_line))
    return chunks


def _manifest_item_id(entry: dict[str, Any], audio_filepath: str, base_dir: str) -> str:
    """An explicit "id", else the audio path relative to the manifest, without extension."""
    explicit = entry.get("id")
    if isinstance(explicit, str) and explicit:
        return explicit
    path = audio_filepath
    if os.path.isabs(path):
        rel = os.path.relpath(path, base_dir)
        path = rel if not rel.startswith("..") else path
    return os.path.splitext(path)[0].replace(os.sep, "/")


def parse_manifest_line(line: bytes, line_no: int, name: str, base_dir: str) -> Item | None:
    """Parses one JSON-lines manifest entry; None for a blank line (not an item)."""
    where = f"{name}:{line_no}"
    malformed = Item(id=where, audio_path="", text=None, speaker="unknown", error=MALFORMED)
    try:
        stripped = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return malformed
    if not stripped:
        return None
    try:
        entry = json.loads(stripped)
    except json.JSONDecodeError:
        return malformed
    if not isinstance(entry, dict):
        return malformed
    audio_filepath = entry.get("audio_filepath")
    text = entry.get("text")
    if not isinstance(audio_filepath, str) or not audio_filepath:
        return malformed
    if text is not None and not isinstance(text, str):
        return malformed
    speaker = entry.get("speaker")
    if _is_remote(audio_filepath) or os.path.isabs(audio_filepath):
        full_path = audio_filepath
    else:
        full_path = FileSystems.join(base_dir, audio_filepath)
    return Item(
        id=_manifest_item_id(entry, audio_filepath, base_dir),
        audio_path=full_path,
        text=text,
        speaker="unknown" if speaker is None or speaker == "" else str(speaker),
        position=line_no,
    )


def read_manifest_chunk(chunk: tuple[int, int, int], path: str) -> Iterator[Item]:
    """Yields the Items of one byte range of a manifest."""
    start, end, first_line = chunk
    with FileSystems.open(path, compression_type="uncompressed") as f:
        f.seek(start)
        data = f.read(end - start)
    name = os.path.basename(path)
    base_dir = os.path.dirname(path)
    lines = data.split(b"\n")  # Exactly the file's line breaks (\r is stripped per line).
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines):
        item = parse_manifest_line(line, first_line + i, name, base_dir)
        if item is not None:
            yield item


@register_reader("manifest")
def read_manifest(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """JSON lines {"audio_filepath", "text", "duration", "speaker"}; relative audio paths are
    relative to the manifest's directory; "speaker" is optional; "duration" is not trusted
    (it is measured from the audio)."""
    path = cfg.input if _is_remote(cfg.input) else os.path.abspath(cfg.input)
    if not FileSystems.exists(path) or (not _is_remote(path) and not os.path.isfile(path)):
        raise PrepareError(f"input manifest not found: {path}")
    chunks = _manifest_chunks(path, MANIFEST_LINES_PER_CHUNK)
    return (
        p
        | "ManifestChunks" >> beam.Create(chunks)
        | "ParseManifest" >> beam.FlatMap(read_manifest_chunk, path=path)
    )


def load_audio_file(path: str) -> tuple[np.ndarray, int]:
    """Reads any libsndfile format as ((N, C) float32, sample_rate).

    Raises:
      FileNotFoundError: no such file.
      Exception: anything libsndfile cannot decode.
    """
    import soundfile as sf

    if _is_remote(path):
        if not FileSystems.exists(path):
            raise FileNotFoundError(path)
        import io

        with FileSystems.open(path, compression_type="uncompressed") as f:
            source: Any = io.BytesIO(f.read())
    else:
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        source = path
    audio, sample_rate = sf.read(source, dtype="float32", always_2d=True)
    return audio, int(sample_rate)


def load_item_audio(item: Item, cfg: Any) -> tuple[np.ndarray, int]:
    """An item's audio as ((N, C) float32, sample_rate), cut to its segment.

    Raises:
      AudioError: with the skip reason (missing, undecodable, ...).
    """
    source = item.audio_path
    try:
        audio, rate = load_audio_file(source)
    except FileNotFoundError as e:
        raise AudioError(MISSING_AUDIO, str(e)) from e
    except Exception as e:  # libsndfile raises several types for undecodable input.
        raise AudioError(UNDECODABLE_AUDIO, str(e)) from e
    return cut_segment(audio, rate, item.start, item.end), rate


def cut_segment(audio: np.ndarray, rate: int, start: float, end: float | None) -> np.ndarray:
    """Samples [round(start * rate), round(end * rate)) of (N, C) audio.

    Raises:
      AudioError(SEGMENT_OUT_OF_RANGE): the segment starts after the audio ends, or ends
        more than one frame (10 ms) past it (Kaldi's own tolerance for rounded times).
    """
    if start == 0.0 and end is None:
        return audio
    n = audio.shape[0]
    first = int(round(start * rate))
    last = n if end is None else int(round(end * rate))
    if first >= n or last > n + int(0.01 * rate) or last <= first:
        raise AudioError(
            SEGMENT_OUT_OF_RANGE,
            f"segment [{start}, {end}] s outside audio of {n / rate:.3f} s",
        )
    return audio[first : min(last, n)]
