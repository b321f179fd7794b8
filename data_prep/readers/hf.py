"""The ``hf`` reader: Hugging Face datasets, read with pyarrow (no ``datasets`` at run time).

``--input`` is a directory written by ``Dataset.save_to_disk`` (its ``state.json`` names the
Arrow files), or parquet files (one file, a directory of ``*.parquet``, or a glob; the
layout ``datasets`` pushes to the Hub). The audio column (``--hf_audio_column``) holds
HF's Audio storage, a struct of ``bytes`` (the encoded file) and ``path``; ``datasets``
embeds local files' bytes when it saves, so a row without bytes has no audio (skipped and
counted as missing). Transcript, speaker and id come from
``--hf_text_column``, ``--hf_speaker_column`` and ``--hf_id_column`` (the last two where
the table has them; ids default to ``<file stem>-<row>``).

Listing reads only the small columns; an item points at its row
(``hf:<file>#<row>``) and :func:`load_row_audio` reads that row's audio later (a parquet
row group at a time, the last few kept per worker).
"""

from __future__ import annotations

import functools
import json
import posixpath
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
from data_prep.readers.textfiles import is_remote, match_files

HF_PREFIX = "hf:"


def data_files(source: str) -> list[str]:
    """The Arrow or parquet files of ``--input``, in order.

    Raises:
      PrepareError: nothing to read.
    """
    state = posixpath.join(source, "state.json")
    if FileSystems.exists(state):  # Dataset.save_to_disk
        with FileSystems.open(state) as f:
            names = [d["filename"] for d in json.load(f).get("_data_files", [])]
        if not names:
            raise PrepareError(f"{state} names no data files")
        return [posixpath.join(source, n) for n in names]
    found = match_files(source, "*.parquet")
    if not found:
        raise PrepareError(
            f"no Hugging Face dataset at {source}: expected a save_to_disk directory "
            "(state.json) or parquet files"
        )
    return found


def _open(path: str):
    """A local path as itself (pyarrow opens it), anything else as a file object."""
    return path if not is_remote(path) else FileSystems.open(path)


def _arrow_stream(path: str):
    """A reader of an Arrow stream file (save_to_disk's), memory-mapped where local."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(path) if not is_remote(path) else _open(path))


def read_table(path: str, columns: list[str] | None = None):
    """A pyarrow Table of an Arrow stream file (save_to_disk) or a parquet file."""
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return pq.read_table(_open(path), columns=columns)
    table = _arrow_stream(path).read_all()
    return table if columns is None else table.select(columns)


def _columns(path: str) -> list[str]:
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        return list(pq.read_schema(_open(path)).names)
    return list(_arrow_stream(path).schema.names)


def check_columns(path: str, cfg: Any) -> list[str]:
    """The columns to list, with the audio and text columns required.

    Raises:
      PrepareError: a required column is missing (one line naming the columns there are).
    """
    names = _columns(path)
    for flag, column in (
        ("hf_audio_column", cfg.hf_audio_column),
        ("hf_text_column", cfg.hf_text_column),
    ):
        if column not in names:
            raise PrepareError(f"{path} has no column {column!r} (--{flag}); it has {names}")
    return names


def read_file(indexed: tuple[int, str], cfg: Any) -> Iterator[Item]:
    """The Items of one data file (index, path): one per row."""
    index, path = indexed
    names = check_columns(path, cfg)
    optional = [c for c in (cfg.hf_speaker_column, cfg.hf_id_column) if c and c in names]
    table = read_table(path, [cfg.hf_text_column, *optional])
    # Which rows have audio bytes (a null struct has none: flatten() folds the struct's
    # own nulls into its fields); the bytes are read when the row is decoded.
    audio = read_table(path, [cfg.hf_audio_column]).column(0).combine_chunks()
    has_bytes = audio.flatten()[audio.type.get_field_index("bytes")].is_valid().to_pylist()
    stem = posixpath.splitext(posixpath.basename(path))[0]
    for row, (values, ok) in enumerate(zip(table.to_pylist(), has_bytes)):
        item_id = values.get(cfg.hf_id_column)
        speaker = values.get(cfg.hf_speaker_column)
        text = values.get(cfg.hf_text_column)
        yield Item(
            id=str(item_id) if item_id not in (None, "") else f"{stem}-{row:08d}",
            audio_path=f"{HF_PREFIX}{path}#{row}" if ok else "",
            text=text if isinstance(text, str) else None,
            speaker=NO_SPEAKER if speaker in (None, "") else str(speaker),
            error=None if ok else MISSING_AUDIO,
            position=index * FILE_STRIDE + row,
        )


@functools.lru_cache(maxsize=4)
def _row_group(path: str, column: str, group: int) -> tuple[int, Any]:
    """(first row, the audio column's values) of a parquet row group, or of a whole Arrow
    file (group 0)."""
    import pyarrow.parquet as pq

    if not path.endswith(".parquet"):
        return 0, read_table(path, [column]).column(0).combine_chunks()
    pf = pq.ParquetFile(_open(path))
    first = sum(pf.metadata.row_group(g).num_rows for g in range(group))
    return first, pf.read_row_group(group, columns=[column]).column(0).combine_chunks()


def _group_of(path: str, row: int) -> int:
    """The parquet row group holding `row` (0 for an Arrow file)."""
    import pyarrow.parquet as pq

    if not path.endswith(".parquet"):
        return 0
    meta = pq.ParquetFile(_open(path)).metadata
    end = 0
    for g in range(meta.num_row_groups):
        end += meta.row_group(g).num_rows
        if row < end:
            return g
    raise IndexError(row)


def load_row_audio(reference: str, column: str) -> tuple[np.ndarray, int]:
    """Decodes the audio bytes of row ``<file>#<row>``: ((N, C) float32, rate).

    Raises:
      AudioError(MISSING_AUDIO): the file or the row is not there.
      Exception: anything libsndfile cannot decode.
    """
    path, _, row_text = reference.rpartition("#")
    try:
        row = int(row_text)
        first, values = _row_group(path, column, _group_of(path, row))
        data = values.field("bytes")[row - first].as_py()
    except (OSError, ValueError, IndexError) as e:
        raise AudioError(MISSING_AUDIO, f"{reference}: {e}") from e
    if not data:
        raise AudioError(MISSING_AUDIO, f"{reference}: no audio bytes")
    return decode_audio_bytes(data)


@register_reader("hf")
def read_hf(p: beam.Pipeline, cfg: Any) -> beam.PCollection:
    """Hugging Face datasets (see the module docstring); one Beam element per data file."""
    files = data_files(cfg.input)
    check_columns(files[0], cfg)  # a wrong column name is one line before the pipeline runs
    return (
        p
        | "HfFiles" >> beam.Create(list(enumerate(files)))
        | "ReadHfFiles" >> beam.FlatMap(read_file, cfg=cfg)
    )
