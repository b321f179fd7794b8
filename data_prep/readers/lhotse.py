"""The ``lhotse`` reader: Lhotse manifests (icefall's data), read as JSON lines.

``--input`` is one of:

- a CutSet (``cuts*.jsonl.gz``): one item per ``MonoCut``/``MultiCut``, its span of the
  recording and channel(s), the transcript the cut's supervisions' texts in time order;
- a RecordingSet with its SupervisionSet (``--lhotse_supervisions``; by default the file
  named like ``--input`` with "recordings" replaced by "supervisions"): one item per
  supervision segment, its span and channel(s) of its recording.

Files may be gzipped (``.gz``) or plain, local or Beam filesystem URLs. The manifests are
parsed as JSON, not with the ``lhotse`` package (which imports PyTorch). Relative audio
paths are relative to ``--lhotse_audio_root``, by default the current directory (where
Lhotse resolves them). Audio sources: ``file``; ``url`` with a Beam filesystem scheme
(``gs://``, ``s3://``); ``command`` as a Kaldi pipe (with ``--allow_pipes``, no shell:
readers/pipes.py). A channel list is averaged, as every multi-channel input is.

Skipped and counted, with the shared reasons where they apply: a line that is not a
manifest entry, a duplicated recording id, a supervision of an unknown recording, a
negative start or a duration <= 0, a channel the recording lacks, a cut without
supervisions, a mixed or padding cut, a recording with transforms (Lhotse's speed
perturbation or resampling on load: jaxspeech perturbs speed in its own loader), and
sources it cannot read (in-memory, Lhotse Shar, http).
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from data_prep.readers.common import (
    BAD_SEGMENT,
    CHANNEL_OUT_OF_RANGE,
    FILE_STRIDE,
    MISSING_TRANSCRIPT,
    NO_SPEAKER,
    Item,
    PrepareError,
    finite_number,
    register_reader,
)
from data_prep.readers.pipes import PIPE_NOT_IN_FORMAT, PIPE_PREFIX
from data_prep.readers.textfiles import is_remote, local_path

# Skip reasons (keys of prep_report.json["skipped"]).
MALFORMED = "malformed_lhotse_line"  # not JSON, not an object, or fields of the wrong type
DUPLICATE_RECORDING = "duplicate_recording_id"  # a later recording with a seen id
UNKNOWN_RECORDING = "unknown_recording"  # a supervision whose recording is not listed
UNSUPPORTED_CUT = "unsupported_lhotse_cut"  # MixedCut, PaddingCut
UNSUPPORTED_TRANSFORM = "unsupported_lhotse_transform"  # speed perturbation, resampling
UNSUPPORTED_SOURCE = "unsupported_audio_source"  # memory, shar, http(s), split channels

CUT_TYPES = ("MonoCut", "MultiCut")


def read_json_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or None where a line is not JSON) of a ``.jsonl`` or
    ``.jsonl.gz`` manifest, blank lines left out."""
    with FileSystems.open(path) as f:  # AUTO compression: .gz is decompressed
        # Beam's decompressing file has readline() but is not iterable.
        for line_no, line in enumerate(iter(f.readline, b""), start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                yield line_no, None


def _error(name: str, line_no: int, reason: str, file_index: int, item_id: str = "") -> Item:
    position = file_index * FILE_STRIDE + line_no
    return Item(item_id or f"{name}:{line_no}", "", None, NO_SPEAKER, reason, position)


def _channels(value: Any) -> tuple[int, ...] | None:
    """A supervision's or cut's ``channel`` (an int or a list of ints) as a tuple; None
    when it is neither."""
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(c, bool) or not isinstance(c, int) for c in values):
        return None
    return tuple(values)


