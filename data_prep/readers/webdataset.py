"""The ``webdataset`` reader: WebDataset tar shards, one sample per key.

A sample is the run of consecutive tar members sharing a key (the member name up to the
first dot of its base name, WebDataset's rule): an audio member (``flac``, ``wav``,
``mp3``, ``ogg``, ``opus``, ``sph``) and its transcript in a ``txt`` member or in the
``text`` field of a ``json`` member (whose optional ``speaker`` and ``id`` fields are used
too). ``--input`` is one ``.tar`` file, a directory of them, or a glob pattern (local or a
Beam filesystem URL such as ``gs://bucket/shards-*.tar``).

The audio is not copied while listing: an item points at its member's bytes inside the
shard (``wds:<shard>#<offset>:<size>``) and :func:`load_member_audio` reads exactly
those bytes later, so a shard is read once to list it and each member once to decode it.
Compressed tars (``.tar.gz``) have no such offsets and are refused with one line.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import (
    FILE_STRIDE,
    MISSING_AUDIO,
    NO_SPEAKER,
    AudioError,
    Item,
    PrepareError,
    decode_audio_bytes,
    register_reader,
)
from data_prep.readers.textfiles import match_files

WDS_PREFIX = "wds:"
AUDIO_EXTENSIONS = ("flac", "wav", "mp3", "ogg", "opus", "sph")

# Skip reasons (keys of prep_report.json["skipped"]).
UNREADABLE_SHARD = "unreadable_tar_shard"  # not a tar, or truncated: its rest is skipped
MALFORMED_SAMPLE = "malformed_webdataset_sample"  # a json member that is not an object
OVERSIZED_TEXT = "oversized_text_member"  # a txt or json member over MAX_TEXT_BYTES
# A sample's transcript and metadata are read into memory (its audio stays in the shard):
# members bigger than this (by their tar header) are not read. An utterance's are bytes
# to kilobytes; 1 MiB is a book.
MAX_TEXT_BYTES = 1 << 20


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's key and extension of a member name: "a/b.seg.flac" -> ("a/b", "seg.flac")."""
    directory, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return (posixpath.join(directory, stem) if directory else stem), ext if dot else ""


def shard_paths(pattern: str) -> list[str]:
    """The tar shards ``--input`` names, sorted: a file, a directory's ``*.tar``, or a glob.

    Raises:
      PrepareError: nothing matches, or a compressed tar.
    """
    found = match_files(pattern, "*.tar")
    if not found:
        raise PrepareError(f"no WebDataset shards match {pattern}")
    compressed = [p for p in found if not p.endswith(".tar")]
    if compressed:
        raise PrepareError(
            f"{compressed[0]}: only uncompressed .tar shards can be read in place (their "
            "members have byte offsets); decompress it first"
        )
    return found


def _sample_item(shard: str, key: str, members: dict, position: int) -> Item:
    """One sample's Item from its members {ext: (TarInfo, bytes or None)}."""
    meta: dict[str, Any] = {}
    if any(members[e][1] is None for e in ("json", "txt") if e in members):  # not read
        return Item(key, "", None, NO_SPEAKER, error=OVERSIZED_TEXT, position=position)
    if "json" in members:
        try:
            meta = json.loads(members["json"][1].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            meta = None  # type: ignore[assignment]
        if not isinstance(meta, dict):
            return Item(key, "", None, NO_SPEAKER, error=MALFORMED_SAMPLE, position=position)
    text = meta.get("text")
    if "txt" in members:
        text = members["txt"][1].decode("utf-8", errors="replace").strip()
    speaker = meta.get("speaker")
    item_id = meta["id"] if isinstance(meta.get("id"), str) and meta["id"] else key
    audio = next((members[e][0] for e in AUDIO_EXTENSIONS if e in members), None)
    path = "" if audio is None else f"{WDS_PREFIX}{shard}#{audio.offset_data}:{audio.size}"
    return Item(
        id=item_id,
        audio_path=path,
        text=text if isinstance(text, str) else None,
        speaker=NO_SPEAKER if speaker in (None, "") else str(speaker),
        error=None if audio is not None else MISSING_AUDIO,
        position=position,
    )


def read_shard(indexed: tuple[int, str]) -> Iterator[Item]:
    """The Items of shard (index, path), in member order."""
    index, shard = indexed
    name = posixpath.basename(shard)
    key, members, position = None, {}, index * FILE_STRIDE
    try:
        with FileSystems.open(shard, compression_type="uncompressed") as f:
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for info in tar:
                    if not info.isfile():
                        continue
                    k, ext = split_key(info.name)
                    if k != key and key is not None:
                        yield _sample_item(shard, key, members, position)
                        members, position = {}, position + 1
                    key = k
                    # Transcripts and metadata are read now; audio stays in the shard.
                    small = ext in ("txt", "json") and info.size <= MAX_TEXT_BYTES
                    members[ext] = (info, tar.extractfile(info).read() if small else None)
    except (tarfile.TarError, OSError) as e:
        yield Item(f"{name}:{type(e).__name__}", "", None, NO_SPEAKER, UNREADABLE_SHARD, position)
        return
    if key is not None:
        yield _sample_item(shard, key, members, position)


def load_member_audio(reference: str) -> tuple[np.ndarray, int]:
    """Decodes the audio bytes ``<shard>#<offset>:<size>`` points at: ((N, C), rate).

    Raises:
      AudioError(MISSING_AUDIO): the shard or the bytes are not there.
      Exception: anything libsndfile cannot decode.
    """
    shard, _, span = reference.rpartition("#")
    offset, _, size = span.partition(":")
    try:
        with FileSystems.open(shard, compression_type="uncompressed") as f:
            f.seek(int(offset))
            data = f.read(int(size))
    except (OSError, ValueError) as e:
        raise AudioError(MISSING_AUDIO, f"{reference}: {e}") from e
    if len(data) != int(size):
        raise AudioError(MISSING_AUDIO, f"{reference}: the shard ends early")
    return decode_audio_bytes(data)


@register_reader("webdataset")
def read_webdataset(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """WebDataset tar shards (see the module docstring); one Beam element per shard."""
    shards = shard_paths(cfg.input)
    return (
        p
        | "WebDatasetShards" >> beam.Create(list(enumerate(shards)))
        | "ReadShards" >> beam.FlatMap(read_shard)
    )
