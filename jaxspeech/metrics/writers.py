"""Scalar logging: TensorBoard event files (tensorboardX, no TensorFlow) on process 0."""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax


class MetricWriter:
    """Writes scalars to `<logdir>` as TensorBoard events; a no-op on processes other than 0."""

    def __init__(self, logdir: str):
        self._writer = None
        if jax.process_index() == 0:
            from tensorboardX import SummaryWriter

            os.makedirs(logdir, exist_ok=True)
            self._writer = SummaryWriter(logdir, flush_secs=30)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        for k, v in values.items():
            self._writer.add_scalar(k, float(v), global_step=step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
