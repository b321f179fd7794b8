"""HiFi-GAN's training objectives as pure functions of the modules and a batch.

Generator: least-squares adversarial (1 - D(G(x)))^2, feature matching (L1 between the
discriminators' features of real and generated audio, every layer) and the L1 between
log-mels of real and generated audio, weighted 1 / 2 / 45 as in the paper. The log-mel is
our own front end's (`jaxspeech.audio.features.log_mel`: log of the mel *power* + 1e-6),
the features the vocoder is given, where the paper uses log magnitude: the same L1 is
twice the paper's (log power = 2 log magnitude). Discriminator: (1 - D(x))^2 + D(G(x))^2.

Padding: a batch holds waveforms of different lengths, zero-padded to one array with a
per-row sample count. Real and generated audio are zeroed past it, every loss averages
over the valid positions only (the frames the valid samples give, each discriminator
layer's valid positions), and each mean is batch-global (a sum over the batch / a count
over the batch), so long utterances weigh by their length and a batch sharded over devices
gives the value of one device.

Batch: "audio" (B, S) float32 in [-1, 1], S = T * hop; "audio_len" (B,) int samples; "mel"
(B, T, F) the generator's input (`make_batch`: our front end of the audio; fine-tuning on
an acoustic model's predictions puts those here, the L1 target stays the real audio's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.audio import features
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.parallel.rules import map_batch_shards
from jaxspeech.vocoder.discriminators import Features, HiFiGANDiscriminator
from jaxspeech.vocoder.hifigan import vocode

FRONT_END = LogMelConfig()  # the recognizer's default features, which FastSpeech2 predicts


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `values` over the True entries of a broadcastable bool `mask` (0 when none)."""
    mask = jnp.broadcast_to(mask, values.shape).astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def sample_mask(audio_len_b: jax.Array, num_samples: int) -> jax.Array:
    """(B,) sample counts -> (B, S) bool, True on each row's valid samples."""
    return jax.lax.broadcasted_iota(jnp.int32, (1, num_samples), 1) < audio_len_b[:, None]


def _valid(audio_bs: jax.Array, audio_len_b: jax.Array) -> jax.Array:
    """(B, S) float32 audio, zeroed past each row's length."""
    mask = sample_mask(audio_len_b, audio_bs.shape[1])
    return jnp.where(mask, audio_bs.astype(jnp.float32), 0.0)


def frame_mask(audio_len_b: jax.Array, num_frames: int, hop: int) -> jax.Array:
    """(B,) sample counts -> (B, T) bool, True on the 1 + len // hop frames of the front end."""
    count = jnp.minimum(features.num_frames(audio_len_b, hop), num_frames)
    return jax.lax.broadcasted_iota(jnp.int32, (1, num_frames), 1) < count[:, None]


def make_batch(
    audio_bs: jax.Array, audio_len_b: jax.Array, cfg: LogMelConfig = FRONT_END
) -> dict[str, jax.Array]:
    """(B, S) zero-padded waveforms, (B,) lengths -> a vocoder batch: the audio, zeroed past
    each length and padded to T * hop samples (T = 1 + S // hop, the front end's frames),
    its (B, T, F) log-mel and the lengths."""
    b, s = audio_bs.shape
    t = int(features.num_frames(s, cfg.hop_length))
    audio = jnp.pad(_valid(audio_bs, audio_len_b), ((0, 0), (0, t * cfg.hop_length - s)))
    mel = map_batch_shards(lambda a: features.log_mel(a, cfg)[:, :t], audio)
    return {"audio": audio, "audio_len": audio_len_b, "mel": mel}


def generate(generator: nnx.Module, batch: dict[str, jax.Array], cfg: LogMelConfig) -> jax.Array:
    """The generator's (B, S) waveform for the batch's mel, zeroed past each "audio_len"."""
    if generator.hop != cfg.hop_length:
        raise ValueError(
            f"the generator's upsampling ({generator.hop}) is not the hop ({cfg.hop_length})"
        )
    mel, audio_len = batch["mel"], batch["audio_len"]
    if batch["audio"].shape[1] != mel.shape[1] * cfg.hop_length:
        raise ValueError(f"audio of {batch['audio'].shape[1]} samples for {mel.shape[1]} frames")
    fake = vocode(generator, mel, frame_mask(audio_len, mel.shape[1], cfg.hop_length))
    return _valid(fake, audio_len)


def mel_l1(
    real_bs: jax.Array, fake_bs: jax.Array, audio_len_b: jax.Array, cfg: LogMelConfig
) -> jax.Array:
    """L1 between the log-mels of two (B, S) waveforms (both zero past the lengths), over
    each row's 1 + len // hop frames x mel bins. S = T * hop: of the T + 1 frames the front
    end gives, the last (centred past the end) is left out."""
    t = real_bs.shape[1] // cfg.hop_length
    # Each device transforms its own rows (rules.map_batch_shards: XLA would otherwise
    # gather the batch for the FFT).
    mels = map_batch_shards(lambda a: features.log_mel(a, cfg)[:, :t], interleave(real_bs, fake_bs))
    real, fake = deinterleave(mels)
    return masked_mean(jnp.abs(real - fake), frame_mask(audio_len_b, t, cfg.hop_length)[..., None])


