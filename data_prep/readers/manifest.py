"""The ``manifest`` reader: JSON lines ``{"audio_filepath", "text", "duration", "speaker"}``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import NO_SPEAKER, Item, PrepareError, register_reader
from data_prep.readers.textfiles import is_remote, line_chunks, read_line_chunk

MANIFEST_LINES_PER_CHUNK = 2_000

# Skip reason (a key of prep_report.json["skipped"]).
MALFORMED = "malformed_manifest_line"


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
    return Item(
        id=_manifest_item_id(entry, audio_filepath, base_dir),
        audio_path=full_path,
        text=text,
        speaker=NO_SPEAKER if speaker is None or speaker == "" else str(speaker),
        position=line_no,
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
    """JSON lines {"audio_filepath", "text", "duration", "speaker"}; relative audio paths are
    relative to the manifest's directory; "speaker" is optional; "duration" is not trusted
    (it is measured from the audio)."""
    path = cfg.input if is_remote(cfg.input) else os.path.abspath(cfg.input)
    if not FileSystems.exists(path) or (not is_remote(path) and not os.path.isfile(path)):
        raise PrepareError(f"input manifest not found: {path}")
    chunks = line_chunks(path, MANIFEST_LINES_PER_CHUNK)
    return (
        p
        | "ManifestChunks" >> beam.Create(chunks)
        | "ParseManifest" >> beam.FlatMap(read_manifest_chunk, path=path)
    )
