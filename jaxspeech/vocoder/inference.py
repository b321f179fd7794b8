"""A trained vocoder (a run of `config.task = "vocoder"`: HiFi-GAN's or Vocos's generator)
as other tasks use it: the
vocoder package's one declared interface (tests/test_layout.py). The synthesizer's
evaluation (`tts.evaluation`) vocodes its log-mel frames with it beside Griffin-Lim;
the synthesizer's export (`tts.artifact`) writes its function beside the acoustic one
(`export_for_synthesizer`).

`load_checked_vocoder` refuses, in one line, a vocoder whose front end differs from the
synthesizer's (sample rate, hop, mel bins or any other feature setting): a vocoder
inverts exactly the features it was trained on. `NeuralVocoder` runs the generator on
the devices in batches of one fixed shape (`rows` x `frames_n` frames: one compilation).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.common.errors import UserError
from jaxspeech.config import build, defaults
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading
from jaxspeech.vocoder.hifigan import vocode
from jaxspeech.vocoder.loading import (
    VocoderRun,
    front_end_mismatch,
    generator_graphdef,
    generator_kind,
    load_vocoder_run,
)

# The results' key of the neural vocoder's scores, whichever generator (its "generator"
# says which): the key it had when HiFi-GAN was the only one, kept for readers of results.
NAME = "hifigan"
ROWS = 8  # utterances vocoded at once (rounded up to a multiple of the batch shards)


def check_vocoder_run(workdir: str, features: LogMelConfig, tts_workdir: str) -> ConfigDict:
    """The vocoder run's config, once it is known to be a vocoder trained on `features`.

    Raises:
      UserError: not a run, not a vocoder's run, or another front end (one line).
    """
    try:
        config = loading.load_run_config(workdir)
    except FileNotFoundError as e:
        raise UserError(f"--vocoder_workdir: {e}") from e
    task = defaults.lookup(config, "task")
    if task != "vocoder":
        raise UserError(
            f"--vocoder_workdir: {workdir} is a run of config.task={task!r}; give a vocoder's "
            "run (configs/vocoder.py)"
        )
    mismatch = front_end_mismatch(build.feature_config(config), features)
    if mismatch:
        raise UserError(
            f"--vocoder_workdir: {workdir} was trained on another front end than "
            f"{tts_workdir} ({mismatch}; vocoder vs synthesizer): it cannot invert these "
            "features; train a vocoder with the synthesizer's config.features"
        )
    return config


class NeuralVocoder:
    """A vocoder run's generator: raw log-mel frames -> waveforms, `rows` at a time;
    `kind`: config.vocoder.generator ("hifigan", "vocos")."""

    def __init__(self, run: VocoderRun, frames_n: int):
        self.run, self.frames_n = run, int(frames_n)
        self.kind = generator_kind(run.config)
        self.rules = build.rules_from_config(run.config)
        with rules.axis_rules(self.rules):
            self.rows = mesh_lib.unit_rows(run.spec.mesh, ROWS)
            graphdef = generator_graphdef(run.config)
        self.fn = jax.jit(lambda gp, mel, mask: vocode(nnx.merge(graphdef, gp), mel, mask))
        self.hop = run.cfg.hop_length

    def __call__(self, mels: list[np.ndarray]) -> list[np.ndarray]:
        """(T_i, M) raw log-mel each (T_i <= frames_n) -> (T_i * hop,) float32 each."""
        mesh, n_mels, out = self.run.spec.mesh, self.run.cfg.num_mel_bins, []
        for start in range(0, len(mels), self.rows):
            part = mels[start : start + self.rows]
            mel = np.zeros((self.rows, self.frames_n, n_mels), np.float32)
            mask = np.zeros((self.rows, self.frames_n), bool)
            for i, m in enumerate(part):
                t = min(len(m), self.frames_n)
                mel[i, :t], mask[i, :t] = m[:t], True
            with rules.axis_rules(self.rules), jax.set_mesh(mesh):
                x = mesh_lib.host_to_global(mesh, {"mel": mel, "mask": mask})
                audio = self.fn(self.run.params["generator"], x["mel"], x["mask"])
                audio = mesh_lib.to_host_local(mesh, audio)
            out += [audio[i, : min(len(m), self.frames_n) * self.hop] for i, m in enumerate(part)]
        return out


def load_checked_vocoder(workdir: str, features: LogMelConfig, tts_workdir: str) -> VocoderRun:
    """`check_vocoder_run`, then its latest checkpoint (for a `NeuralVocoder` per split).

    Raises:
      UserError: see `check_vocoder_run`; a checkpoint that cannot be loaded.
    """
    config = check_vocoder_run(workdir, features, tts_workdir)
    try:
        with rules.axis_rules(build.rules_from_config(config)):
            run = load_vocoder_run(workdir)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(f"--vocoder_workdir: {e}") from e
    return run


def export_for_synthesizer(
    workdir: str, fmt: str, output: str, onnx_python: str | None
) -> tuple[dict, dict]:
    """The vocoder function of WORKDIR's latest checkpoint written into a synthesizer's
    artifact `output` (after `check_vocoder_run`) -> (its manifest "functions" entry, the
    synthesizer manifest's "vocoder")."""
    from jaxspeech.vocoder import artifact  # noqa: PLC0415 (the export stack, when exporting)

    run = artifact.load_run(workdir)
    return artifact.export_functions(run, fmt, output, onnx_python), artifact.vocoder_section(
        run, workdir
    )
