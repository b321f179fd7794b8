"""A text-to-speech run's model, laid out and loaded: what training builds its state from
and what evaluation restores a checkpoint into (below both, as `runs.loading` is for
recognizers).

- `model_arguments` (and `config.build.model_spec`): FastSpeech2 of config.tts.model over the run's
  phoneme and speaker tables, sharded by the run's rules;
- `target_stats`: the model_vars, the feature and log-F0 statistics the targets are
  normalized by (constants that travel in every checkpoint);
- `load_tts_run`: RUN's config, assets and one checkpoint's parameters on a mesh.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.config import build
from jaxspeech.models import DTYPES
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading, remote
from jaxspeech.runs.assets import ASSETS
from jaxspeech.tts.assets import TtsAssets, read_tts_assets
from jaxspeech.tts.model import FastSpeech2


def model_arguments(config: ConfigDict, num_phonemes: int, num_speakers: int) -> dict:
    """FastSpeech2's keyword arguments: config.tts.model, the tables' sizes, the front
    end's mel bins and tts.dtype."""
    return config.tts.model.to_dict() | {
        "vocab_size": num_phonemes,
        "num_speakers": num_speakers,
        "n_mels": int(config.features.num_mel_bins),
        "dtype": DTYPES[build.compute_dtype(config)],
    }


def target_stats(assets: TtsAssets) -> dict:
    """The model_vars: the feature and log-F0 statistics the targets are normalized by."""
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return {
        "frontend": {"mean": f32(assets.mean), "std": f32(assets.std)},
        "pitch": {"mean": f32(assets.pitch_mean), "std": f32(assets.pitch_std)},
    }


def denormalized(mel_tf: np.ndarray, model_vars: dict) -> np.ndarray:
    """(T, M) normalized log-mel -> the front end's raw log-mel (natural log of power)."""
    stats = jax.device_get(model_vars["frontend"])
    return mel_tf * np.asarray(stats["std"]) + np.asarray(stats["mean"])


@dataclasses.dataclass
class TtsRun:
    """A trained synthesizer loaded for inference: its config and assets, and one
    checkpoint's parameters and target statistics on `spec.mesh`."""

    config: ConfigDict
    assets: TtsAssets
    step: int
    spec: build.ModelSpec
    params: dict
    model_vars: dict


def load_tts_run(
    workdir: str,
    *,
    step: int | None = None,
    mesh: Mesh | None = None,
    config: ConfigDict | None = None,
) -> TtsRun:
    """Load a text-to-speech RUN's checkpoint `step` (default: the latest) onto `mesh`
    (default: the run's config.mesh over this job's devices), verified. Call it inside
    `rules.axis_rules` of the run's config (the layout follows its rules).

    Raises:
      FileNotFoundError: `workdir` is not a run directory.
      CheckpointError: no such step, another model's checkpoint, or a corrupt one.
      UserError: the run's feature statistics do not fit its config.
    """
    config = config or loading.load_run_config(workdir)
    assets_dir = os.path.join(remote.read_copy(workdir), ASSETS)
    # No inventory to check against: evaluation skips the phonemes the table lacks.
    assets = read_tts_assets(config, assets_dir, [], os.path.join(assets_dir, "stats.json"))
    if mesh is None:
        mesh = build.mesh_from_config(config)
    kwargs = model_arguments(config, assets.table.size, len(assets.speakers))
    spec = build.model_spec(
        lambda seed: FastSpeech2(**kwargs, rngs=nnx.Rngs(params=seed)), target_stats(assets), mesh
    )
    step, model = ckpt_lib.load_model(workdir, spec.abstract, step)
    return TtsRun(config, assets, step, spec, model["params"], model["model_vars"])
