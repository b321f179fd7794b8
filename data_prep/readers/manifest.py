"""The ``manifest`` reader: JSON lines ``{"audio_filepath", "text", "duration", "speaker"}``
(NeMo's manifests), with NeMo's ``offset`` for segments of longer recordings, and optional
``"phonemes"`` and ``"phoneme_ends"`` for text-to-speech (data_prep.phoneme_fields)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from data_prep.phoneme_fields import parse_phoneme_fields
from data_prep.readers.common import (
    BAD_SEGMENT,
    NO_SPEAKER,
    Item,
    PrepareError,
    finite_number,
    register_reader,
)
from data_prep.readers.textfiles import is_remote, line_chunks, read_line_chunk

MANIFEST_LINES_PER_CHUNK = 2_000

# Skip reasons (keys of prep_report.json["skipped"]).
MALFORMED = "malformed_manifest_line"


def _manifest_item_id(
    entry: dict[str, Any], audio_filepath: str, base_dir: str, start: float | None = None
) -> str:
    """An explicit "id", else the audio path relative to the manifest, without extension,
    and for a segment its offset in centiseconds (segments of one recording stay apart)."""
    explicit = entry.get("id")
    if isinstance(explicit, str) and explicit:
        return explicit
    path = audio_filepath
    if os.path.isabs(path):
        rel = os.path.relpath(path, base_dir)
        path = rel if not rel.startswith("..") else path
    base = os.path.splitext(path)[0].replace(os.sep, "/")
    return base if start is None else f"{base}-{int(round(start * 100)):07d}"


def manifest_segment(entry: dict[str, Any]) -> tuple[float, float | None] | None:
    """(start, end) seconds of an entry's audio: NeMo's ``offset`` with ``duration``
    (end None: to the end of the recording); (0.0, None) without ``offset``, where
    ``duration`` is not trusted (it is measured). None: an offset or duration that is
    not a number, a negative offset, a duration <= 0."""
    if entry.get("offset") is None:
        return 0.0, None
    start = finite_number(entry["offset"])
    duration = None if entry.get("duration") is None else finite_number(entry["duration"])
    if start is None or start < 0 or (entry.get("duration") is not None and duration is None):
        return None
    if duration is not None and duration <= 0:
        return None
    return start, None if duration is None else start + duration


def parse_manifest_line(line: bytes, line_no: int, name: str, base_dir: str) -> Item | None:
    """Parses one JSON-lines manifest entry; None for a blank line (not an item)."""
    where = f"{name}:{line_no}"
    malformed = Item(id=where, audio_path="", text=None, speaker=NO_SPEAKER, error=MALFORMED)
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
    if is_remote(audio_filepath) or os.path.isabs(audio_filepath):
        full_path = audio_filepath
    else:
        full_path = FileSystems.join(base_dir, audio_filepath)
    segment = manifest_segment(entry)
    if segment is None:
        return malformed._replace(error=BAD_SEGMENT)
    start, end = segment
    phonemes, phoneme_ends, phoneme_error = parse_phoneme_fields(
        entry.get("phonemes"), entry.get("phoneme_ends")
    )
    return Item(
        id=_manifest_item_id(
            entry, audio_filepath, base_dir, None if entry.get("offset") is None else start
        ),
        audio_path=full_path,
        text=text,
        speaker=NO_SPEAKER if speaker is None or speaker == "" else str(speaker),
        error=phoneme_error,  # counted under its own reason, after the line's id is known
        position=line_no,
        start=start,
        end=end,
        phonemes=phonemes,
        phoneme_ends=phoneme_ends,
    )


def read_manifest_chunk(chunk: tuple[int, int, int], path: str) -> Iterator[Item]:
    """Yields the Items of one byte range of a manifest."""
    name = os.path.basename(path)
    base_dir = os.path.dirname(path)
    for line_no, line in read_line_chunk(chunk, path):
        item = parse_manifest_line(line, line_no, name, base_dir)
        if item is not None:
            yield item


@register_reader("manifest")
def read_manifest(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """JSON lines {"audio_filepath", "text", "duration", "speaker", "offset"}; relative
    audio paths are relative to the manifest's directory; "speaker" is optional;
    "duration" is not trusted (it is measured from the audio) unless "offset" is given:
    then the item is the segment [offset, offset + duration) of the recording (NeMo's
    segment manifests; without "duration", to its end). Optional "phonemes" and
    "phoneme_ends" (both or neither) are checked and kept (data_prep.phoneme_fields)."""
    path = cfg.input if is_remote(cfg.input) else os.path.abspath(cfg.input)
    if not FileSystems.exists(path) or (not is_remote(path) and not os.path.isfile(path)):
        raise PrepareError(f"input manifest not found: {path}")
    chunks = line_chunks(path, MANIFEST_LINES_PER_CHUNK)
    return (
        p
        | "ManifestChunks" >> beam.Create(chunks)
        | "ParseManifest" >> beam.FlatMap(read_manifest_chunk, path=path)
    )
