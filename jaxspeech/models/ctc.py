"""Conformer-CTC: front end -> Conformer encoder -> linear projection to the vocabulary."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.models.conformer import ConformerEncoder
from jaxspeech.models.frontend import Frontend
from jaxspeech.models.layers import Dense, Dtype
from jaxspeech.parallel.rules import constrain


class ConformerCTC(nnx.Module):
    """Waveforms in, per-frame vocabulary logits out (blank = id 0)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        feature_config: LogMelConfig,
        dim: int,
        num_layers: int,
        num_heads: int,
        ff_mult: int = 4,
        conv_kernel: int = 15,
        subsampling_channels: int = 64,
        dropout: float = 0.1,
        scan_layers: bool = False,
        specaug: dict | None = None,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.frontend = Frontend(feature_config, specaug=specaug)
        self.encoder = ConformerEncoder(
            num_features=feature_config.num_mel_bins,
            dim=dim,
            num_layers=num_layers,
            num_heads=num_heads,
            ff_mult=ff_mult,
            conv_kernel=conv_kernel,
            subsampling_channels=subsampling_channels,
            dropout=dropout,
            scan_layers=scan_layers,
            dtype=dtype,
            rngs=rngs,
        )
        self.head = Dense(dim, vocab_size, ("embed", "vocab"), dtype=dtype, rngs=rngs)

    def __call__(
        self,
        audio_bs: jax.Array,
        audio_len_b: jax.Array,
        *,
        train: bool = False,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """(B, S) audio, (B,) sample counts -> (B, T', V) float32 logits, (B,) frame counts."""
        feats, lengths = self.frontend(audio_bs, audio_len_b, train=train, rngs=rngs)
        enc, enc_len = self.encoder(feats, lengths, deterministic=not train, rngs=rngs)
        logits = self.head(enc).astype(jnp.float32)
        return constrain(logits, ("batch", "time", "vocab")), enc_len
