"""The student's side of distillation: a teacher's stored top-k targets as batch arrays.

`targets_filler(config, tokenizer)` returns the `jaxspeech.data.mixing.Extra` that the
training loader calls on every batch of the scheduled mix: rows of the untranscribed
stream get their teacher's per-frame top-k (`teacher_idx`, `teacher_logp`, `teacher_len`,
`soft` = 1) and lose their transcripts (weight 0, no labels: the student never sees them);
labeled rows get zeros of the same shapes, so one compiled step serves both streams.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import mixing
from jaxspeech.data.pipeline import PAD_INDEX, PlannedBatch
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.distill import records as targets_lib


def student_frames(config: ConfigDict, vocab_size: int) -> tuple[int, list[int]]:
    """(audio samples per encoder frame, padded encoder frames of each training bucket)
    of the student `config.model`, from shapes alone (nothing is computed)."""
    model = nnx.eval_shape(lambda: build.make_model(config, vocab_size, 0))
    graphdef, variables = nnx.split(model)
    spec = build.train_bucket_spec(config, build.mesh_from_config(config))
    frames = []
    for b in range(len(spec.boundaries)):
        audio = jax.ShapeDtypeStruct((1, spec.num_samples(b)), np.float32)
        length = jax.ShapeDtypeStruct((1,), np.int32)
        enc = jax.eval_shape(
            lambda v, a, n: nnx.merge(graphdef, v)(a, n)[0], variables, audio, length
        )
        frames.append(int(enc.shape[1]))
    return model.frame_samples, frames


def check_compatible(summary: dict, config: ConfigDict, tokenizer: Tokenizer, frame_samples: int):
    """A student can learn a teacher's per-frame targets only with a CTC head, the same
    vocabulary and the same frame rate.

    Raises:
      UserError: naming what differs.
    """
    where = f"config.distill.targets={config.distill.targets!r}"
    if "ctc" not in config.model.head.split("+"):
        raise UserError(
            f"{where}: soft targets train a CTC output, but model.head={config.model.head!r} "
            "has none; use model.head=ctc, ctc+rnnt or ctc+aed, or pseudo-labels "
            "(distill.targets='')"
        )
    if int(summary["vocab_size"]) != tokenizer.vocab_size:
        raise UserError(
            f"{where}: the teacher's vocabulary has {summary['vocab_size']} labels, this "
            f"run's tokenizer {tokenizer.vocab_size}: the student needs the teacher's tokenizer"
        )
    if int(summary["frame_samples"]) != frame_samples:
        raise UserError(
            f"{where}: the teacher's frames are {summary['frame_samples']} samples apart, "
            f"the student's {frame_samples}: use the teacher's subsampling and hop length"
        )


class TargetsFiller:
    """`mixing.Extra` for soft targets (picklable: the targets reader opens lazily)."""

    def __init__(self, output: str, split: str, k: int, frames: list[int]):
        self.output, self.split, self.k, self.frames = output, split, k, frames
        self._reader = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_reader"}

    def __setstate__(self, state):
        self.__dict__.update(state, _reader=None)

    @property
    def reader(self) -> targets_lib.TargetsReader:
        if self._reader is None:
            self._reader = targets_lib.read_targets(self.output, self.split)
        return self._reader

    def __call__(self, stream: int, planned: PlannedBatch, out: dict) -> None:
        rows, frames = len(planned.indices), self.frames[planned.bucket]
        arrays = {
            "teacher_idx": np.zeros((rows, frames, self.k), np.int32),
            "teacher_logp": np.zeros((rows, frames, self.k), np.float32),
            "teacher_len": np.zeros((rows,), np.int32),
            "soft": np.zeros((rows,), np.float32),
            "no_target": np.zeros((rows,), np.int32),
        }
        if stream == mixing.OTHER:
            # Untranscribed audio: whatever text its records hold must not train the student.
            out["weight"][:] = 0.0
            out["labels"][:] = 0
            out["label_len"][:] = 0
            out["label_overflow"][:] = 0
            self._fill(planned, out, arrays)
        out.update(arrays)

    def _fill(self, planned: PlannedBatch, out: dict, arrays: dict) -> None:
        indices = np.asarray(planned.indices)
        real = [i for i in range(len(indices)) if indices[i] != PAD_INDEX and not out["corrupt"][i]]
        targets = self.reader.read_positions([int(indices[i]) for i in real])
        for row, target in zip(real, targets):
            n = int(target["num_frames"])
            if target["missing"] is not None or n == 0:
                arrays["no_target"][row] = 1  # counted (skipped_no_target), never trained
                continue
            if n > arrays["teacher_idx"].shape[1]:
                raise ValueError(
                    f"target {target['id']!r} has {n} frames, more than the bucket's "
                    f"{arrays['teacher_idx'].shape[1]}: the targets were made from other audio"
                )
            arrays["teacher_idx"][row, :n] = target["indices"]
            arrays["teacher_logp"][row, :n] = target["logprobs"]
            arrays["teacher_len"][row] = n
            arrays["soft"][row] = 1.0


def targets_filler(config: ConfigDict, tokenizer: Tokenizer) -> TargetsFiller:
    """The loader's `Extra` for `config.distill`'s targets, checked against the student.

    Raises:
      UserError: unfinished or missing targets, or a student that cannot learn them.
    """
    d = config.distill
    if not d.other_split:
        raise UserError("config.distill.targets needs config.distill.other_split (its audio)")
    try:
        reader = targets_lib.read_targets(d.targets, d.other_split)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"config.distill.targets: {e}") from e
    frame_samples, frames = student_frames(config, tokenizer.vocab_size)
    check_compatible(reader.summary, config, tokenizer, frame_samples)
    return TargetsFiller(d.targets, d.other_split, int(reader.summary["k"]), frames)
