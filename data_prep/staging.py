"""Staged output: fresh hidden directories next to the final ones, replaced whole when
complete, and the small JSON files through which the pipeline hands results to the launcher."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from data_prep.readers.common import PrepareError
from jaxspeech.common import files


def write_json(value: Any, path: str) -> None:
    """Writes one element as JSON (the pipeline's hand-off of small results to the launcher)."""
    files.atomic_write(path, json.dumps(value))


def read_json(path: str) -> Any:
    """One JSON file written by :func:`write_json`."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_shard_meta(meta: dict[str, Any], parts_dir: str) -> None:
    """Hands one shard's metadata to the launcher (one small file per shard)."""
    write_json(meta, os.path.join(parts_dir, f"shard-{meta['shard']:05d}.json"))


def staging_path(output: str, name: str) -> str:
    """A fresh hidden directory next to the final one (same filesystem: rename works)."""
    return os.path.join(output, f".{name}.staging-{uuid.uuid4().hex[:8]}")


def make_dirs(staging: str, subdirs: tuple[str, ...] = ()) -> str:
    """Creates ``staging`` and its ``subdirs``; returns ``staging``.

    Raises:
      PrepareError: the output directory is not writable (or ``staging`` exists).
    """
    try:
        for sub in ("", *subdirs):
            os.makedirs(os.path.join(staging, sub))
    except OSError as e:
        output = os.path.dirname(staging)
        raise PrepareError(f"output directory {output} is not writable: {e}") from e
    return staging


def replace_dir(staging: str, final: str) -> None:
    """Moves ``staging`` to ``final``, replacing (never merging with) what was there."""
    files.replace_dir(staging, final)
