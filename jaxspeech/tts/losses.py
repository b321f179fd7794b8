"""FastSpeech2's training objective: mel reconstruction plus the variance predictors' losses.

Every part is a mean over the valid elements of the whole batch (a sum over the batch
divided by a count over the batch), not a mean of per-example means: long utterances
weigh by their frames, as in ESPnet's FastSpeech2 loss, and a batch sharded over devices
gives the same value as on one device (the sums are reduced, then divided).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PARTS = ("mel", "duration", "pitch", "energy")


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `values` over the True entries of a broadcastable `mask` (0 when none)."""
    mask = jnp.broadcast_to(mask, values.shape).astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def fastspeech2_loss(
    pred: dict[str, jax.Array],
    targets: dict[str, jax.Array],
    *,
    mel_weight: float = 1.0,
    duration_weight: float = 1.0,
    pitch_weight: float = 1.0,
    energy_weight: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted sum of the masked losses -> (total, {part: scalar}) in float32.

    Args:
      pred: `FastSpeech2.__call__`'s outputs: "mel" (B, T, M), "log_duration", "pitch",
        "energy" (B, N), and the masks "frame_mask" (B, T) and "token_mask" (B, N) (the
        frames the target durations cover, cut at T, and the non-padding tokens).
      targets: "mel" (B, T, M) log-mel frames, "durations" (B, N) ints, "pitch" and
        "energy" (B, N) token averages of the normalized frame values.
    Parts: "mel": L1 averaged over valid frames x mel bins; "duration": squared error of
    log(1 + duration); "pitch", "energy": squared errors; each averaged over valid tokens.
    """
    f32 = lambda x: x.astype(jnp.float32)
    token_mask = pred["token_mask"]
    mel_l1 = jnp.abs(f32(pred["mel"]) - f32(targets["mel"]))
    log_duration = jnp.log1p(f32(targets["durations"]))
    parts = {
        "mel": _masked_mean(mel_l1, pred["frame_mask"][..., None]),
        "duration": _masked_mean(jnp.square(pred["log_duration"] - log_duration), token_mask),
        "pitch": _masked_mean(jnp.square(pred["pitch"] - f32(targets["pitch"])), token_mask),
        "energy": _masked_mean(jnp.square(pred["energy"] - f32(targets["energy"])), token_mask),
    }
    weights = dict(
        zip(PARTS, (mel_weight, duration_weight, pitch_weight, energy_weight), strict=True)
    )
    total = sum(weights[k] * parts[k] for k in PARTS)
    return total, parts
