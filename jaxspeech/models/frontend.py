"""On-device front end: waveform -> log-mel -> global CMVN -> SpecAugment (training only).

The normalization statistics are model state (`FeatureStats`, not trained), so
they travel inside every checkpoint and export with the weights they belong to.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.audio import augment, features


class FeatureStats(nnx.Variable):
    """Non-trainable feature normalization statistics (excluded from the optimizer)."""


class Frontend(nnx.Module):
    """(B, S) float32 audio and (B,) sample counts -> (B, T, F) features and (B,) frame counts."""

    def __init__(
        self,
        feature_config: features.LogMelConfig,
        *,
        specaug: dict | None = None,
    ):
        self.cfg = feature_config
        f = feature_config.num_mel_bins
        self.mean = FeatureStats(jnp.zeros((f,), jnp.float32))
        self.std = FeatureStats(jnp.ones((f,), jnp.float32))
        # None disables augmentation; otherwise kwargs of `augment.spec_augment` plus
        # `freq_warp` (max relative warp of `augment.freq_warp`, 0 = off).
        self.specaug = dict(specaug) if specaug else None
        self.freq_warp = float(self.specaug.pop("freq_warp", 0.0)) if self.specaug else 0.0

    def set_stats(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Install global CMVN statistics (per-bin mean and std, float32)."""
        f = self.cfg.num_mel_bins
        if mean.shape != (f,) or std.shape != (f,):
            raise ValueError(f"stats have shapes {mean.shape}, {std.shape}; expected ({f},)")
        self.mean[...] = jnp.asarray(mean, jnp.float32)
        self.std[...] = jnp.asarray(std, jnp.float32)

    def __call__(
        self, audio_bs: jax.Array, audio_len_b: jax.Array, *, train: bool, rngs: nnx.Rngs | None
    ) -> tuple[jax.Array, jax.Array]:
        lengths = features.num_frames(audio_len_b, self.cfg.hop_length)
        # Whatever lies past a row's length must not reach its last frames' windows.
        valid = jnp.arange(audio_bs.shape[1])[None, :] < audio_len_b[:, None]
        feats = features.log_mel(jnp.where(valid, audio_bs, 0.0), self.cfg)
        augmenting = train and self.specaug is not None
        if augmenting and rngs is None:
            raise ValueError("augmentation needs rngs when train=True")
        if augmenting and self.freq_warp > 0:
            # Warp the raw log-mel spectrum (a physical spectrum), then normalize.
            feats = augment.freq_warp(rngs.specaug(), feats, self.freq_warp)
        mask = jnp.arange(feats.shape[1])[None, :] < lengths[:, None]
        feats = features.normalize(feats, self.mean[...], self.std[...], mask)
        if augmenting:
            feats = augment.spec_augment(rngs.specaug(), feats, lengths, **self.specaug)
        return feats, lengths
