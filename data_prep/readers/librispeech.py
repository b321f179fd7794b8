"""The ``librispeech`` reader: a LibriSpeech split directory,
``SPK/CHAPTER/SPK-CHAPTER-UTT.flac`` + ``SPK/CHAPTER/SPK-CHAPTER.trans.txt``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import MISSING_TRANSCRIPT, Item, PrepareError, register_reader
from data_prep.readers.textfiles import (
    file_names,
    is_dir,
    is_remote,
    line_error,
    local_path,
    parse_transcript_line,
    read_bytes,
)

# Skip reason (a key of prep_report.json["skipped"]).
MALFORMED_TRANSCRIPT = "malformed_transcript_line"  # LibriSpeech *.trans.txt.

LIBRISPEECH_AUDIO_EXT = ".flac"
LIBRISPEECH_TRANSCRIPT_EXT = ".trans.txt"


def librispeech_chapters(root: str) -> list[str]:
    """The SPK/CHAPTER directories under a LibriSpeech split directory, sorted.

    Runs in the launcher; only two directory levels are listed (~2,500 chapters for all 960 h),
    the files inside chapters are listed by the workers.
    """
    if is_remote(root):
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
    names = file_names(chapter_dir)
    flacs = {
        n[: -len(LIBRISPEECH_AUDIO_EXT)]: n for n in names if n.endswith(LIBRISPEECH_AUDIO_EXT)
    }
    named: set[str] = set()
    for trans_name in (n for n in names if n.endswith(LIBRISPEECH_TRANSCRIPT_EXT)):
        data = read_bytes(FileSystems.join(chapter_dir, trans_name))
        for line_no, line in enumerate(data.split(b"\n"), start=1):
            parsed = parse_transcript_line(line)
            if parsed is None:
                continue
            utt, text = parsed
            valid_id = utt is not None and "/" not in utt and utt not in (".", "..")
            if valid_id:
                named.add(utt)  # Even with a bad transcript: its flac is accounted for.
            if not valid_id or text is None:
                yield line_error(trans_name, line_no, MALFORMED_TRANSCRIPT, speaker)
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
    root = local_path(cfg.input)
    if not is_dir(root):
        raise PrepareError(f"LibriSpeech directory not found: {root}")
    chapters = librispeech_chapters(root)
    # A cheap sanity check of the layout (one listing): the usual mistake is passing the
    # LibriSpeech/ directory itself, whose SPK/CHAPTER level is really SPLIT/SPK.
    if not chapters or not any(
        n.endswith((LIBRISPEECH_AUDIO_EXT, LIBRISPEECH_TRANSCRIPT_EXT))
        for n in file_names(chapters[0])
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
