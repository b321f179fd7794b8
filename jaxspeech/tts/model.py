"""FastSpeech2 (Ren et al., 2021) with Conformer blocks: tokens -> log-mel frames.

token + speaker embedding -> Conformer encoder (token mask) -> duration, pitch and energy
predictors -> + pitch / energy embeddings -> length regulator -> Conformer decoder (frame
mask) -> linear projection to the mel bins. The encoder and decoder are the recognizer's
Conformer blocks (`jaxspeech.models.conformer.ConformerBlock`), as ESPnet's FastSpeech2
offers a Conformer encoder and decoder; `pos_enc` picks their attention's positions:
Transformer-XL relative ("rel", the default) or rotary ("rope": no (B, H, T, T) position
scores or shift; without dropout a training step of the demo's model took 8-19% less on a
2-core CPU, benchmarks/tts_step.py).

`reduction` r (Tacotron's reduction factor; ESPnet's FastSpeech2 has one too): the decoder
runs over ceil(T / r) positions, each the projection of r consecutive regulated frames side
by side, and its output layer predicts r frames of M bins a position. The durations stay in
frames (a phoneme boundary may fall inside a position: the concatenation keeps where). r =
2 is configs/tts.py's: the step 0.64-0.72x of r = 1's on a 2-core CPU.

Pitch and energy are predicted per token (FastPitch; ESPnet's token-averaged variant):
their targets are `length_regulator.token_average` of normalized frame-level values.
Training embeds the target values (teacher forcing), inference the predicted ones.
The duration predictor regresses log(1 + duration), as ESPnet's (offset 1).

Shapes: B batch, N tokens, T frames, D model dim, C predictor channels, M mel bins.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.common.errors import UserError
from jaxspeech.models.conformer import ConformerBlock
from jaxspeech.models.layers import (
    Dense,
    Dropout,
    Dtype,
    LayerNorm,
    dense_init,
    layer_stack,
    logical_init,
)
from jaxspeech.parallel.rules import constrain
from jaxspeech.tts import length_regulator

PAD_ID = 0


def zero(x: jax.Array) -> jax.Array:
    """A () zero of x's dtype: `jnp.where`'s fill. A Python 0 is weakly typed, which jax
    keeps at x's dtype but jax2onnx's conversion (`tts.artifact`) widens to 64 bits."""
    return jnp.zeros((), x.dtype)


class Conv1d(nnx.Module):
    """'Same' full (not depthwise) 1-D convolution over time: (B, N, Cin) -> (B, N, Cout).

    Padding positions are zeroed first, so a sequence's valid outputs do not depend on
    how much padding follows it (the convolution sees zeros past its end either way).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        axes: tuple[str | None, str | None],
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if kernel_size % 2 == 0:
            raise ValueError(f"conv kernel size must be odd, got {kernel_size}")
        self.kernel = nnx.Param(
            logical_init(dense_init(2), ("conv",) + tuple(axes))(
                rngs.params(), (kernel_size, in_channels, out_channels)
            )
        )
        self.bias = nnx.Param(
            logical_init(nnx.initializers.zeros, axes[1:])(rngs.params(), (out_channels,))
        )
        self.pad = (kernel_size - 1) // 2
        self.dtype = dtype

    def __call__(self, x_bnc: jax.Array, mask_bn: jax.Array) -> jax.Array:
        x = x_bnc.astype(self.dtype)
        x = jnp.where(mask_bn[..., None], x, zero(x))
        pad = self.pad
        y = jax.lax.conv_general_dilated(
            x,
            self.kernel[...].astype(self.dtype),
            window_strides=(1,),
            padding=[(pad, pad)],
            dimension_numbers=("NWC", "WIO", "NWC"),
        )
        return y + self.bias[...].astype(self.dtype)


