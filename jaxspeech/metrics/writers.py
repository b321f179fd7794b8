"""Metric logging: TensorBoard event files (tensorboardX, no TensorFlow) on process 0.

Scalars, images (e.g. spectrograms from `jaxspeech.metrics.images`), audio (e.g.
synthesized speech) and markdown text (e.g. reference vs hypothesis transcripts). The
experiment trackers of monitor.trackers (`jaxspeech.metrics.trackers`: MLflow, W&B) get
the same scalars at the same steps, and the pictures, sounds and texts as files.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Mapping

import jax
import numpy as np

from jaxspeech.common import files
from jaxspeech.metrics import trackers as trackers_lib
from jaxspeech.metrics.trackers import Trackers

# tensorboardX writes events from a thread of its own; if a write fails (a full disk) the
# thread dies, and the next `add_*` calls block forever on its bounded queue. The failure
# is kept here (threading.excepthook) and raised in the caller's thread instead.
_WRITER_FAILURES: dict[int, BaseException] = {}
_previous_hook = threading.excepthook


def _keep_writer_failure(args: threading.ExceptHookArgs) -> None:
    if type(args.thread).__name__ == "_EventLoggerThread" and args.exc_value is not None:
        _WRITER_FAILURES[id(args.thread)] = args.exc_value
        if files.storage_error(args.exc_value):
            return  # reported once, by the caller, as one line
    _previous_hook(args)


threading.excepthook = _keep_writer_failure


class WriterStopped(OSError):
    """TensorBoard's writer thread ended without an error to report."""


def _guard_queue(event_writer) -> None:
    """Makes `event_writer.add_event` wait on its queue only while its thread is alive:
    a thread that dies (a full disk) while the queue is full would otherwise leave the
    caller blocked forever. Raises the thread's error instead."""
    events = event_writer._event_queue

    def add_event(event) -> None:
        if event_writer._closed:  # as tensorboardX's own add_event: dropped after close
            return
        while True:
            thread = event_writer._worker
            if not thread.is_alive():
                raise _WRITER_FAILURES.pop(id(thread), None) or WriterStopped(
                    "TensorBoard's event writer stopped"
                )
            try:
                events.put(event, timeout=1.0)
                return
            except queue.Full:
                continue

    event_writer.add_event = add_event


class MetricWriter:
    """Writes scalars, images and text to `<logdir>` as TensorBoard events.

    A no-op on processes other than 0: every host computes the same global
    metrics, one copy is enough.
    """

    def __init__(
        self,
        logdir: str,
        jsonl_path: str | None = None,
        *,
        trackers: Trackers | None = None,
        tensorboard: bool = True,
    ):
        """Args:
        jsonl_path: also append every `scalars` call as one JSON line {"step", tag: value}
          (full float precision, for scripts and tests; appended, so a resumed run
          continues the same file).
        trackers: experiment trackers fed the same values (process 0's; closed here).
        tensorboard: False writes no event files (monitor.trackers without it).
        """
        self._writer = None
        self._jsonl = None
        self.trackers = trackers if jax.process_index() == 0 else None
        if jax.process_index() == 0 and jsonl_path:
            self._jsonl = open(jsonl_path, "a", encoding="utf-8")
        if jax.process_index() == 0 and tensorboard:
            from tensorboardX import SummaryWriter

            os.makedirs(logdir, exist_ok=True)
            self._writer = SummaryWriter(logdir, flush_secs=30)
            _guard_queue(self._writer._get_file_writer().event_writer)

    def _event_thread(self) -> threading.Thread | None:
        writer = self._writer._get_file_writer() if self._writer is not None else None
        return getattr(getattr(writer, "event_writer", None), "_worker", None)

    def check(self) -> None:
        """Raises the error that stopped TensorBoard's writer thread (then the writer is
        dropped: its queue would block every later call)."""
        thread = self._event_thread()
        if thread is not None and not thread.is_alive():
            failure = _WRITER_FAILURES.pop(id(thread), None)
            self._writer = None
            if failure is not None:
                raise failure

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.check()
        if self._writer is not None:
            for k, v in values.items():
                self._writer.add_scalar(k, float(v), global_step=step)
        if self._jsonl is not None:
            row = {"step": int(step)} | {k: float(v) for k, v in values.items()}
            files.append_line(self._jsonl, json.dumps(row))
        if self.trackers is not None:
            self.trackers.scalars(step, values)

    def image(self, step: int, tag: str, img_hwc_uint8: np.ndarray) -> None:
        """One (H, W, 3) uint8 RGB image (PNG-encoded in the event; needs Pillow)."""
        self.check()
        img = np.asarray(img_hwc_uint8)
        # tensorboardX multiplies non-uint8 images by 255; refuse rather than guess.
        if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
            raise ValueError(f"image {tag!r} must be (H, W, 3) uint8, got {img.shape} {img.dtype}")
        if self._writer is not None:
            self._writer.add_image(tag, img, global_step=step, dataformats="HWC")
        if self.trackers is not None:
            data = trackers_lib.png_bytes(img)
            self.trackers.artifact(step, tag, f"samples/{tag}-step{step}.png", data)

    def audio(self, step: int, tag: str, wave: np.ndarray, sample_rate: int) -> None:
        """One (S,) float waveform in [-1, 1] (clipped here: tensorboardX would print
        a warning for louder samples), played in TensorBoard's Audio tab at `sample_rate` Hz."""
        self.check()
        wave = np.asarray(wave, np.float32)
        if wave.ndim != 1 or not np.all(np.isfinite(wave)):
            raise ValueError(f"audio {tag!r} must be finite (S,) samples, got {wave.shape}")
        clipped = np.clip(wave, -1.0, 1.0)
        if self._writer is not None:
            self._writer.add_audio(tag, clipped, global_step=step, sample_rate=int(sample_rate))
        if self.trackers is not None:
            data = trackers_lib.wav_bytes(clipped, sample_rate)
            self.trackers.artifact(step, tag, f"samples/{tag}-step{step}.wav", data)

    def text(self, step: int, tag: str, markdown_text: str) -> None:
        """Markdown text (TensorBoard's Text tab shows it under `<tag>/text_summary`)."""
        self.check()
        if self._writer is not None:
            self._writer.add_text(tag, markdown_text, global_step=step)
        if self.trackers is not None:
            data = markdown_text.encode("utf-8")
            self.trackers.artifact(step, tag, f"samples/{tag}-step{step}.md", data)

    def flush(self) -> None:
        self.check()
        if self._writer is not None:
            self._writer.flush()

    def close_trackers(
        self, ok: bool, timeout: float = trackers_lib.CLOSE_TIMEOUT_S
    ) -> dict[str, dict[str, int]]:
        """Ends the trackers' runs (`ok`: finished, else killed), waiting at most about
        `timeout` s for each; prints each one's drop report. Returns {tracker: {"values",
        "files"}} of those that dropped anything."""
        if self.trackers is None:
            return {}
        for line in self.trackers.close(ok, timeout):
            print(f"WARNING: {line}", flush=True)
        dropped = {k: v for k, v in self.trackers.dropped().items() if any(v.values())}
        self.trackers = None
        return dropped

    def close(self, ok: bool = True) -> None:
        self.close_trackers(ok)
        thread = self._event_thread()
        if thread is not None and not thread.is_alive():
            self._writer = None  # its close would wait on the dead thread's queue
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
