"""On-device front end: waveform -> log-mel (-> MFCC) -> global CMVN -> SpecAugment
(training only).

The normalization statistics are model state (`FeatureStats`, not trained), so
they travel inside every checkpoint and export with the weights they belong to.

`Frontend.init_stream` / `stream_step` / `stream_flush` compute the same features from
audio that arrives a chunk at a time (streaming recognition; no augmentation).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxspeech.audio import augment, features, mfcc
from jaxspeech.parallel.rules import map_batch_shards


class FeatureStats(nnx.Variable):
    """Non-trainable feature normalization statistics (excluded from the optimizer)."""


@struct.dataclass
class FrontendStreamState:
    """Carried state of `Frontend.stream_step` (a pytree; `started` is static)."""

    samples_bs: jax.Array  # (B, S) audio from the next frame's window start (zeros before 0)
    samples_seen: jax.Array  # () int32 audio samples consumed so far (every stream alike)
    frames_out: jax.Array  # () int32 feature frames emitted so far
    started: bool = struct.field(pytree_node=False, default=False)


class Frontend(nnx.Module):
    """(B, S) float32 audio and (B,) sample counts -> (B, T, F) features and (B,) frame counts."""

    def __init__(
        self,
        feature_config: features.LogMelConfig,
        *,
        specaug: dict | None = None,
    ):
        self.cfg = feature_config
        f = feature_config.num_features
        self.mean = FeatureStats(jnp.zeros((f,), jnp.float32))
        self.std = FeatureStats(jnp.ones((f,), jnp.float32))
        # None disables augmentation; otherwise kwargs of `augment.spec_augment` plus
        # `freq_warp` (max relative warp of `augment.freq_warp`, 0 = off).
        self.specaug = dict(specaug) if specaug else None
        self.freq_warp = float(self.specaug.pop("freq_warp", 0.0)) if self.specaug else 0.0

    def set_stats(self, mean: np.ndarray, std: np.ndarray) -> None:
        """Install global CMVN statistics (per-feature mean and std, float32)."""
        f = self.cfg.num_features
        if mean.shape != (f,) or std.shape != (f,):
            raise ValueError(f"stats have shapes {mean.shape}, {std.shape}; expected ({f},)")
        self.mean[...] = jnp.asarray(mean, jnp.float32)
        self.std[...] = jnp.asarray(std, jnp.float32)

    def __call__(
        self, audio_bs: jax.Array, audio_len_b: jax.Array, *, train: bool, rngs: nnx.Rngs | None
    ) -> tuple[jax.Array, jax.Array]:
        lengths = features.num_frames(audio_len_b, self.cfg.hop_length)
        # Whatever lies past a row's length must not reach its last frames' windows.
        s = audio_bs.shape[1]
        valid = jax.lax.broadcasted_iota(jnp.int32, (1, s), 1) < audio_len_b[:, None]
        # Each device transforms its own rows (see rules.map_batch_shards: XLA would
        # otherwise gather the batch for the FFT).
        feats = map_batch_shards(
            lambda a: features.log_mel(a, self.cfg), jnp.where(valid, audio_bs, 0.0)
        )
        augmenting = train and self.specaug is not None
        if augmenting and rngs is None:
            raise ValueError("augmentation needs rngs when train=True")
        if augmenting and self.freq_warp > 0:
            # Warp the raw log-mel spectrum (a physical spectrum), then normalize.
            feats = augment.freq_warp(rngs.specaug(), feats, self.freq_warp)
        if self.cfg.kind == "mfcc":  # from the (warped) log-mel, before its normalization
            c = self.cfg
            feats = mfcc.mfcc_of_log_mel(feats, lengths, c.num_ceps, c.lifter, c.deltas)
        mask = jax.lax.broadcasted_iota(jnp.int32, (1, feats.shape[1]), 1) < lengths[:, None]
        feats = features.normalize(feats, self.mean[...], self.std[...], mask)
        if augmenting:
            feats = augment.spec_augment(rngs.specaug(), feats, lengths, **self.specaug)
        return feats, lengths

    # ---------------------------------------------------------------------------------
    # Streaming: audio in chunks -> the frames of the centred STFT whose windows are complete.
    # ---------------------------------------------------------------------------------
    #
    # Frame i's window covers samples hop * i - n_fft // 2 + (n_fft - win) // 2 onwards
    # (win_length samples; what lies before sample 0 or after the end is zero, as in the
    # batch computation). The state keeps the samples from the next frame's window start
    # on: at the start those of `stream_lag()` frames before frame 0 (all zeros), so every
    # step appends m * hop samples and computes m frames; the first step drops the lag.

    def stream_lag(self) -> int:
        """D: the first `stream_step` emits D frames fewer than later ones (1 for 25 ms
        windows every 10 ms: after m hops of audio, frame m - 1's window still needs 2.5 ms
        more), and `stream_flush` emits D + 1 + (its samples) // hop frames."""
        hop, win = self.cfg.hop_length, self.cfg.win_length
        before = self.cfg.n_fft // 2 - (self.cfg.n_fft - win) // 2  # zeros before frame 0
        # m frames from K + m * hop samples need K >= win - hop; the least such K of the
        # form before + D * hop completes exactly the frames whose windows have arrived.
        return max(0, math.ceil((win - hop - before) / hop))

    def _stream_keep(self) -> int:
        """Samples carried between steps: from the next frame's window start to the end."""
        before = self.cfg.n_fft // 2 - (self.cfg.n_fft - self.cfg.win_length) // 2
        return before + self.stream_lag() * self.cfg.hop_length

    def init_stream(self, batch_size: int) -> FrontendStreamState:
        """Empty state for `batch_size` audio streams."""
        if self.cfg.kind == "mfcc" and self.cfg.deltas:
            # A delta needs 2 frames after its own, and the stream's last frames take the
            # value of its last full window: not carried by this state.
            raise ValueError(
                f"MFCC deltas (features.deltas={self.cfg.deltas}) cannot stream: use "
                "features.deltas=0 for a streaming model"
            )
        keep = self._stream_keep()
        return FrontendStreamState(
            samples_bs=jnp.zeros((batch_size, keep), jnp.float32),
            samples_seen=jnp.zeros((), jnp.int32),
            frames_out=jnp.zeros((), jnp.int32),
        )

    def stream_step(
        self, state: FrontendStreamState, audio_bs: jax.Array
    ) -> tuple[jax.Array, FrontendStreamState]:
        """(B, S) next audio samples, S a multiple of hop_length -> normalized features of the
        frames completed by them: (B, S // hop - D, F) on the first call, (B, S // hop, F)
        after it, D = `stream_lag()`. Every stream of the batch gets S samples; end them
        with `stream_flush`."""
        hop = self.cfg.hop_length
        lag, keep = self.stream_lag(), self._stream_keep()
        s = audio_bs.shape[1]
        m = s // hop
        least = 1 if state.started else max(1, lag)
        if s % hop or m < least:
            raise ValueError(
                f"stream_step takes a multiple of hop_length={hop} samples, at least "
                f"{least * hop}; got {s}"
            )
        buf = jnp.concatenate([state.samples_bs, audio_bs.astype(jnp.float32)], axis=1)
        feats = self._stream_feats(buf, m)
        skip = 0 if state.started else lag
        new_state = FrontendStreamState(
            samples_bs=buf[:, buf.shape[1] - keep :],
            samples_seen=state.samples_seen + s,
            frames_out=state.frames_out + m - skip,
            started=True,
        )
        return feats[:, skip:], new_state

    def stream_flush(
        self,
        state: FrontendStreamState,
        audio_bs: jax.Array | None = None,
        num_samples_b: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """End the streams: optional last (B, S) samples (any S; the first `num_samples_b`
        of each row are real) -> (B, K, F) remaining features and (B,) how many of them
        each stream has (the rest are 0, as padding frames are in the batch computation).
        The windows that run past the end see zeros, as the centred STFT's right padding."""
        hop, win = self.cfg.hop_length, self.cfg.win_length
        lag = self.stream_lag()
        b = state.samples_bs.shape[0]
        if audio_bs is None:
            audio_bs = jnp.zeros((b, 0), jnp.float32)
        s = audio_bs.shape[1]
        if num_samples_b is None:
            num_samples_b = jnp.full((b,), s, jnp.int32)
        real = jnp.arange(s)[None, :] < num_samples_b[:, None]
        audio = jnp.where(real, audio_bs.astype(jnp.float32), 0.0)
        skip = 0 if state.started else lag
        # Frames left: 1 + total // hop - emitted, at most (1 + lag + s // hop) after a step.
        k = 1 + s // hop + (lag if state.started else 0)
        n = k + skip  # frames computed from the buffer start
        buf = jnp.concatenate([state.samples_bs, audio], axis=1)
        need = hop * (n - 1) + win
        buf = jnp.pad(buf, ((0, 0), (0, max(0, need - buf.shape[1]))))
        feats = self._stream_feats(buf, n)[:, skip:]
        left = 1 + features.floor_div(state.samples_seen + num_samples_b, hop) - state.frames_out
        keep = jnp.arange(k)[None, :] < left[:, None]
        return jnp.where(keep[..., None], feats, 0.0), left.astype(jnp.int32)

    def _stream_feats(self, buf_bs: jax.Array, m: int) -> jax.Array:
        """Normalized features of the m frames whose windows start every hop from buf[0]."""
        # The batch front end's own per-frame arithmetic, so streamed frames equal its frames
        # (an MFCC frame is its own log-mel frame's DCT: no deltas here, see init_stream).
        feats = features.log_mel_of_windows(buf_bs, self.cfg, m)
        if self.cfg.kind == "mfcc":
            feats = mfcc.cepstra(feats, self.cfg.num_ceps, self.cfg.lifter)
        return (feats - self.mean[...]) / self.std[...]
