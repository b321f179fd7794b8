"""A finished run loaded back for inference: its resolved config (RUN/config.json), tokenizer
and one checkpoint's parameters on a mesh. Evaluation, transcription, export and
distillation load runs through here. A run on an object store is read from a pulled copy
(runs/remote.py), its checkpoints from the store."""

from __future__ import annotations

import dataclasses
import json
import os

from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.config import build, sections
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.runs import assets, remote
from jaxspeech.runs import checkpoint as ckpt_lib


# ---------------------------------------------------------------- a finished run
def load_run_config(workdir: str) -> ConfigDict:
    """The resolved config a run was trained with (RUN/config.json), in its task's layout
    (a run saved with every task's sections reads as one of today's: `sections.per_task`)."""
    path = os.path.join(remote.read_copy(workdir), "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {workdir} is not a jaxspeech run directory "
            "(train one with `python -m jaxspeech.train --workdir ...`)"
        )
    with open(path) as f:
        return ConfigDict(sections.per_task(json.load(f)))


@dataclasses.dataclass
class Run:
    """A trained run loaded for inference: its config, tokenizer and one checkpoint's
    parameters and feature statistics on `spec.mesh`."""

    config: ConfigDict
    tokenizer_dir: str
    tokenizer: Tokenizer
    step: int
    spec: build.ModelSpec
    params: dict
    model_vars: dict


def load_run(
    workdir: str,
    *,
    step: int | None = None,
    mesh: Mesh | None = None,
    config: ConfigDict | None = None,
) -> Run:
    """Load RUN's checkpoint `step` (default: the latest) onto `mesh` (default: the run's
    own `config.mesh` over this job's devices). The parameter fingerprint is verified.
    `config`: the run's config with settings that leave the parameters as they are (the
    attention chunk size a streaming model is decoded with, say); default RUN's own.

    Raises:
      FileNotFoundError: `workdir` is not a run directory.
      CheckpointError: no such step, another model's checkpoint, or a corrupt one.
    """
    config = config or load_run_config(workdir)
    tokenizer_dir = os.path.join(remote.read_copy(workdir), assets.ASSETS, assets.TOKENIZER)
    tokenizer = Tokenizer.load(tokenizer_dir)
    if mesh is None:
        mesh = build.mesh_from_config(config)
    spec = build.abstract_model(config, tokenizer.vocab_size, mesh)
    step, model = ckpt_lib.load_model(workdir, spec.abstract, step)
    return Run(config, tokenizer_dir, tokenizer, step, spec, model["params"], model["model_vars"])
