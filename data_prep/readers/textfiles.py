"""Input files for the readers: local paths or Beam filesystem URLs, line-range chunks that
workers read in parallel, and ``KEY REST`` lines (LibriSpeech ``*.trans.txt``, Kaldi files)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import NO_SPEAKER, Item


def is_remote(path: str) -> bool:
    """Whether ``path`` is a Beam filesystem URL (``gs://...``) rather than a local path."""
    return "://" in path


def local_path(path: str) -> str:
    """``path`` made absolute if it is local; URLs unchanged."""
    return path if is_remote(path) else os.path.abspath(path)


def is_dir(path: str) -> bool:
    """A local directory, or a remote prefix with at least one object under it."""
    if not is_remote(path):
        return os.path.isdir(path)
    return bool(FileSystems.match([FileSystems.join(path, "*")])[0].metadata_list)


def file_names(directory: str) -> list[str]:
    """Names of the plain files directly in ``directory`` (local or a Beam filesystem URL)."""
    if is_remote(directory):
        matches = FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list
        return sorted(m.path.rstrip("/").rsplit("/", 1)[-1] for m in matches)
    with os.scandir(directory) as entries:
        return sorted(e.name for e in entries if e.is_file())


def match_files(source: str, in_directory: str) -> list[str]:
    """The files ``--input`` names, sorted: one file, a directory's files matching the
    glob ``in_directory`` (e.g. "*.tar"), or a glob pattern; local or a Beam filesystem
    URL. Empty when nothing matches."""
    pattern = local_path(source)
    if not is_remote(source) and os.path.isdir(source):
        pattern = os.path.join(pattern, in_directory)
    return sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)


def read_bytes(path: str) -> bytes:
    """The whole content of a local file or a Beam filesystem URL."""
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read()


def line_chunks(
    path: str, lines_per_chunk: int, on_line: Callable[[bytes], None] | None = None
) -> list[tuple[int, int, int]]:
    """Splits a line-oriented file into (byte_start, byte_end, first_line_number) ranges.

    One sequential scan in the launcher; workers then read their ranges in parallel and still
    know each line's number (for error examples). ``on_line`` sees every line of that scan
    (the kaldi reader checks wav.scp for pipes without reading it twice).
    """
    chunks, start, offset, line_no, first_line = [], 0, 0, 0, 1
    with FileSystems.open(path, compression_type="uncompressed") as f:
        for line in f:
            if on_line is not None:
                on_line(line)
            offset += len(line)
            line_no += 1
            if line_no - first_line + 1 == lines_per_chunk:
                chunks.append((start, offset, first_line))
                start, first_line = offset, line_no + 1
    if offset > start:
        chunks.append((start, offset, first_line))
    return chunks


def read_line_chunk(chunk: tuple[int, int, int], path: str) -> Iterator[tuple[int, bytes]]:
    """Yields (line_number, line) for one byte range of a file (see line_chunks)."""
    start, end, first_line = chunk
    with FileSystems.open(path, compression_type="uncompressed") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.split(b"\n")  # Exactly the file's line breaks (\r is stripped per line).
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines):
        yield first_line + i, line


def split_key(line: bytes) -> tuple[str | None, bytes] | None:
    """``KEY REST`` -> (KEY, REST without surrounding whitespace); None for a blank line.

    KEY is None when it is not UTF-8. REST stays bytes so that a bad transcript still leaves
    its utterance id usable (one item per utterance, with the reason, instead of two).
    """
    parts = line.strip().split(None, 1)
    if not parts:
        return None
    try:
        key: str | None = parts[0].decode("utf-8")
    except UnicodeDecodeError:
        key = None
    return key, parts[1] if len(parts) > 1 else b""


def parse_transcript_line(line: bytes) -> tuple[str | None, str | None] | None:
    """``UTT-ID TRANSCRIPT`` -> (id, transcript); None for a blank line.

    Either part is None when it is not UTF-8. A line with only an id has transcript "" (it is
    then skipped downstream as an empty transcript, a more precise reason than "malformed").
    """
    parsed = split_key(line)
    if parsed is None:
        return None
    key, rest = parsed
    try:
        text: str | None = rest.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return key, text


def line_error(name: str, line_no: int, reason: str, speaker: str = NO_SPEAKER) -> Item:
    """A skipped item for an input line that names no usable utterance id (id ``name:line``)."""
    return Item(
        id=f"{name}:{line_no}",
        audio_path="",
        text=None,
        speaker=speaker,
        error=reason,
        position=line_no,
    )
