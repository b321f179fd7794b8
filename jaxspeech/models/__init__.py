"""Model registry: `build_model(name, **kwargs)`; models take explicit keyword arguments."""

from __future__ import annotations

from collections.abc import Callable

from flax import nnx

from jaxspeech.models.ctc import ConformerCTC

MODELS: dict[str, Callable[..., nnx.Module]] = {
    "conformer_ctc": ConformerCTC,
}


def build_model(name: str, **kwargs) -> nnx.Module:
    """Instantiate a registered model; unknown names list the known ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    return MODELS[name](**kwargs)
