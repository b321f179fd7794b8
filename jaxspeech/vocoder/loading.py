"""A vocoder run's models, laid out and loaded: what training builds its state from and
what evaluation restores a checkpoint into (below both, as `tts.loading` is for the
synthesizer).

One `nnx.Module`, `Vocoder`, holds the generator (HiFi-GAN's or Vocos's, by
config.vocoder.generator; a run saved before that key existed is HiFi-GAN's) and HiFi-GAN's
discriminators, so the run's
parameters are one tree {"generator": ..., "discriminator": ...} (the trainer's state
and checkpoints keep each model under its own key); its `model_vars` are the front end's
settings the generator was trained on (`front_end_vars`: constants that travel in every
checkpoint, so a checkpoint says what features it inverts).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.config import build, defaults
from jaxspeech.models import DTYPES
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading
from jaxspeech.vocoder.discriminators import DEMO_DISCRIMINATOR, HiFiGANDiscriminator
from jaxspeech.vocoder.generator import GENERATORS
from jaxspeech.vocoder.vocos import PRIOR_KEYS

RESBLOCK_KERNELS = (3, 7, 11)  # HiFi-GAN V1's; config.vocoder.resblocks takes the first k
# config.vocoder.discriminator -> HiFiGANDiscriminator's arguments (config.validate's
# VOCODER_DISCRIMINATORS names them).
DISCRIMINATORS = {
    "paper": {},
    "demo": DEMO_DISCRIMINATOR,
    "tiny": dict(
        periods=(2, 3),
        period_channels=(4, 8, 16, 16, 16),
        scales=2,
        scale_channels=(8, 8, 16, 16, 16, 16, 16),
    ),
}
FRONT_END_KEYS = ("sample_rate", "hop_length", "num_mel_bins")
# What a vocoder's features must equal (`front_end_mismatch`; an export's manifest lists them).
FRONT_END_MATCH = (*FRONT_END_KEYS, "n_fft", "win_length", "fmin", "fmax", "log_floor", "kind")


class Vocoder(nnx.Module):
    """A generator (`GENERATORS[kind]`) and HiFi-GAN's discriminators side by side (one
    parameter tree)."""

    def __init__(self, kind: str, generator: dict, discriminator: dict, *, rngs: nnx.Rngs):
        self.generator = GENERATORS[kind](**generator, rngs=rngs)
        self.discriminator = HiFiGANDiscriminator(**discriminator, rngs=rngs)


def generator_kind(config: ConfigDict) -> str:
    """config.vocoder.generator: "hifigan" for a run saved before the key existed."""
    return str(defaults.lookup(config, "vocoder.generator"))


def generator_arguments(config: ConfigDict) -> dict:
    """The generator's keyword arguments (`generator_kind`'s class) from config.vocoder,
    the front end's mel bins and vocoder.dtype. HiFi-GAN upsamples 5 x 4 x 4 x 2 (a hop
    of 160); Vocos's inverse STFT takes the features' hop (n_fft 4 x hop)."""
    v = config.vocoder
    common = {
        "n_mels": int(config.features.num_mel_bins),
        "dtype": DTYPES[build.compute_dtype(config)],
    }
    if generator_kind(config) == "vocos":
        out = common | {
            "dim": int(v.vocos_dim),
            "intermediate_dim": int(v.vocos_intermediate_dim),
            "layers": int(v.vocos_layers),
            "hop": int(config.features.hop_length),
        }
        if defaults.lookup(config, "vocoder.vocos_mel_prior"):
            out["mel_prior"] = mel_prior_arguments(build.feature_config(config))
        return out
    k = int(v.resblocks)
    return common | {
        "channels": int(v.generator_channels),
        "resblock_kernels": RESBLOCK_KERNELS[:k],
        "resblock_dilations": ((1, 3, 5),) * k,
    }


def mel_prior_arguments(cfg: LogMelConfig) -> dict:
    """The front end's settings Vocos's magnitude prior inverts (`vocos.PRIOR_KEYS`)."""
    return {k: getattr(cfg, k) for k in PRIOR_KEYS}


def discriminator_arguments(config: ConfigDict) -> dict:
    return dict(DISCRIMINATORS[config.vocoder.discriminator]) | {
        "dtype": DTYPES[build.compute_dtype(config)]
    }


def make_vocoder(config: ConfigDict, seed: int) -> Vocoder:
    return Vocoder(
        generator_kind(config),
        generator_arguments(config),
        discriminator_arguments(config),
        rngs=nnx.Rngs(params=seed),
    )


def front_end_vars(cfg: LogMelConfig) -> dict:
    """The model_vars: {"front_end": {sample_rate, hop_length, num_mel_bins}} int32."""
    return {"front_end": {k: np.asarray(getattr(cfg, k), np.int32) for k in FRONT_END_KEYS}}


def front_end_mismatch(vocoder: LogMelConfig, features: LogMelConfig) -> str | None:
    """What differs between the vocoder's front end and the features it is given, as
    "key a vs b" parts (None: they match). Besides the model_vars' keys, the STFT and
    filterbank settings: a vocoder inverts one exact feature definition."""
    parts = [
        f"{k} {getattr(vocoder, k)} vs {getattr(features, k)}"
        for k in FRONT_END_MATCH
        if getattr(vocoder, k) != getattr(features, k)
    ]
    return ", ".join(parts) or None


def vocoder_spec(config: ConfigDict, mesh: Mesh) -> build.ModelSpec:
    cfg = build.feature_config(config)
    return build.model_spec(lambda seed: make_vocoder(config, seed), front_end_vars(cfg), mesh)


@dataclasses.dataclass
class VocoderRun:
    """A trained vocoder loaded for inference: its config, front end and one
    checkpoint's parameters (both models') on `spec.mesh`."""

    workdir: str
    config: ConfigDict
    cfg: LogMelConfig
    step: int
    spec: build.ModelSpec
    params: dict
    model_vars: dict


def load_vocoder_run(
    workdir: str, *, step: int | None = None, mesh: Mesh | None = None
) -> VocoderRun:
    """Load a vocoder RUN's checkpoint `step` (default: the latest) onto `mesh` (default:
    the run's config.mesh over this job's devices). Call it inside `rules.axis_rules` of
    the run's config.

    Raises:
      FileNotFoundError: `workdir` is not a run directory.
      ValueError: it is not a vocoder's run.
      CheckpointError: no such step, another model's checkpoint, or a corrupt one.
    """
    config = loading.load_run_config(workdir)
    task = config.get("task", "asr")
    if task != "vocoder":
        raise ValueError(f"{workdir} is a run of config.task={task!r}, not a vocoder's")
    if mesh is None:
        mesh = build.mesh_from_config(config)
    spec = vocoder_spec(config, mesh)
    step, model = ckpt_lib.load_model(workdir, spec.abstract, step)
    cfg = build.feature_config(config)
    return VocoderRun(workdir, config, cfg, step, spec, model["params"], model["model_vars"])


def generator_graphdef(config: ConfigDict):
    """The generator's graph alone (to merge with params["generator"] for inference)."""
    make = GENERATORS[generator_kind(config)]
    abstract = nnx.eval_shape(lambda: make(**generator_arguments(config), rngs=nnx.Rngs(0)))
    return nnx.split(abstract, nnx.Param)[0]


def num_params(tree: dict) -> int:
    """Parameters in a tree of arrays or ShapeDtypeStructs."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))
