"""Model registry: `build_model(encoder=NAME, encoder_kwargs=..., head=..., ...)`.

Encoders are registered by name; every model is an `ASRModel` (front end, encoder,
CTC and/or transducer heads). Models take explicit keyword arguments, never a config.
"""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from jaxspeech.models.asr import ASRModel
from jaxspeech.models.conformer import ConformerEncoder
from jaxspeech.models.lstm import LSTMEncoder

ENCODERS: dict[str, Callable[..., nnx.Module]] = {
    "conformer": ConformerEncoder,
    "lstm": LSTMEncoder,
}


def build_model(*, encoder: str, encoder_kwargs: dict, **kwargs) -> ASRModel:
    """An `ASRModel` with the named encoder; unknown names list the known ones."""
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder {encoder!r}; known encoders: {sorted(ENCODERS)}")
    return ASRModel(encoder=ENCODERS[encoder], encoder_kwargs=encoder_kwargs, **kwargs)