def audio_source(
    recording: dict, channels: tuple[int, ...], root: str
) -> tuple[str, tuple[int, ...]] | str:
    """Where ``channels`` of a Lhotse recording are: (``Item.audio_path``, the columns of
    the decoded file), or a skip reason.

    A recording lists sources, each a file (or URL or command) holding some of its
    channels; the channels asked for must all be in one source.
    """
    if recording.get("transforms"):
        return UNSUPPORTED_TRANSFORM
    sources = recording.get("sources")
    if not isinstance(sources, list) or not sources:
        return MALFORMED
    for source in sources:
        if not isinstance(source, dict) or not isinstance(source.get("channels"), list):
            return MALFORMED
    holding = [s for s in sources if set(channels) <= set(s["channels"])]
    if not holding:
        anywhere = {c for s in sources for c in s["channels"]}
        return UNSUPPORTED_SOURCE if set(channels) <= anywhere else CHANNEL_OUT_OF_RANGE
    source = holding[0]
    kind, where = source.get("type"), source.get("source")
    if not isinstance(where, str) or not where:
        return MALFORMED
    if kind in ("file", "url") and where.startswith(PIPE_PREFIX):
        return PIPE_NOT_IN_FORMAT  # a name, not a command: _utterance marks only commands
    if kind == "file":
        path = where if is_remote(where) or os.path.isabs(where) else os.path.join(root, where)
    elif kind == "url" and is_remote(where) and not where.startswith(("http://", "https://")):
        path = where
    elif kind == "command":
        path = PIPE_PREFIX + where  # its stdout is a sound file, as a Kaldi pipe's
    else:
        return UNSUPPORTED_SOURCE
    return path, tuple(source["channels"].index(c) for c in channels)


def _span(start: Any, duration: Any) -> tuple[float, float] | None:
    """(start, end) seconds; None for a start < 0, a duration <= 0, or non-numbers."""
    s, d = finite_number(start), finite_number(duration)
    if s is None or d is None or s < 0 or d <= 0:
        return None
    return s, s + d


def _utterance(
    item_id: str,
    recording: dict,
    span: Any,
    channel: Any,
    text: Any,
    speaker: Any,
    position: int,
    root: str,
) -> Item:
    """One item: ``span`` of ``recording``'s ``channel`` (or the skip reason that stops it)."""
    bad = Item(item_id, "", None, NO_SPEAKER, MALFORMED, position)
    channels = _channels(channel)
    if channels is None or (text is not None and not isinstance(text, str)):
        return bad
    if span is None:
        return bad._replace(error=BAD_SEGMENT)
    where = audio_source(recording, channels, root)
    if isinstance(where, str):
        return bad._replace(error=where)
    path, columns = where
    return Item(
        id=item_id,
        audio_path=path,
        text=text,
        speaker=NO_SPEAKER if speaker in (None, "") else str(speaker),
        position=position,
        start=span[0],
        end=span[1],
        channels=columns,
        pipe=path.startswith(PIPE_PREFIX),  # a command source (audio_source)
    )


def cut_item(cut: Any, line_no: int, name: str, root: str, file_index: int = 0) -> Item:
    """The Item of one line of a CutSet manifest."""
    position = file_index * FILE_STRIDE + line_no
    if not isinstance(cut, dict) or not isinstance(cut.get("id"), str) or not cut["id"]:
        return _error(name, line_no, MALFORMED, file_index)
    cut_id = cut["id"]
    if cut.get("type") not in CUT_TYPES or not isinstance(cut.get("recording"), dict):
        known = cut.get("type") in ("MixedCut", "PaddingCut") or "tracks" in cut
        return _error(name, line_no, UNSUPPORTED_CUT if known else MALFORMED, file_index, cut_id)
    sups = cut.get("supervisions")
    if not isinstance(sups, list) or not all(isinstance(s, dict) for s in sups):
        return _error(name, line_no, MALFORMED, file_index, cut_id)
    if not sups:
        return _error(name, line_no, MISSING_TRANSCRIPT, file_index, cut_id)
    texts = [s.get("text") for s in sorted(sups, key=lambda s: finite_number(s.get("start")) or 0)]
    if not all(isinstance(t, str) for t in texts):
        return _error(name, line_no, MALFORMED, file_index, cut_id)
    text = " ".join(t.strip() for t in texts if t.strip())
    span = _span(cut.get("start"), cut.get("duration"))
    speaker = sups[0].get("speaker")
    return _utterance(
        cut_id, cut["recording"], span, cut.get("channel"), text, speaker, position, root
    )


def read_cuts(path: str, root: str) -> Iterator[Item]:
    """The Items of a CutSet manifest, in line order."""
    name = posixpath.basename(path)
    for line_no, cut in read_json_lines(path):
        yield cut_item(cut, line_no, name, root)


def keyed_recordings(path: str) -> Iterator[tuple[str, Any]]:
    """(recording id, (line number, recording)) per line; a malformed line is keyed by its
    own place so that it is reported rather than joined."""
    name = posixpath.basename(path)
    for line_no, rec in read_json_lines(path):
        if isinstance(rec, dict) and isinstance(rec.get("id"), str) and rec["id"]:
            yield rec["id"], (line_no, rec)
        else:
            yield f"\0{name}:{line_no}", (line_no, None)


