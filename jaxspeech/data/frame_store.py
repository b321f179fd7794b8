"""Per-utterance frame arrays keyed by utterance id, in one .npz file: what one model
computes over a prepared split for another to read (a synthesizer's ground-truth-aligned
log-mel for a vocoder: `jaxspeech.tts.gta` writes it, `jaxspeech.vocoder.batch` reads it).

The file is a plain NumPy .npz (a zip of .npy members, uncompressed): one float16 (T_i, M)
member per utterance, named by its id, and `MANIFEST`, a 0-d string array holding the JSON
of what made it. Members are written one at a time (a split's frames need not fit in
memory) to a temporary name beside the file, which is renamed over it at the end
(`common.files.atomic_open`): a reader never sees half a file, and two writers of one
path leave one whole file. Reading opens the file lazily in each process (a loader
worker pickles the path, not the open file) and loads one member per `get`.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterable

import numpy as np

from jaxspeech.common import files

MANIFEST = "__manifest__"
# The manifest's "kind" of a synthesizer's ground-truth-aligned raw log-mel (written by
# `jaxspeech.tts.gta`, read as a vocoder's input by `jaxspeech.vocoder.gta`).
GTA_LOG_MEL = "gta_log_mel"
DTYPE = np.float16  # the log-mel's few nepers of range: 3 significant digits are plenty


def write_frame_store(path: str, frames: Iterable[tuple[str, np.ndarray]], manifest: dict) -> int:
    """Writes `frames` ((id, (T, M) array) pairs, streamed) and `manifest` to `path` (a
    .npz), atomically; returns how many utterances it holds.

    Raises:
      ValueError: an id given twice, or one that is empty or names the manifest.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    seen: set[str] = set()
    with files.atomic_open(path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
        for utt, array in frames:
            if not utt or utt == MANIFEST or utt in seen:
                raise ValueError(f"frame store {path}: bad or repeated utterance id {utt!r}")
            seen.add(utt)
            with zf.open(f"{utt}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array, DTYPE))
        with zf.open(f"{MANIFEST}.npy", "w") as member:
            np.lib.format.write_array(member, np.asarray(json.dumps(manifest, sort_keys=True)))
    return len(seen)


class FrameStore:
    """A frame store's file opened for reading (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self._npz, self._ids = None, frozenset()

    def _open(self):
        if self._npz is None:
            self._npz = np.load(self.path, allow_pickle=False)
            self._ids = frozenset(self._npz.files) - {MANIFEST}
        return self._npz

    def __getstate__(self) -> dict:  # a worker process opens its own handle
        return {"path": self.path, "_npz": None, "_ids": frozenset()}

    @property
    def manifest(self) -> dict:
        return json.loads(str(self._open()[MANIFEST]))

    def ids(self) -> list[str]:
        self._open()
        return sorted(self._ids)

    def get(self, utt: str) -> np.ndarray | None:
        """The utterance's (T, M) float32 frames, or None when the store has none."""
        npz = self._open()
        if utt not in self._ids:
            return None
        return npz[utt].astype(np.float32)
