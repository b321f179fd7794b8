"""Model registry: `build_model(encoder=NAME, encoder_kwargs=..., head=..., ...)`.

Encoders are registered by name; every model is an `ASRModel` (front end, encoder,
CTC and/or transducer heads). Models take explicit keyword arguments, never a config.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from flax import nnx

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.models.asr import ASRModel
from jaxspeech.models.conformer import ConformerEncoder
from jaxspeech.models.lstm import LSTMEncoder

ENCODERS: dict[str, Callable[..., nnx.Module]] = {
    "conformer": ConformerEncoder,
    "lstm": LSTMEncoder,
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def build_model(*, encoder: str, encoder_kwargs: dict, **kwargs) -> ASRModel:
    """An `ASRModel` with the named encoder; unknown names list the known ones."""
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder {encoder!r}; known encoders: {sorted(ENCODERS)}")
    return ASRModel(encoder=ENCODERS[encoder], encoder_kwargs=encoder_kwargs, **kwargs)


def model_from_arguments(arguments: dict, rngs: nnx.Rngs) -> ASRModel:
    """`build_model` from JSON-able arguments (`jaxspeech.config.build.model_arguments`: the
    feature settings as a dict, the dtype by name), so that a process with the model code
    alone (the ONNX converter's) builds the same model."""
    kwargs = dict(arguments)
    kwargs["feature_config"] = LogMelConfig(**kwargs["feature_config"])
    kwargs["dtype"] = DTYPES[kwargs["dtype"]]
    return build_model(**kwargs, rngs=rngs)
