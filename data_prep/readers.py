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

Formats: ``manifest`` (JSON lines), ``librispeech`` (a LibriSpeech split directory), ``kaldi``
(a Kaldi data directory) and ``tfds`` (a prepared TFDS dataset stored as ``array_record``).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import os
import re
import struct
import subprocess
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

MANIFEST_LINES_PER_CHUNK = 2_000
KALDI_LINES_PER_CHUNK = 20_000  # Kaldi lines are short (~100 bytes): bigger chunks.
TFDS_RECORDS_PER_CHUNK = 1_000
PIPE_TIMEOUT_S = 300.0  # A wav.scp command that decodes one recording; minutes means stuck.

PIPE_PREFIX = "pipe:"
TFDS_PREFIX = "tfds:"

# Skip reasons found while reading (keys of prep_report.json["skipped"]).
MALFORMED = "malformed_manifest_line"
NO_SPEAKER = "unknown"  # The speaker of an item whose input names none.
MISSING_AUDIO = "missing_audio"
UNDECODABLE_AUDIO = "undecodable_audio"
SEGMENT_OUT_OF_RANGE = "segment_out_of_range"
MISSING_TRANSCRIPT = "missing_transcript"  # Audio that no transcript line names.
MALFORMED_TRANSCRIPT = "malformed_transcript_line"  # LibriSpeech *.trans.txt.
MALFORMED_TEXT = "malformed_text_line"  # Kaldi text.
MALFORMED_WAV_SCP = "malformed_wav_scp_line"
MALFORMED_SEGMENTS = "malformed_segments_line"
MALFORMED_UTT2SPK = "malformed_utt2spk_line"
NO_WAV_SCP_ENTRY = "no_wav_scp_entry"  # A Kaldi utterance (or its recording) not in wav.scp.
NO_SEGMENTS_ENTRY = "no_segments_entry"  # A Kaldi utterance in text but not in segments.
DUPLICATE_WAV_SCP = "duplicate_wav_scp_entry"  # A second wav.scp line for one key.
DUPLICATE_SEGMENTS = "duplicate_segments_entry"  # A second segments line for one utterance.
UNSUPPORTED_WAV_SCP = "unsupported_wav_scp_entry"  # ark offsets, stdin ("-").
PIPE_NOT_ALLOWED = "pipe_not_allowed"  # A wav.scp command without --allow_pipes.
PIPE_FAILED = "pipe_failed"  # A wav.scp command that exited non-zero or timed out.
UNREADABLE_TFDS_RECORD = "unreadable_tfds_record"
MALFORMED_TFDS_TEXT = "malformed_tfds_text"  # A transcript that is not UTF-8.


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