class VariancePredictor(nnx.Module):
    """(B, N, D) token encodings -> (B, N) float32 scalar per token (0 on padding):
    2 x (conv -> ReLU -> LayerNorm -> dropout) -> linear, as ESPnet's duration and
    variance predictors."""

    def __init__(
        self,
        dim: int,
        channels: int,
        kernel_size: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        self.conv1 = Conv1d(dim, channels, kernel_size, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.norm1 = LayerNorm(channels, dtype=dtype, rngs=rngs)
        self.conv2 = Conv1d(channels, channels, kernel_size, ("mlp", None), dtype=dtype, rngs=rngs)
        self.norm2 = LayerNorm(channels, dtype=dtype, rngs=rngs)
        self.out = Dense(channels, 1, ("mlp", None), dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout)

    def __call__(
        self, x_bnd: jax.Array, mask_bn: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        kw = dict(deterministic=deterministic, rngs=rngs)
        h = self.dropout(self.norm1(jax.nn.relu(self.conv1(x_bnd, mask_bn))), **kw)
        h = self.dropout(self.norm2(jax.nn.relu(self.conv2(h, mask_bn))), **kw)
        y = self.out(h)[..., 0].astype(jnp.float32)
        return jnp.where(mask_bn, y, zero(y))


def durations_from_log(
    log_duration_bn: jax.Array, token_mask_bn: jax.Array, scale: float, max_duration: int
) -> jax.Array:
    """(B, N) predicted log(1 + duration) -> (B, N) int32 frames per token.

    round((exp(x) - 1) * scale), clipped to [1, max_duration] on real tokens (a token that
    is in the text is spoken: it keeps at least one frame) and 0 on padding. `scale` > 1
    slows the speech down; it multiplies before the rounding (ESPnet rounds twice).
    """
    frames = jnp.round((jnp.exp(log_duration_bn.astype(jnp.float32)) - 1.0) * scale)
    frames = jnp.clip(frames, 1, max_duration).astype(jnp.int32)
    return jnp.where(token_mask_bn, frames, zero(frames))


def id_mistake(tokens_bn, speaker_b, vocab_size: int, num_speakers: int) -> str:
    """The first phoneme id outside [0, vocab_size) or speaker id outside [0, num_speakers)
    in (B, N) `tokens_bn` and (B,) `speaker_b` (host arrays), in words ('' if none).
    Unchecked, `jnp.take` fills a phoneme or speaker past the table with NaN (0 frames of
    output) and wraps a negative one round to the table's end (speaker -1: the last voice)."""
    for name, ids, size in (
        ("phoneme", tokens_bn, vocab_size),
        ("speaker", speaker_b, num_speakers),
    ):
        ids = np.asarray(ids)
        bad = (ids < 0) | (ids >= size)
        if bad.any():
            return (
                f"{name} id {int(ids[bad].flat[0])} is out of range: valid ids are 0 to {size - 1}"
            )
    return ""


def check_ids(tokens_bn, speaker_b, vocab_size: int, num_speakers: int) -> None:
    """`id_mistake` as a UserError, for ids this process holds (under jit or export the
    ids are symbolic and unchecked: the exported graph's own inputs are its caller's to
    check).

    Raises:
      UserError: a phoneme or speaker id out of range.
    """
    for ids in (tokens_bn, speaker_b):
        if isinstance(ids, jax.core.Tracer) or not getattr(ids, "is_fully_addressable", True):
            return
    mistake = id_mistake(tokens_bn, speaker_b, vocab_size, num_speakers)
    if mistake:
        raise UserError(mistake)


class FastSpeech2(nnx.Module):
    """(B, N) token ids (padding id 0) and (B,) speaker ids -> (B, T, M) log-mel frames."""

    def __init__(
        self,
        *,
        vocab_size: int,
        num_speakers: int = 1,
        dim: int = 256,
        num_heads: int = 2,
        encoder_layers: int = 4,
        decoder_layers: int = 4,
        ff_mult: int = 4,
        conv_kernel: int = 7,
        n_mels: int = 80,
        variance_channels: int = 256,
        variance_kernel: int = 3,
        embed_kernel: int = 9,
        dropout: float = 0.1,
        pos_enc: str = "rel",
        reduction: int = 1,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if num_speakers < 1:
            raise ValueError(f"num_speakers must be >= 1, got {num_speakers}")
        for name, k in (("variance_kernel", variance_kernel), ("embed_kernel", embed_kernel)):
            if k % 2 == 0:  # 'same' padding of an even kernel would shift the sequence
                raise ValueError(f"{name} must be odd, got {k}")
        if reduction < 1:
            raise ValueError(f"reduction must be >= 1, got {reduction}")
        table = logical_init(nnx.initializers.normal(1.0), ("vocab", "embed"))
        self.token_embed = nnx.Param(table(rngs.params(), (vocab_size, dim)))
        self.speaker_embed = nnx.Param(
            logical_init(nnx.initializers.normal(1.0), (None, "embed"))(
                rngs.params(), (num_speakers, dim)
            )
        )
        self.dropout = Dropout(dropout)

        def make(r: nnx.Rngs) -> ConformerBlock:
            return ConformerBlock(
                dim, num_heads, ff_mult, conv_kernel, dropout, pos_enc=pos_enc, dtype=dtype, rngs=r
            )

        self.encoder = layer_stack(make, encoder_layers, scan=False, rngs=rngs)
        predictor = lambda: VariancePredictor(
            dim, variance_channels, variance_kernel, dropout, dtype=dtype, rngs=rngs
        )
        self.duration_predictor = predictor()
        self.pitch_predictor = predictor()
        self.energy_predictor = predictor()
        # A 1-D conv of the scalar (FastPitch, ESPnet): neighbouring tokens' values shape it.
        self.pitch_embed = Conv1d(1, dim, embed_kernel, (None, "embed"), dtype=dtype, rngs=rngs)
        self.energy_embed = Conv1d(1, dim, embed_kernel, (None, "embed"), dtype=dtype, rngs=rngs)
        if reduction > 1:  # r frames' vectors side by side -> one decoder position
            self.reduce = Dense(reduction * dim, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.decoder = layer_stack(make, decoder_layers, scan=False, rngs=rngs)
        self.mel_out = Dense(dim, reduction * n_mels, ("embed", "mel"), dtype=dtype, rngs=rngs)
        self.n_mels = n_mels
        self.reduction = reduction
        self.dtype = dtype

    @property
    def id_ranges(self) -> tuple[int, int]:
        """(phoneme ids, speaker ids): the sizes of the embedding tables."""
        return self.token_embed.shape[0], self.speaker_embed.shape[0]

    def encode(
        self,
        tokens_bn: jax.Array,
        speaker_b: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> tuple[jax.Array, jax.Array]:
        """(B, N) tokens, (B,) speakers -> (B, N, D) encodings (0 on padding), (B, N) mask."""
        mask = tokens_bn != PAD_ID
        # The speaker joins before the encoder, so every layer can condition on it.
        x = jnp.take(self.token_embed[...], tokens_bn, axis=0)
        x = x + jnp.take(self.speaker_embed[...], speaker_b, axis=0)[:, None, :]
        x = jnp.where(mask[..., None], x, 0.0).astype(self.dtype)
        x = constrain(x, ("batch", "time", "embed"))
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        for block in self.encoder:
            x = block(x, mask, deterministic=deterministic, rngs=rngs)
        return jnp.where(mask[..., None], x, zero(x)), mask

    def predict_variances(
        self,
        h_bnd: jax.Array,
        mask_bn: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> dict[str, jax.Array]:
        """(B, N, D) encodings -> (B, N) float32 log(1 + duration), pitch and energy."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        return {
            "log_duration": self.duration_predictor(h_bnd, mask_bn, **kw),
            "pitch": self.pitch_predictor(h_bnd, mask_bn, **kw),
            "energy": self.energy_predictor(h_bnd, mask_bn, **kw),
        }

    def decode(
        self,
        h_bnd: jax.Array,
        mask_bn: jax.Array,
        pitch_bn: jax.Array,
        energy_bn: jax.Array,
        durations_bn: jax.Array,
        max_frames: int,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Token encodings + the embedded (B, N) pitch and energy, repeated by the (B, N)
        durations to `max_frames` frames and decoded -> (B, T, M) float32 mel (0 past the
        end), (B, T) frame mask, (B,) overflow (see `length_regulator.regulate`)."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        h = h_bnd + self.pitch_embed(pitch_bn[..., None], mask_bn)
        h = h + self.energy_embed(energy_bn[..., None], mask_bn)
        h = self.dropout(h, **kw)
        durations = jnp.where(mask_bn, durations_bn, zero(durations_bn))  # padding: no frame
        x, frame_mask, overflow = length_regulator.regulate(h, durations, max_frames)
        x, mask = self._reduced(x, frame_mask)
        x = constrain(x, ("batch", "time", "embed"))
        for block in self.decoder:
            x = block(x, mask, **kw)
        mel = self.mel_out(x).astype(jnp.float32)  # (B, T / r, r * M)
        b, t = frame_mask.shape
        mel = mel.reshape(b, -1, self.n_mels)[:, :t]
        mel = jnp.where(frame_mask[..., None], mel, zero(mel))
        return constrain(mel, ("batch", "time", "mel")), frame_mask, overflow

    def _reduced(self, x_btd: jax.Array, mask_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(B, T, D) frames, (B, T) mask -> (B, ceil(T / r), D) decoder positions and their
        mask: each holds r consecutive frames (concatenated and projected, so the decoder
        still sees where a phoneme boundary falls inside it); a position is valid if any of
        its frames is. r = 1: unchanged."""
        r = self.reduction
        if r == 1:
            return x_btd, mask_bt
        b, t, d = x_btd.shape
        pad = -t % r
        x = jnp.pad(x_btd, ((0, 0), (0, pad), (0, 0))).reshape(b, (t + pad) // r, r * d)
        mask = jnp.pad(mask_bt, ((0, 0), (0, pad))).reshape(b, (t + pad) // r, r).any(-1)
        x = self.reduce(x)
        return jnp.where(mask[..., None], x, zero(x)), mask

    def __call__(
        self,
        tokens_bn: jax.Array,
        speaker_b: jax.Array,
        durations_bn: jax.Array,
        pitch_bn: jax.Array,
        energy_bn: jax.Array,
        max_frames: int,
        deterministic: bool,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> dict[str, jax.Array]:
        """Training forward with the target (B, N) durations, token pitch and token energy
        (teacher forcing). Returns {"mel": (B, T, M), "frame_mask": (B, T), "token_mask":
        (B, N), "log_duration", "pitch", "energy": (B, N) predictions, "overflow": (B,)},
        T = `max_frames`; predictions are float32 and 0 on padding."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        h, mask = self.encode(tokens_bn, speaker_b, **kw)
        pred = self.predict_variances(h, mask, **kw)
        mel, frame_mask, overflow = self.decode(
            h, mask, pitch_bn, energy_bn, durations_bn, max_frames, **kw
        )
        return pred | {
            "mel": mel,
            "frame_mask": frame_mask,
            "token_mask": mask,
            "overflow": overflow,
        }

    def synthesize(
        self,
        tokens_bn: jax.Array,
        speaker_b: jax.Array,
        max_frames: int,
        duration_scale: float = 1.0,
        durations_bn: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Inference (no dropout): predicted durations (`durations_from_log` with
        `duration_scale`), pitch and energy -> (B, T, M) float32 mel, (B, T) frame mask and
        the (B, N) int32 durations used. T = `max_frames`; a sequence whose durations sum
        past it is cut there (durations.sum(1) > max_frames tells which).

        `durations_bn`: (B, N) int frames per token to use instead of the predicted ones
        (pitch and energy are still predicted): a recording's own timing, so that the
        output lines up with it frame by frame (the evaluation's PESQ and F0 RMSE).

        Raises:
          UserError: a phoneme or speaker id out of range (`check_ids`; ids this process
            holds, not traced ones).
        """
        check_ids(tokens_bn, speaker_b, *self.id_ranges)
        kw = dict(deterministic=True, rngs=None)
        h, mask = self.encode(tokens_bn, speaker_b, **kw)
        pred = self.predict_variances(h, mask, **kw)
        if durations_bn is None:
            durations = durations_from_log(pred["log_duration"], mask, duration_scale, max_frames)
        else:
            durations = durations_bn.astype(jnp.int32)
            durations = jnp.where(mask, durations, zero(durations))
        mel, frame_mask, _ = self.decode(
            h, mask, pred["pitch"], pred["energy"], durations, max_frames, **kw
        )
        return mel, frame_mask, durations


def make_synthesize_fn(graphdef, max_frames: int) -> Callable:
    """jit (params, tokens (B, N), speaker (B,), durations (B, N) or None) -> (B,
    max_frames, M) normalized log-mel and (B,) frames it spans: the model's own durations,
    pitch and energy, or the given durations (`FastSpeech2.synthesize`). One compilation
    per batch shape, and one more for the given durations."""

    @jax.jit
    def synthesize(params, tokens, speaker, durations=None):
        model = nnx.merge(graphdef, params)
        mel, mask, _ = model.synthesize(tokens, speaker, max_frames, durations_bn=durations)
        return mel, jnp.sum(mask, axis=1)

    def checked(params, tokens, speaker, durations=None):
        """Ids checked on the host first (`check_ids`: traced, they could not be)."""
        sizes = (np.shape(params["token_embed"])[0], np.shape(params["speaker_embed"])[0])
        check_ids(tokens, speaker, *sizes)
        return synthesize(params, tokens, speaker, durations)

    return checked