def keyed_supervisions(path: str) -> Iterator[tuple[str, Any]]:
    """(recording id, (line number, supervision)) per line, as keyed_recordings."""
    name = posixpath.basename(path)
    for line_no, sup in read_json_lines(path):
        if isinstance(sup, dict) and isinstance(sup.get("recording_id"), str):
            yield sup["recording_id"], (line_no, sup)
        else:
            yield f"\0{name}:{line_no}", (line_no, None)


def join_recording(
    joined: tuple[str, dict[str, Iterable]], names: tuple[str, str], root: str
) -> Iterator[Item]:
    """The Items of one recording id's supervisions, and one skipped item per extra
    recording of the same id or malformed line (recordings file 0, supervisions file 1)."""
    _, groups = joined
    recs, sups = sorted(groups["recordings"]), sorted(groups["supervisions"])
    recording = None
    for line_no, rec in recs:
        if rec is None:
            yield _error(names[0], line_no, MALFORMED, 0)
        elif recording is None:
            recording = rec
        else:
            yield _error(names[0], line_no, DUPLICATE_RECORDING, 0)
    for line_no, sup in sups:
        position = FILE_STRIDE + line_no
        sup_id = sup.get("id") if sup is not None else None
        if not isinstance(sup_id, str) or not sup_id:
            yield _error(names[1], line_no, MALFORMED, 1)
        elif recording is None:
            yield _error(names[1], line_no, UNKNOWN_RECORDING, 1, sup_id)
        else:
            span = _span(sup.get("start"), sup.get("duration"))
            yield _utterance(
                sup_id,
                recording,
                span,
                sup.get("channel", 0),
                sup.get("text"),
                sup.get("speaker"),
                position,
                root,
            )


def manifest_kind(path: str) -> str:
    """ "cuts", "recordings" or "supervisions", from the first entry of a manifest.

    Raises:
      PrepareError: the file is empty or its first entry is none of these.
    """
    for _, first in read_json_lines(path):
        if isinstance(first, dict):
            if first.get("type") in (*CUT_TYPES, "MixedCut", "PaddingCut"):
                return "cuts"
            if "sources" in first:
                return "recordings"
            if "recording_id" in first:
                return "supervisions"
        break
    raise PrepareError(
        f"{path}: not a Lhotse CutSet, RecordingSet or SupervisionSet manifest (JSON lines)"
    )


def _exists(path: str) -> bool:
    return FileSystems.exists(path) and (is_remote(path) or os.path.isfile(path))


def manifest_pair(path: str, other: str | None, kind: str) -> tuple[str, str]:
    """(recordings, supervisions) files: ``path`` of ``kind`` and ``other``, by default
    the file named like ``path`` with the other kind's name.

    Raises:
      PrepareError: the other file is not given and not found by its name.
    """
    want = "supervisions" if kind == "recordings" else "recordings"
    if other is None:
        directory, base = posixpath.split(path) if is_remote(path) else os.path.split(path)
        if kind not in base:
            raise PrepareError(
                f"{path} is a Lhotse {kind} manifest: name its {want} with --lhotse_supervisions"
            )
        other = FileSystems.join(directory, base.replace(kind, want))
    other = local_path(other)
    if not _exists(other):
        raise PrepareError(f"Lhotse {want} manifest not found: {other}")
    if kind == "recordings":
        return path, other
    return other, path


@register_reader("lhotse")
def read_lhotse(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """Lhotse manifests (see the module docstring)."""
    path = local_path(cfg.input)
    if not _exists(path):
        raise PrepareError(f"Lhotse manifest not found: {path}")
    root = os.path.abspath(cfg.lhotse_audio_root or os.getcwd())
    kind = manifest_kind(path)
    if kind == "cuts":
        return (
            p | "CutsFile" >> beam.Create([path]) | "ReadCuts" >> beam.FlatMap(read_cuts, root=root)
        )
    recordings, supervisions = manifest_pair(path, cfg.lhotse_supervisions, kind)
    names = (posixpath.basename(recordings), posixpath.basename(supervisions))
    recs = (
        p
        | "RecordingsFile" >> beam.Create([recordings])
        | "ReadRecordings" >> beam.FlatMap(keyed_recordings)
    )
    sups = (
        p
        | "SupervisionsFile" >> beam.Create([supervisions])
        | "ReadSupervisions" >> beam.FlatMap(keyed_supervisions)
    )
    return (
        {"recordings": recs, "supervisions": sups}
        | "JoinByRecording" >> beam.CoGroupByKey()
        | "Supervisions" >> beam.FlatMap(join_recording, names=names, root=root)
    )