def _manifest_chunks(
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
    if _is_remote(audio_filepath) or os.path.isabs(audio_filepath):
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


def read_line_chunk(chunk: tuple[int, int, int], path: str) -> Iterator[tuple[int, bytes]]:
    """Yields (line_number, line) for one byte range of a file (see _manifest_chunks)."""
    start, end, first_line = chunk
    with FileSystems.open(path, compression_type="uncompressed") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.split(b"\n")  # Exactly the file's line breaks (\r is stripped per line).
    if lines and not lines[-1]:
        lines.pop()
    for i, line in enumerate(lines):
        yield first_line + i, line


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
    path = cfg.input if _is_remote(cfg.input) else os.path.abspath(cfg.input)
    if not FileSystems.exists(path) or (not _is_remote(path) and not os.path.isfile(path)):
        raise PrepareError(f"input manifest not found: {path}")
    chunks = _manifest_chunks(path, MANIFEST_LINES_PER_CHUNK)
    return (
        p
        | "ManifestChunks" >> beam.Create(chunks)
        | "ParseManifest" >> beam.FlatMap(read_manifest_chunk, path=path)
    )


# ---------------------------------------------------------------------------------------------
# Shared line parsing (LibriSpeech *.trans.txt and the Kaldi files)
# ---------------------------------------------------------------------------------------------


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


def _line_error(name: str, line_no: int, reason: str, speaker: str = NO_SPEAKER) -> Item:
    """A skipped item for an input line that names no usable utterance id (id ``name:line``)."""
    return Item(
        id=f"{name}:{line_no}",
        audio_path="",
        text=None,
        speaker=speaker,
        error=reason,
        position=line_no,
    )


def _local_path(path: str) -> str:
    return path if _is_remote(path) else os.path.abspath(path)


def _is_dir(path: str) -> bool:
    """A local directory, or a remote prefix with at least one object under it."""
    if not _is_remote(path):
        return os.path.isdir(path)
    return bool(FileSystems.match([FileSystems.join(path, "*")])[0].metadata_list)


def _file_names(directory: str) -> list[str]:
    """Names of the plain files directly in ``directory`` (local or a Beam filesystem URL)."""
    if _is_remote(directory):
        matches = FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list
        return sorted(m.path.rstrip("/").rsplit("/", 1)[-1] for m in matches)
    with os.scandir(directory) as entries:
        return sorted(e.name for e in entries if e.is_file())


def _read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# LibriSpeech: SPK/CHAPTER/SPK-CHAPTER-UTT.flac + SPK/CHAPTER/SPK-CHAPTER.trans.txt
# ---------------------------------------------------------------------------------------------

LIBRISPEECH_AUDIO_EXT = ".flac"
LIBRISPEECH_TRANSCRIPT_EXT = ".trans.txt"


def librispeech_chapters(root: str) -> list[str]:
    """The SPK/CHAPTER directories under a LibriSpeech split directory, sorted.

    Runs in the launcher; only two directory levels are listed (~2,500 chapters for all 960 h),
    the files inside chapters are listed by the workers.
    """
    if _is_remote(root):
        # Object stores have no directories: every file two levels down names its chapter.
        matches = FileSystems.match([FileSystems.join(root, "*", "*", "*")])[0].metadata_list
        return sorted({m.path.rsplit("/", 1)[0] for m in matches})
    chapters = []
    with os.scandir(root) as speakers:
        for speaker in sorted((e for e in speakers if e.is_dir()), key=lambda e: e.name):
            with os.scandir(speaker.path) as entries:
                chapters.extend(sorted(e.path for e in entries if e.is_dir()))
    return chapters


def read_librispeech_chapter(chapter_dir: str) -> Iterator[Item]:
    """The Items of one chapter: one per transcript line, one per flac no line names.

    Transcript lines are read from every ``*.trans.txt`` of the directory; an utterance's audio
    is ``<id>.flac`` next to it (a missing flac is reported by the loader as missing_audio).
    A line that is not UTF-8, or whose id is not a file name, is skipped as
    ``malformed_transcript_line`` with id ``<file>:<line>``.
    """
    speaker = chapter_dir.rstrip("/").rsplit("/", 2)[-2]
    names = _file_names(chapter_dir)
    flacs = {
        n[: -len(LIBRISPEECH_AUDIO_EXT)]: n for n in names if n.endswith(LIBRISPEECH_AUDIO_EXT)
    }
    named: set[str] = set()
    for trans_name in (n for n in names if n.endswith(LIBRISPEECH_TRANSCRIPT_EXT)):
        data = _read_bytes(FileSystems.join(chapter_dir, trans_name))
        for line_no, line in enumerate(data.split(b"\n"), start=1):
            parsed = parse_transcript_line(line)
            if parsed is None:
                continue
            utt, text = parsed
            valid_id = utt is not None and "/" not in utt and utt not in (".", "..")
            if valid_id:
                named.add(utt)  # Even with a bad transcript: its flac is accounted for.
            if not valid_id or text is None:
                yield _line_error(trans_name, line_no, MALFORMED_TRANSCRIPT, speaker)
                continue
            yield Item(
                id=utt,
                audio_path=FileSystems.join(chapter_dir, utt + LIBRISPEECH_AUDIO_EXT),
                text=text,
                speaker=speaker,
                position=line_no,
            )
    for utt in sorted(set(flacs) - named):
        yield Item(
            id=utt,
            audio_path=FileSystems.join(chapter_dir, flacs[utt]),
            text=None,
            speaker=speaker,
            error=MISSING_TRANSCRIPT,
        )


@register_reader("librispeech")
def read_librispeech(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """A LibriSpeech split directory (e.g. ``LibriSpeech/train-clean-100``): id = the utterance
    id, speaker = the SPK directory, text = the transcript line as written (upper case)."""
    root = _local_path(cfg.input)
    if not _is_dir(root):
        raise PrepareError(f"LibriSpeech directory not found: {root}")
    chapters = librispeech_chapters(root)
    # A cheap sanity check of the layout (one listing): the usual mistake is passing the
    # LibriSpeech/ directory itself, whose SPK/CHAPTER level is really SPLIT/SPK.
    if not chapters or not any(
        n.endswith((LIBRISPEECH_AUDIO_EXT, LIBRISPEECH_TRANSCRIPT_EXT))
        for n in _file_names(chapters[0])
    ):
        raise PrepareError(
            f"{root} is not a LibriSpeech split directory: expected SPK/CHAPTER/*.flac and "
            f"SPK/CHAPTER/SPK-CHAPTER.trans.txt under it (e.g. LibriSpeech/train-clean-100)"
        )
    return (
        p
        | "LibriSpeechChapters" >> beam.Create(chapters)
        | "ListChapters" >> beam.FlatMap(read_librispeech_chapter)
    )


# ---------------------------------------------------------------------------------------------
# Kaldi data directory: wav.scp, text, [utt2spk], [segments]
# ---------------------------------------------------------------------------------------------

_ERRORS, _BY_UTT = "errors", "by_utt"  # Tagged outputs of the Kaldi parsers.
_ARCHIVE_OFFSET = re.compile(r".*:[0-9]+")  # "raw.ark:1234": a byte offset into an archive.


class KaldiText(NamedTuple):
    """One ``text`` line of an utterance."""

    line: int
    text: str | None
    error: str | None = None


class KaldiAudio(NamedTuple):
    """Where a Kaldi utterance's audio is: its wav.scp entry, or a segment of a recording's."""

    source: str  # The file whose line defined it: "wav.scp" or "segments".
    line: int
    path: str
    error: str | None = None
    start: float = 0.0
    end: float | None = None


_DUPLICATE_REASON = {"wav.scp": DUPLICATE_WAV_SCP, "segments": DUPLICATE_SEGMENTS}


def parse_wav_scp_value(value: str, allow_pipes: bool, base_dir: str) -> tuple[str, str | None]:
    """A wav.scp rxfilename -> (audio_path, skip reason or None).

    ``command |`` is a shell pipe whose stdout is the audio: ``pipe:command``, refused
    (``pipe_not_allowed``) unless ``allow_pipes``. Kaldi's other extended forms, ``-`` (stdin)
    and ``file:offset`` (a byte offset into an archive), are ``unsupported_wav_scp_entry``.
    Anything else is a path (it may contain spaces); a relative one is resolved against
    ``base_dir``.
    """
    value = value.strip()
    if value.endswith("|"):
        command = value[:-1].strip()
        if not command:
            return "", MALFORMED_WAV_SCP
        return PIPE_PREFIX + command, None if allow_pipes else PIPE_NOT_ALLOWED
    if not value:
        return "", MALFORMED_WAV_SCP
    if value == "-" or _ARCHIVE_OFFSET.fullmatch(value):
        return value, UNSUPPORTED_WAV_SCP
    if _is_remote(value) or os.path.isabs(value):
        return value, None
    return os.path.join(base_dir, value), None


def parse_segments_value(value: str) -> tuple[str, float, float | None]:
    """``REC-ID START END`` (the part of a segments line after the utterance id) ->
    (recording id, start seconds, end seconds or None).

    Kaldi writes an END of -1 for "to the end of the recording" (None here).

    Raises:
      ValueError: not three fields, a time that is not a finite number, a negative start, or an
        end not after the start.
    """
    fields = value.split()
    if len(fields) != 3:
        raise ValueError(f"expected REC-ID START END, got {value!r}")
    rec, start, end = fields[0], float(fields[1]), float(fields[2])
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0:
        raise ValueError(f"bad segment times in {value!r}")
    if end == -1:
        return rec, start, None
    if end <= start:
        raise ValueError(f"segment ends before it starts: {value!r}")
    return rec, start, end


def parse_kaldi_text_line(numbered: tuple[int, bytes]) -> Iterator[Any]:
    """``text`` line -> (utt, KaldiText), or a malformed Item on the errors output."""
    line_no, line = numbered
    parsed = parse_transcript_line(line)
    if parsed is None:
        return
    utt, text = parsed
    if utt is None:
        yield beam.pvalue.TaggedOutput(_ERRORS, _line_error("text", line_no, MALFORMED_TEXT))
        return
    yield utt, KaldiText(line_no, text, None if text is not None else MALFORMED_TEXT)


def parse_kaldi_wav_scp_line(
    numbered: tuple[int, bytes], allow_pipes: bool, base_dir: str
) -> Iterator[Any]:
    """``wav.scp`` line -> (utt or rec id, KaldiAudio), or a malformed Item on errors."""
    line_no, line = numbered
    parsed = split_key(line)
    if parsed is None:
        return
    key, rest = parsed
    if key is None:
        yield beam.pvalue.TaggedOutput(_ERRORS, _line_error("wav.scp", line_no, MALFORMED_WAV_SCP))
        return
    try:
        path, error = parse_wav_scp_value(rest.decode("utf-8"), allow_pipes, base_dir)
    except UnicodeDecodeError:
        path, error = "", MALFORMED_WAV_SCP
    yield key, KaldiAudio("wav.scp", line_no, path, error)


def parse_kaldi_segments_line(numbered: tuple[int, bytes]) -> Iterator[Any]:
    """``segments`` line -> (rec, (utt, line, start, end)); a line with a usable utterance id but
    bad fields -> (utt, KaldiAudio with the error) on by_utt; else a malformed Item on errors."""
    line_no, line = numbered
    parsed = split_key(line)
    if parsed is None:
        return
    utt, rest = parsed
    if utt is None:
        yield beam.pvalue.TaggedOutput(
            _ERRORS, _line_error("segments", line_no, MALFORMED_SEGMENTS)
        )
        return
    try:
        rec, start, end = parse_segments_value(rest.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError.
        audio = KaldiAudio("segments", line_no, "", MALFORMED_SEGMENTS)
        yield beam.pvalue.TaggedOutput(_BY_UTT, (utt, audio))
        return
    yield rec, (utt, line_no, start, end)


def parse_kaldi_utt2spk_line(numbered: tuple[int, bytes]) -> Iterator[Any]:
    """``utt2spk`` line -> (utt, (line, speaker)), or a malformed Item on errors."""
    line_no, line = numbered
    parsed = split_key(line)
    if parsed is None:
        return
    utt, rest = parsed
    fields = rest.split()
    try:
        speaker = fields[0].decode("utf-8") if len(fields) == 1 else None
    except UnicodeDecodeError:
        speaker = None
    if utt is None or speaker is None:
        yield beam.pvalue.TaggedOutput(_ERRORS, _line_error("utt2spk", line_no, MALFORMED_UTT2SPK))
        return
    yield utt, (line_no, speaker)


def kaldi_segment_audio(element: tuple[str, dict[str, list[Any]]]) -> Iterator[Any]:
    """(rec, {"wav": [KaldiAudio], "segments": [(utt, line, start, end)]}) -> (utt, KaldiAudio)
    per segment, cut from the recording's (first) wav.scp entry.

    A recording without segments is not an utterance (e.g. silence): it yields nothing. A
    second wav.scp line for the recording goes to errors as ``duplicate_wav_scp_entry``.
    """
    _, groups = element
    wavs = sorted(groups["wav"], key=lambda a: a.line)
    for extra in wavs[1:]:
        item = _line_error("wav.scp", extra.line, DUPLICATE_WAV_SCP)
        yield beam.pvalue.TaggedOutput(_ERRORS, item)
    for utt, line_no, start, end in sorted(groups["segments"], key=lambda s: s[1]):
        if wavs:
            path, error = wavs[0].path, wavs[0].error
        else:
            path, error = "", NO_WAV_SCP_ENTRY
        yield utt, KaldiAudio("segments", line_no, path, error, start, end)


def kaldi_items(
    utt: str,
    texts: Iterable[KaldiText],
    audios: Iterable[KaldiAudio],
    speakers: Iterable[tuple[int, str]],
    no_audio_reason: str,
) -> Iterator[Item]:
    """The Items of one Kaldi utterance id, from everything the data directory says about it.

    One item per ``text`` line, with the (first) audio entry; without text, one
    ``missing_transcript`` item for the audio; without audio, ``no_audio_reason``. A second
    wav.scp/segments entry for the id is its own ``duplicate_*_entry`` item (id ``file:line``):
    a second definition of the utterance. Duplicate text lines all become items with
    ``position`` = line number, so prepare keeps the first and skips the rest as duplicate_id.
    Speaker: the first utt2spk line, else NO_SPEAKER (prepare spreads speakerless utterances
    over a bounded set of placement groups; Kaldi's utt -> utt convention would make one
    group per utterance).
    """
    texts = sorted(texts)
    audios = sorted(audios, key=lambda a: (a.source, a.line))
    speakers = sorted(speakers)
    speaker = speakers[0][1] if speakers else NO_SPEAKER
    for extra in audios[1:]:
        yield _line_error(extra.source, extra.line, _DUPLICATE_REASON[extra.source])
    audio = audios[0] if audios else None
    if not texts:
        if audio is not None:
            yield Item(
                id=utt,
                audio_path=audio.path,
                text=None,
                speaker=speaker,
                error=audio.error or MISSING_TRANSCRIPT,
                position=audio.line,
                start=audio.start,
                end=audio.end,
            )
        return
    for text in texts:
        if audio is None:
            error, path, start, end = text.error or no_audio_reason, "", 0.0, None
        else:
            error, path, start, end = text.error or audio.error, audio.path, audio.start, audio.end
        yield Item(
            id=utt,
            audio_path=path,
            text=text.text,
            speaker=speaker,
            error=error,
            position=text.line,
            start=start,
            end=end,
        )


def kaldi_group_items(
    element: tuple[str, dict[str, list[Any]]], no_audio_reason: str
) -> Iterator[Item]:
    """CoGroupByKey output -> kaldi_items."""
    utt, groups = element
    yield from kaldi_items(
        utt, groups["text"], groups["audio"], groups.get("spk", []), no_audio_reason
    )


class _PipeCounter:
    """Counts wav.scp entries and pipes during the launcher's chunking scan."""

    def __init__(self) -> None:
        self.entries, self.pipes, self.example = 0, 0, b""

    def __call__(self, line: bytes) -> None:
        parsed = split_key(line)
        if parsed is None:
            return
        self.entries += 1
        if parsed[1].endswith(b"|"):
            self.pipes += 1
            self.example = self.example or parsed[1]


@register_reader("kaldi")
def read_kaldi(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """A Kaldi data directory: ``text`` and ``wav.scp``, optional ``utt2spk`` and ``segments``.

    Without ``segments`` wav.scp maps utterance ids to audio; with it, wav.scp maps recording
    ids to audio and each segment is an utterance cut out of its recording. Relative paths in
    wav.scp are resolved against the current directory (Kaldi recipes run from their top
    directory, e.g. ``egs/x/s5``); pipe commands run in the workers' current directory. The
    files are joined by id with CoGroupByKey, so no file has to fit in one worker's memory.
    Each segment is loaded on its own: a local file is read by seeking to the segment, but a
    pipe runs once per segment of its recording.
    """
    data_dir = _local_path(cfg.input)
    if not _is_dir(data_dir):
        raise PrepareError(f"Kaldi data directory not found: {data_dir}")
    paths = {n: FileSystems.join(data_dir, n) for n in ("text", "wav.scp", "utt2spk", "segments")}
    for name in ("text", "wav.scp"):
        if not FileSystems.exists(paths[name]):
            raise PrepareError(
                f"{paths[name]} not found (a Kaldi data directory needs text and wav.scp)"
            )
    has_segments = FileSystems.exists(paths["segments"])

    def numbered_lines(name: str, label: str, on_line: Any = None) -> beam.PCollection:
        chunks = _manifest_chunks(paths[name], KALDI_LINES_PER_CHUNK, on_line)
        return (
            p
            | f"Kaldi{label}Chunks" >> beam.Create(chunks)
            | f"Kaldi{label}Lines" >> beam.FlatMap(read_line_chunk, path=paths[name])
        )

    pipes = _PipeCounter()
    wav = numbered_lines("wav.scp", "WavScp", pipes) | "ParseWavScp" >> beam.FlatMap(
        parse_kaldi_wav_scp_line, allow_pipes=cfg.allow_pipes, base_dir=os.getcwd()
    ).with_outputs(_ERRORS, main="entries")
    # All pipes and no --allow_pipes: nothing could be written, and the remedy is a flag, so
    # say so before the pipeline runs. A mix of pipes and files runs; the pipes are skipped
    # as pipe_not_allowed (the report counts them and names examples).
    if not cfg.allow_pipes and pipes.entries and pipes.pipes == pipes.entries:
        example = pipes.example.decode("utf-8", "replace")
        raise PrepareError(
            f"every entry of {paths['wav.scp']} is a shell command (e.g. {example!r}); pass "
            f"--allow_pipes to run them"
        )
    text = numbered_lines("text", "Text") | "ParseText" >> beam.FlatMap(
        parse_kaldi_text_line
    ).with_outputs(_ERRORS, main="entries")
    errors = [wav[_ERRORS], text[_ERRORS]]
    if has_segments:
        segments = numbered_lines("segments", "Segments") | "ParseSegments" >> beam.FlatMap(
            parse_kaldi_segments_line
        ).with_outputs(_ERRORS, _BY_UTT, main="entries")
        cut = (
            {"wav": wav.entries, "segments": segments.entries}
            | "JoinRecordings" >> beam.CoGroupByKey()
            | "CutSegments"
            >> beam.FlatMap(kaldi_segment_audio).with_outputs(_ERRORS, main="entries")
        )
        audio = (cut.entries, segments[_BY_UTT]) | "SegmentAudio" >> beam.Flatten()
        errors += [segments[_ERRORS], cut[_ERRORS]]
    else:
        audio = wav.entries
    groups = {"text": text.entries, "audio": audio}
    if FileSystems.exists(paths["utt2spk"]):
        utt2spk = numbered_lines("utt2spk", "Utt2spk") | "ParseUtt2spk" >> beam.FlatMap(
            parse_kaldi_utt2spk_line
        ).with_outputs(_ERRORS, main="entries")
        groups["spk"] = utt2spk.entries
        errors.append(utt2spk[_ERRORS])
    items = (
        groups
        | "JoinUtterances" >> beam.CoGroupByKey()
        | "KaldiItems"
        >> beam.FlatMap(
            kaldi_group_items,
            no_audio_reason=NO_SEGMENTS_ENTRY if has_segments else NO_WAV_SCP_ENTRY,
        )
    )
    return (items, *errors) | "KaldiAllItems" >> beam.Flatten()


# ---------------------------------------------------------------------------------------------
# TFDS: a prepared dataset in array_record format, read without TensorFlow
# ---------------------------------------------------------------------------------------------


class TfdsSource(NamedTuple):
    """A resolved ``--format tfds`` input (small and picklable: it travels to the workers)."""

    name: str
    data_dir: str | None
    split: str
    audio_key: str
    text_key: str
    id_key: str | None  # None: ids are "<split>-<index:08d>".
    speaker_key: str | None  # None: each utterance is its own speaker.
    sample_rate: int
    num_records: int


@functools.cache
def _open_tfds(name: str, data_dir: str | None, split: str) -> tuple[Any, Any]:
    """(builder, random-access data source) of a prepared TFDS split.

    Cached per process: the launcher opens it once to check it, each Beam worker once for all
    its chunks and items.

    Raises:
      PrepareError: TFDS missing, no such dataset/version/split, not prepared, not random
        access (tfrecord), or features that need TensorFlow.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise PrepareError(f"--format tfds needs tensorflow-datasets: {e}") from e
    where = f"TFDS dataset {name!r} in {data_dir or 'the default data directory'}"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        first_line = str(e).strip().splitlines()[0]  # The rest lists every TFDS dataset.
        raise PrepareError(f"{where} not found: {first_line}") from e
    except ImportError as e:
        # E.g. tfds.features.Audio builds a TensorFlow decoder as soon as the features are read.
        raise PrepareError(
            f"{where} cannot be opened without {e.name or 'a missing module'} ({e}); its "
            f"features (e.g. tfds.features.Audio) need TensorFlow: install it, or store the "
            f"audio as tfds.features.Tensor"
        ) from e
    if not builder.is_prepared():
        raise PrepareError(f"{where} is not prepared (no {builder.info.full_name} there)")
    try:
        data = builder.as_data_source(split)
    except NotImplementedError as e:  # tfrecord: no random access.
        raise PrepareError(
            f"{where} is not stored as array_record (or parquet), which random access needs: "
            f"{str(e).splitlines()[0]}"
        ) from e
    except (ValueError, KeyError) as e:
        splits = ", ".join(sorted(builder.info.splits.keys()))
        raise PrepareError(f"{where} has no split {split!r} ({e}); splits: {splits}") from e
    return builder, data


def _explicit(cfg: Any, name: str) -> bool:
    """Whether option ``name`` differs from its default (an explicit choice must exist)."""
    if dataclasses.is_dataclass(cfg):
        for field in dataclasses.fields(cfg):
            if field.name == name:
                return getattr(cfg, name) != field.default
    return True


@functools.cache
def _resolve_tfds(
    name: str,
    data_dir: str | None,
    split: str,
    audio_key: str,
    text_key: str,
    id_key: tuple[str, bool],  # (key, required)
    speaker_key: tuple[str, bool],
    sample_rate: int | None,
) -> TfdsSource:
    builder, data = _open_tfds(name, data_dir, split)
    features = builder.info.features
    names = ", ".join(sorted(features.keys()))
    where = f"TFDS dataset {builder.info.full_name}"

    def key_of(key: str, flag: str, required: bool) -> str | None:
        if key in features:
            return key
        if required:
            raise PrepareError(f"{where} has no feature {key!r} (--{flag}); features: {names}")
        return None

    key_of(audio_key, "tfds_audio_key", True)
    key_of(text_key, "tfds_text_key", True)
    resolved_id_key = key_of(id_key[0], "tfds_id_key", id_key[1])
    resolved_speaker_key = key_of(speaker_key[0], "tfds_speaker_key", speaker_key[1])
    audio = features[audio_key]
    dtype = getattr(audio, "np_dtype", None)
    shape = getattr(audio, "shape", ())
    if dtype is None or not (
        np.dtype(dtype) in (np.int16, np.int32) or np.issubdtype(dtype, np.floating)
    ):
        raise PrepareError(
            f"{where}: feature {audio_key!r} is not int16, int32 or float samples ({audio!r})"
        )
    if len(shape) not in (1, 2):
        raise PrepareError(
            f"{where}: feature {audio_key!r} has shape {shape}; expected (N,) or (N, C)"
        )
    rate = sample_rate or getattr(audio, "sample_rate", None)
    if not rate:
        raise PrepareError(
            f"{where}: feature {audio_key!r} does not say its sample rate; pass --tfds_sample_rate"
        )
    return TfdsSource(
        name=name,
        data_dir=data_dir,
        split=split,
        audio_key=audio_key,
        text_key=text_key,
        id_key=resolved_id_key,
        speaker_key=resolved_speaker_key,
        sample_rate=int(rate),
        num_records=len(data),
    )


def tfds_source(cfg: Any) -> TfdsSource:
    """The TFDS input of ``cfg``, checked (cached: the audio loader calls it per item).

    ``--tfds_audio_key``/``--tfds_text_key`` must exist; the id and speaker features are used
    when present, and must exist only when their flags were changed from the defaults.

    Raises:
      PrepareError: see _open_tfds; a missing feature (the message lists the dataset's
        features); audio that is not int16/int32/float of shape (N,) or (N, C); no sample rate.
    """
    return _resolve_tfds(
        cfg.input,
        cfg.tfds_data_dir,
        cfg.tfds_split or cfg.split,
        cfg.tfds_audio_key,
        cfg.tfds_text_key,
        (cfg.tfds_id_key, _explicit(cfg, "tfds_id_key")),
        (cfg.tfds_speaker_key, _explicit(cfg, "tfds_speaker_key")),
        cfg.tfds_sample_rate,
    )


def _feature_str(value: Any) -> str:
    """A TFDS id/speaker value (bytes for Text, numpy scalars for ints) as str."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def tfds_item(record: dict[str, Any], index: int, source: TfdsSource) -> Item:
    """The Item of record ``index`` (its audio is read again by the loader: see read_tfds)."""
    item_id = f"{source.split}-{index:08d}"
    if source.id_key is not None:
        item_id = _feature_str(record[source.id_key])
    speaker = NO_SPEAKER if source.speaker_key is None else _feature_str(record[source.speaker_key])
    raw = record[source.text_key]
    if isinstance(raw, np.ndarray) and raw.ndim == 0:
        raw = raw.item()
    text, error = None, None
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            error = MALFORMED_TFDS_TEXT
    else:
        text = str(raw)
    return Item(
        id=item_id,
        audio_path=f"{TFDS_PREFIX}{index}",
        text=text,
        speaker=speaker,
        error=error,
        position=index,
    )


def read_tfds_chunk(chunk: tuple[int, int], source: TfdsSource) -> Iterator[Item]:
    """The Items of records [start, stop) of the split."""
    _, data = _open_tfds(source.name, source.data_dir, source.split)
    start, stop = chunk
    for index in range(start, stop):
        try:
            record = data[index]
        except Exception:  # A corrupt record: counted, with the index as its id.
            item_id = f"{source.split}-{index:08d}"
            yield Item(
                id=item_id,
                audio_path=f"{TFDS_PREFIX}{index}",
                text=None,
                speaker=NO_SPEAKER,
                error=UNREADABLE_TFDS_RECORD,
                position=index,
            )
            continue
        yield tfds_item(record, index, source)


@register_reader("tfds")
def read_tfds(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """A prepared TFDS dataset (``--input name[:version]``, ``--tfds_data_dir``, ``--tfds_split``)
    stored as ``array_record``, read through ``builder.as_data_source`` without TensorFlow.

    The audio feature must be samples: ``tfds.features.Tensor`` of int16 (scaled by 1/32768),
    int32 (1/2**31) or float, shape (N,) or (N, C). ``tfds.features.Audio`` works only where
    TensorFlow is installed: TFDS builds a TensorFlow decoder for it as soon as the dataset's
    features are loaded (checked with tensorflow-datasets 4.9.10), so without TensorFlow such a
    dataset fails with a PrepareError saying so. The sample rate comes from
    ``--tfds_sample_rate``, else the feature's ``sample_rate`` (Audio features have one).

    Records are listed in chunks of index ranges; each item carries only ``tfds:<index>``, and
    the loader reads the record again for its audio. Reading the audio twice is the price of
    keeping items small through Beam's shuffle (an item with its audio would carry the whole
    corpus through it).
    """
    source = tfds_source(cfg)
    chunks = [
        (start, min(start + TFDS_RECORDS_PER_CHUNK, source.num_records))
        for start in range(0, source.num_records, TFDS_RECORDS_PER_CHUNK)
    ]
    return (
        p
        | "TfdsChunks" >> beam.Create(chunks)
        | "ReadTfds" >> beam.FlatMap(read_tfds_chunk, source=source)
    )


def tfds_audio_to_float(samples: np.ndarray) -> np.ndarray:
    """TFDS audio samples (N,) or (N, C), int16/int32/float -> (N, C) float32 in [-1, 1].

    Raises:
      AudioError(UNDECODABLE_AUDIO): another rank or dtype.
    """
    samples = np.asarray(samples)
    if samples.ndim == 1:
        samples = samples[:, None]
    if samples.ndim != 2:
        raise AudioError(UNDECODABLE_AUDIO, f"audio of shape {samples.shape}")
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / np.float32(32768.0)
    if samples.dtype == np.int32:
        return (samples.astype(np.float64) / 2.0**31).astype(np.float32)
    if np.issubdtype(samples.dtype, np.floating):
        return samples.astype(np.float32)
    raise AudioError(UNDECODABLE_AUDIO, f"audio of dtype {samples.dtype}")


# ---------------------------------------------------------------------------------------------
# Audio loading
# ---------------------------------------------------------------------------------------------


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


def fix_streamed_wav(data: bytes) -> bytes:
    """Makes a WAV written to a pipe readable in full.

    A writer that cannot seek back leaves a placeholder in the data chunk's size; libsndfile
    copes with a too-large one but reads a size of 0 as no samples at all. Like Kaldi's own
    reader for pipes, take the samples to be everything after the data chunk's header. Other
    bytes are returned unchanged.
    """
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return data
    pos = 12
    while pos + 8 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos + 4)
        if data[pos : pos + 4] == b"data":
            actual = len(data) - pos - 8
            if size != 0 or actual == 0:
                return data
            fixed = bytearray(data)
            struct.pack_into("<I", fixed, pos + 4, actual)
            struct.pack_into("<I", fixed, 4, len(data) - 8)
            return bytes(fixed)
        pos += 8 + size + (size & 1)  # Chunks are padded to an even size.
    return data


def load_pipe_audio(command: str, timeout_s: float = PIPE_TIMEOUT_S) -> tuple[np.ndarray, int]:
    """Runs a wav.scp shell command and decodes its stdout: ((N, C) float32, sample_rate).

    The command gets its own process group, killed whole on timeout: ``subprocess.run`` kills
    only the shell, and a still-running ``sox`` holding stdout would block it forever.

    Raises:
      AudioError(PIPE_FAILED): a non-zero exit status or a timeout (stderr's tail in the
        message).
      AudioError(UNDECODABLE_AUDIO): stdout is not a sound file.
    """
    import signal

    import soundfile as sf

    try:
        proc = subprocess.Popen(
            command,
            shell=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise AudioError(PIPE_FAILED, f"{command!r}: {e}") from e
    with proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AudioError(PIPE_FAILED, f"{command!r} timed out after {timeout_s} s") from e
    if proc.returncode != 0:
        tail = stderr.decode("utf-8", "replace").strip()[-500:]
        raise AudioError(PIPE_FAILED, f"{command!r} exited with {proc.returncode}: {tail}")
    try:
        audio, rate = sf.read(io.BytesIO(fix_streamed_wav(stdout)), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises several types for undecodable input.
        raise AudioError(UNDECODABLE_AUDIO, f"output of {command!r}: {e}") from e
    return audio, int(rate)


def load_tfds_audio(index: int, source: TfdsSource) -> tuple[np.ndarray, int]:
    """Record ``index``'s audio: ((N, C) float32, sample_rate).

    Raises:
      AudioError: no such record (missing_audio), an unreadable record, or samples of another
        rank or dtype (undecodable_audio).
    """
    if not 0 <= index < source.num_records:
        raise AudioError(MISSING_AUDIO, f"no record {index} in {source.name}/{source.split}")
    _, data = _open_tfds(source.name, source.data_dir, source.split)
    try:
        record = data[index]
    except Exception as e:  # Whatever the array_record/proto layers raise for a bad record.
        raise AudioError(UNREADABLE_TFDS_RECORD, f"record {index}: {e}") from e
    return tfds_audio_to_float(record[source.audio_key]), source.sample_rate


def load_item_audio(item: Item, cfg: Any) -> tuple[np.ndarray, int]:
    """An item's audio as ((N, C) float32, sample_rate), cut to its segment.

    ``pipe:`` runs the command only when ``cfg.allow_pipes`` (whatever the reader did);
    ``tfds:<index>`` reads the record from the dataset ``cfg`` names; anything else is a file.

    Raises:
      AudioError: with the skip reason (missing, undecodable, pipe_not_allowed, pipe_failed...).
    """
    source = item.audio_path
    if source.startswith(PIPE_PREFIX):
        if not getattr(cfg, "allow_pipes", False):
            raise AudioError(PIPE_NOT_ALLOWED, f"{source!r} needs --allow_pipes")
        audio, rate = load_pipe_audio(source[len(PIPE_PREFIX) :])
    elif source.startswith(TFDS_PREFIX):
        try:
            index = int(source[len(TFDS_PREFIX) :])
        except ValueError as e:
            raise AudioError(MISSING_AUDIO, f"bad TFDS reference {source!r}") from e
        audio, rate = load_tfds_audio(index, tfds_source(cfg))
    else:
        try:
            if (item.start != 0.0 or item.end is not None) and not _is_remote(source):
                return load_file_segment(source, item.start, item.end)
            audio, rate = load_audio_file(source)
        except AudioError:
            raise
        except FileNotFoundError as e:
            raise AudioError(MISSING_AUDIO, str(e)) from e
        except Exception as e:  # libsndfile raises several types for undecodable input.
            raise AudioError(UNDECODABLE_AUDIO, str(e)) from e
    return cut_segment(audio, rate, item.start, item.end), rate


def load_file_segment(path: str, start: float, end: float | None) -> tuple[np.ndarray, int]:
    """A segment of a local file, read by seeking: ((N, C) float32, sample_rate), the same
    samples as ``cut_segment`` of the whole file.

    Kaldi segments cut many utterances out of long recordings (an hour, hundreds of segments):
    decoding the whole recording for each would cost hundreds of times its size. Formats
    libsndfile cannot seek in are decoded whole and cut.

    Raises:
      FileNotFoundError: no such file.
      AudioError(SEGMENT_OUT_OF_RANGE): see cut_segment.
      Exception: anything libsndfile cannot decode.
    """
    import soundfile as sf

    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    with sf.SoundFile(path) as f:
        rate = int(f.samplerate)
        if not f.seekable():
            audio = f.read(dtype="float32", always_2d=True)
            return cut_segment(audio, rate, start, end), rate
        first, last = segment_bounds(f.frames, rate, start, end)
        f.seek(first)
        return f.read(last - first, dtype="float32", always_2d=True), rate


def segment_bounds(n: int, rate: int, start: float, end: float | None) -> tuple[int, int]:
    """Sample range [first, last) of segment [start, end) seconds within n samples.

    Raises:
      AudioError(SEGMENT_OUT_OF_RANGE): the segment starts after the audio ends, or ends
        more than one frame (10 ms) past it (Kaldi's own tolerance for rounded times).
    """
    first = int(round(start * rate))
    last = n if end is None else int(round(end * rate))
    if first >= n or last > n + int(0.01 * rate) or last <= first:
        raise AudioError(
            SEGMENT_OUT_OF_RANGE,
            f"segment [{start}, {end}] s outside audio of {n / rate:.3f} s",
        )
    return first, min(last, n)


def cut_segment(audio: np.ndarray, rate: int, start: float, end: float | None) -> np.ndarray:
    """Samples [round(start * rate), round(end * rate)) of (N, C) audio.

    Raises:
      AudioError(SEGMENT_OUT_OF_RANGE): see segment_bounds.
    """
    if start == 0.0 and end is None:
        return audio
    first, last = segment_bounds(audio.shape[0], rate, start, end)
    return audio[first:last]
