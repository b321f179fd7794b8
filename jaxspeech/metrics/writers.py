"""Metric logging: TensorBoard event files (tensorboardX, no TensorFlow) on process 0.

Scalars, images (e.g. spectrograms from `jaxspeech.metrics.images`) and
markdown text (e.g. reference vs hypothesis transcripts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import jax
import numpy as np


class MetricWriter:
    """Writes scalars, images and text to `<logdir>` as TensorBoard events.

    A no-op on processes other than 0: every host computes the same global
    metrics, one copy is enough.
    """

    def __init__(self, logdir: str, jsonl_path: str | None = None):
        """Args:
        jsonl_path: also append every `scalars` call as one JSON line {"step", tag: value}
          (full float precision, for scripts and tests; appended, so a resumed run
          continues the same file).
        """
        self._writer = None
        self._jsonl = None
        if jax.process_index() == 0:
            from tensorboardX import SummaryWriter

            os.makedirs(logdir, exist_ok=True)
            self._writer = SummaryWriter(logdir, flush_secs=30)
            if jsonl_path:
                self._jsonl = open(jsonl_path, "a", encoding="utf-8")

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        for k, v in values.items():
            self._writer.add_scalar(k, float(v), global_step=step)
        if self._jsonl is not None:
            row = {"step": int(step)} | {k: float(v) for k, v in values.items()}
            self._jsonl.write(json.dumps(row) + "\n")
            self._jsonl.flush()

    def image(self, step: int, tag: str, img_hwc_uint8: np.ndarray) -> None:
        """One (H, W, 3) uint8 RGB image (PNG-encoded in the event; needs Pillow)."""
        if self._writer is None:
            return
        img = np.asarray(img_hwc_uint8)
        # tensorboardX multiplies non-uint8 images by 255; refuse rather than guess.
        if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
            raise ValueError(f"image {tag!r} must be (H, W, 3) uint8, got {img.shape} {img.dtype}")
        self._writer.add_image(tag, img, global_step=step, dataformats="HWC")

    def text(self, step: int, tag: str, markdown_text: str) -> None:
        """Markdown text (TensorBoard's Text tab shows it under `<tag>/text_summary`)."""
        if self._writer is None:
            return
        self._writer.add_text(tag, markdown_text, global_step=step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