def generator_adversarial(fake: list[Features]) -> jax.Array:
    """Sum over sub-discriminators of the masked mean of (1 - score)^2 on generated audio."""
    return sum(masked_mean(jnp.square(1.0 - f.maps[-1]), f.masks[-1]) for f in fake)


def discriminator_adversarial(
    real: list[Features], fake: list[Features]
) -> tuple[jax.Array, jax.Array]:
    """(real part, fake part): sums over sub-discriminators of the masked means of
    (1 - score)^2 on real audio and score^2 on generated audio."""
    real_part = sum(masked_mean(jnp.square(1.0 - r.maps[-1]), r.masks[-1]) for r in real)
    fake_part = sum(masked_mean(jnp.square(f.maps[-1]), f.masks[-1]) for f in fake)
    return real_part, fake_part


def feature_matching(real: list[Features], fake: list[Features]) -> jax.Array:
    """Sum over sub-discriminators and their layers (the score's too) of the masked mean
    |real feature - generated feature|."""
    total = jnp.zeros((), jnp.float32)
    for r, f in zip(real, fake, strict=True):
        for real_map, fake_map, mask in zip(r.maps, f.maps, r.masks, strict=True):
            total = total + masked_mean(jnp.abs(real_map - fake_map), mask)
    return total


def interleave(a: jax.Array, b: jax.Array) -> jax.Array:
    """Two (B, ...) arrays -> (2B, ...) rows a_0, b_0, a_1, b_1, ...: a batch split over
    devices keeps each row's pair on its device (concatenating would move half the rows
    and their every feature map back)."""
    return jnp.stack([a, b], axis=1).reshape((2 * a.shape[0],) + a.shape[1:])


def deinterleave(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`interleave`'s inverse: (2B, ...) -> two (B, ...)."""
    pairs = x.reshape((x.shape[0] // 2, 2) + x.shape[1:])
    return pairs[:, 0], pairs[:, 1]


def deinterleave_all(arrays: list[jax.Array]) -> tuple[list[jax.Array], list[jax.Array]]:
    """`deinterleave` of each array -> (the first halves, the second halves)."""
    pairs = [deinterleave(x) for x in arrays]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _judge(
    disc: HiFiGANDiscriminator, real_bs: jax.Array, fake_bs: jax.Array, audio_len_b: jax.Array
) -> tuple[list[Features], list[Features]]:
    """The discriminators on real and generated audio in one pass (a 2B batch: one traced
    copy of the network instead of two) -> (real, fake) features."""
    both = disc(interleave(real_bs, fake_bs), interleave(audio_len_b, audio_len_b))
    split = [(deinterleave_all(f.maps), deinterleave_all(f.masks)) for f in both]
    real = [Features(maps[0], masks[0]) for maps, masks in split]
    fake = [Features(maps[1], masks[1]) for maps, masks in split]
    return real, fake


def generator_loss(
    generator: nnx.Module,
    disc: HiFiGANDiscriminator,
    batch: dict[str, jax.Array],
    cfg: LogMelConfig = FRONT_END,
    *,
    adversarial_weight: float = 1.0,
    feature_weight: float = 2.0,
    mel_weight: float = 45.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The generator's loss on a batch -> (weighted total, {"adversarial", "feature",
    "mel": unweighted float32 scalars}). Differentiate with respect to the generator's
    parameters (the discriminator's get gradients too; a step ignores them)."""
    real = _valid(batch["audio"], batch["audio_len"])
    fake = generate(generator, batch, cfg)
    parts = {"mel": mel_l1(real, fake, batch["audio_len"], cfg)}
    if adversarial_weight or feature_weight:  # a mel-only warm-up skips the discriminators
        real_feats, fake_feats = _judge(disc, real, fake, batch["audio_len"])
        parts["adversarial"] = generator_adversarial(fake_feats)
        parts["feature"] = feature_matching(real_feats, fake_feats)
    else:
        parts["adversarial"] = parts["feature"] = jnp.zeros((), jnp.float32)
    total = (
        adversarial_weight * parts["adversarial"]
        + feature_weight * parts["feature"]
        + mel_weight * parts["mel"]
    )
    return total, parts


def discriminator_loss(
    disc: HiFiGANDiscriminator, batch: dict[str, jax.Array], fake_bs: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The discriminators' loss on the batch's real audio and (B, S) generated audio
    (`generate`; its gradient is stopped here) -> (total, {"real", "fake"})."""
    audio_len = batch["audio_len"]
    fake = _valid(jax.lax.stop_gradient(fake_bs), audio_len)
    real_feats, fake_feats = _judge(disc, _valid(batch["audio"], audio_len), fake, audio_len)
    real_part, fake_part = discriminator_adversarial(real_feats, fake_feats)
    return real_part + fake_part, {"real": real_part, "fake": fake_part}
