"""The ``kaldi`` reader: a Kaldi data directory (``wav.scp``, ``text``, optional ``utt2spk``
and ``segments``), and the loader of its ``pipe:`` audio (wav.scp entries that are commands)."""

from __future__ import annotations

import io
import math
import os
import re
import struct
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import (
    MISSING_TRANSCRIPT,
    NO_SPEAKER,
    UNDECODABLE_AUDIO,
    AudioError,
    Item,
    PrepareError,
    register_reader,
)
from data_prep.readers.pipes import (
    PIPE_NOT_IN_FORMAT,
    PIPE_PREFIX,
    PIPE_SHELL_SYNTAX,
    PipelineError,
    parse_pipeline,
    run_pipeline,
)
from data_prep.readers.textfiles import (
    is_dir,
    is_remote,
    line_chunks,
    line_error,
    local_path,
    parse_transcript_line,
    read_line_chunk,
    split_key,
)

KALDI_LINES_PER_CHUNK = 20_000  # Kaldi lines are short (~100 bytes): bigger chunks.
PIPE_TIMEOUT_S = 300.0  # A wav.scp command that decodes one recording; minutes means stuck.

# Skip reasons (keys of prep_report.json["skipped"]).
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
PIPE_FAILED = "pipe_failed"  # A command that could not start, exited non-zero or timed out.

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

    ``command |`` is a pipe whose stdout is the audio: ``pipe:command``, refused
    (``pipe_not_allowed``) unless ``allow_pipes``, and run without a shell (readers/pipes.py).
    Kaldi's other extended forms, ``-`` (stdin) and ``file:offset`` (a byte offset into an
    archive), are ``unsupported_wav_scp_entry``. Anything else is a path (it may contain
    spaces); a relative one is resolved against ``base_dir``, and one that starts with
    ``pipe:`` (a command only with ``|``) is ``pipe_not_in_format``.
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
    if value.startswith(PIPE_PREFIX):  # kaldi_items marks only "|" commands as pipes
        return value, PIPE_NOT_IN_FORMAT
    if is_remote(value) or os.path.isabs(value):
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
        yield beam.pvalue.TaggedOutput(_ERRORS, line_error("text", line_no, MALFORMED_TEXT))
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
        yield beam.pvalue.TaggedOutput(_ERRORS, line_error("wav.scp", line_no, MALFORMED_WAV_SCP))
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
        yield beam.pvalue.TaggedOutput(_ERRORS, line_error("segments", line_no, MALFORMED_SEGMENTS))
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
        yield beam.pvalue.TaggedOutput(_ERRORS, line_error("utt2spk", line_no, MALFORMED_UTT2SPK))
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
        item = line_error("wav.scp", extra.line, DUPLICATE_WAV_SCP)
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
        yield line_error(extra.source, extra.line, _DUPLICATE_REASON[extra.source])
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
                pipe=audio.path.startswith(PIPE_PREFIX),
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
            # A wav.scp command (parse_wav_scp_value gives any other "pipe:" an error).
            pipe=path.startswith(PIPE_PREFIX),
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
    data_dir = local_path(cfg.input)
    if not is_dir(data_dir):
        raise PrepareError(f"Kaldi data directory not found: {data_dir}")
    paths = {n: FileSystems.join(data_dir, n) for n in ("text", "wav.scp", "utt2spk", "segments")}
    for name in ("text", "wav.scp"):
        if not FileSystems.exists(paths[name]):
            raise PrepareError(
                f"{paths[name]} not found (a Kaldi data directory needs text and wav.scp)"
            )
    has_segments = FileSystems.exists(paths["segments"])

    def numbered_lines(name: str, label: str, on_line: Any = None) -> beam.PCollection:
        chunks = line_chunks(paths[name], KALDI_LINES_PER_CHUNK, on_line)
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
    """Runs a wav.scp command (``a | b``, no shell: readers/pipes.py) and decodes its
    stdout: ((N, C) float32, sample_rate).

    Raises:
      AudioError(PIPE_SHELL_SYNTAX): a command only a shell could run (``;``, ``$(...)``,
        a redirection...).
      AudioError(PIPE_FAILED): a program that cannot be started, a non-zero exit status
        or a timeout (stderr's tail in the message).
      AudioError(UNDECODABLE_AUDIO): stdout is not a sound file.
    """
    import soundfile as sf

    try:
        stages = parse_pipeline(command)
    except ValueError as e:
        raise AudioError(PIPE_SHELL_SYNTAX, f"{command!r}: {e}") from e
    try:
        stdout = run_pipeline(stages, timeout_s)
    except PipelineError as e:
        raise AudioError(PIPE_FAILED, f"{command!r}: {e}") from e
    try:
        audio, rate = sf.read(io.BytesIO(fix_streamed_wav(stdout)), dtype="float32", always_2d=True)
    except Exception as e:  # libsndfile raises several types for undecodable input.
        raise AudioError(UNDECODABLE_AUDIO, f"output of {command!r}: {e}") from e
    return audio, int(rate)
