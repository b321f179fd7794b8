"""The speech recognizer: front end -> encoder -> CTC and/or transducer heads.

`head` picks the outputs: "ctc" (a linear layer to the vocabulary), "rnnt" (predictor
+ joiner, `jaxspeech.models.transducer`), "ctc+rnnt" (both; CTC as an auxiliary
loss and an alternative decoder), "ctc+aed" (CTC and an attention decoder,
`jaxspeech.models.decoder`, trained jointly, decoded jointly or through either branch)
or "aed" (the attention decoder alone).
The encoder is any registered one (`jaxspeech.models.ENCODERS`) with the interface
`encoder(feats_btf, lengths_b, *, deterministic, rngs) -> (x_btd, lengths_b)` and an
`output_dim` attribute.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.losses import rnnt
from jaxspeech.losses.attention import label_smoothed_loss
from jaxspeech.losses.ctc import ctc_loss
from jaxspeech.models.decoder import AttentionDecoder, teacher_forcing
from jaxspeech.models.frontend import Frontend
from jaxspeech.models.layers import Dense, Dtype
from jaxspeech.models.transducer import Transducer
from jaxspeech.parallel.rules import constrain

HEADS = ("ctc", "rnnt", "ctc+rnnt", "ctc+aed", "aed")
RNNT_LOSSES = ("pruned", "full")


@struct.dataclass
class ASRStreamState:
    """Carried state of `ASRModel.stream_step`: the front end's and the encoder's."""

    frontend: object  # models.frontend.FrontendStreamState
    encoder: object  # models.conformer.EncoderStreamState


class ASRModel(nnx.Module):
    """Waveforms in; encodings, CTC logits and transducer parts out (blank = id 0)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        feature_config: LogMelConfig,
        encoder: Callable[..., nnx.Module],
        encoder_kwargs: dict,
        head: str = "ctc",
        transducer_kwargs: dict | None = None,
        decoder_kwargs: dict | None = None,
        specaug: dict | None = None,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; choose one of {HEADS}")
        self.frontend = Frontend(feature_config, specaug=specaug)
        self.encoder = encoder(
            num_features=feature_config.num_features, dtype=dtype, rngs=rngs, **encoder_kwargs
        )
        dim = self.encoder.output_dim
        self.head = head
        self.ctc = (
            Dense(dim, vocab_size, ("embed", "vocab"), dtype=dtype, rngs=rngs)
            if "ctc" in head.split("+")
            else None
        )
        self.transducer = (
            Transducer(
                enc_dim=dim, vocab_size=vocab_size, dtype=dtype, rngs=rngs, **transducer_kwargs
            )
            if "rnnt" in head.split("+")
            else None
        )
        self.decoder = (
            AttentionDecoder(
                vocab_size=vocab_size, enc_dim=dim, dtype=dtype, rngs=rngs, **(decoder_kwargs or {})
            )
            if "aed" in head.split("+")
            else None
        )

    @property
    def frame_samples(self) -> int:
        """Audio samples per encoder output frame: the front end's hop times the encoder's
        subsampling (Conformer) or frame stacking (LSTM)."""
        enc = self.encoder
        factor = enc.subsampling.factor if hasattr(enc, "subsampling") else enc.stack_frames
        return self.frontend.cfg.hop_length * factor

    def __call__(
        self,
        audio_bs: jax.Array,
        audio_len_b: jax.Array,
        *,
        train: bool = False,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """(B, S) audio, (B,) sample counts -> (B, T', D) encodings, (B,) frame counts."""
        feats, lengths = self.frontend(audio_bs, audio_len_b, train=train, rngs=rngs)
        enc, enc_len = self.encoder(feats, lengths, deterministic=not train, rngs=rngs)
        return constrain(enc, ("batch", "time", "embed")), enc_len

    def ctc_logits(self, enc_btd: jax.Array) -> jax.Array:
        """(B, T', D) encodings -> (B, T', V) float32 CTC logits."""
        if self.ctc is None:
            raise ValueError(f"model head {self.head!r} has no CTC output")
        return constrain(self.ctc(enc_btd).astype(jnp.float32), ("batch", "time", "vocab"))

    # ---------------------------------------------------------------------------------
    # Losses: the model knows which of its parts each head's loss needs (as icefall's
    # model.py owns forward_ctc / forward_transducer); how the parts are weighted into
    # the training objective is the train step's business (jaxspeech.training.step).
    # ---------------------------------------------------------------------------------

    def forward_ctc(
        self,
        enc_btd: jax.Array,
        enc_len_b: jax.Array,
        labels_bu: jax.Array,
        label_len_b: jax.Array,
        *,
        blank_id: int,
        kernel: str = "xla",
    ) -> tuple[jax.Array, jax.Array]:
        """Encodings -> (B,) CTC negative log-likelihoods and (B,) feasibility (`kernel`:
        "xla" or "pallas", `jaxspeech.losses.ctc.ctc_loss`)."""
        logits = self.ctc_logits(enc_btd)
        return ctc_loss(logits, enc_len_b, labels_bu, label_len_b, blank_id=blank_id, kernel=kernel)

    def forward_attention(
        self,
        enc_btd: jax.Array,
        enc_len_b: jax.Array,
        labels_bu: jax.Array,
        label_len_b: jax.Array,
        *,
        label_smoothing: float,
        deterministic: bool,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Encodings -> (B,) label-smoothed attention-decoder losses (teacher forcing, summed
        over the label_len + 1 targets incl. <eos>) and (B,) finiteness."""
        if self.decoder is None:
            raise ValueError(f"model head {self.head!r} has no attention decoder")
        inputs, targets = teacher_forcing(labels_bu, label_len_b)
        logits = self.decoder(inputs, enc_btd, enc_len_b, deterministic=deterministic, rngs=rngs)
        return label_smoothed_loss(logits, targets, label_len_b + 1, smoothing=label_smoothing)

    def forward_am_only(
        self,
        enc_btd: jax.Array,
        enc_len_b: jax.Array,
        labels_bu: jax.Array,
        label_len_b: jax.Array,
        *,
        blank_id: int,
        kernel: str = "xla",
    ) -> tuple[jax.Array, jax.Array]:
        """Encodings -> (B,) transducer loss of the simple joiner's acoustic half alone
        (k2's "am-only" lattice: logits = simple_am(enc), no label context) and (B,)
        finiteness. The predictor cannot lower it: only encodings that carry the labels
        can, which makes it the encoder's first teacher when there is no CTC head.
        `kernel`: the recursion's, "xla" or "pallas" (`rnnt.rnnt_loss_from_logprobs`)."""
        if self.transducer is None:
            raise ValueError(f"model head {self.head!r} has no transducer")
        am = self.transducer.simple_am(enc_btd).astype(jnp.float32)  # (B, T, V)
        no_context = jnp.zeros((am.shape[0], labels_bu.shape[1] + 1, am.shape[2]), am.dtype)
        blank, label = rnnt.rnnt_simple_logprobs(am, no_context, labels_bu, blank_id=blank_id)
        frames = jnp.maximum(enc_len_b, 1)
        loss_b = rnnt.rnnt_loss_from_logprobs(blank, label, frames, label_len_b, kernel=kernel)
        ok_b = (enc_len_b >= 1) & jnp.isfinite(loss_b) & (loss_b < -0.5 * rnnt.LOG_ZERO)
        return jnp.where(ok_b, loss_b, 0.0), ok_b

    def forward_transducer(
        self,
        enc_btd: jax.Array,
        enc_len_b: jax.Array,
        labels_bu: jax.Array,
        label_len_b: jax.Array,
        *,
        blank_id: int,
        rnnt_loss: str = "pruned",
        prune_range: int = 5,
        frames_per_chunk: int | None = 16,
        kernel: str = "xla",
    ) -> tuple[dict[str, jax.Array], jax.Array]:
        """Encodings -> ({part: (B,) loss}, (B,) finite).

        "full": {"rnnt"}, the exact lattice. "pruned" (k2): {"rnnt_simple",
        "rnnt_pruned"}, the linear joiner's loss and the full joiner's on the windows it
        bounds (their weighting follows a warm-up schedule, so it is left to the caller).
        `kernel`: the lattice recursions', "xla" or "pallas" (`jaxspeech.losses.rnnt`).
        """
        if self.transducer is None:
            raise ValueError(f"model head {self.head!r} has no transducer")
        if rnnt_loss not in RNNT_LOSSES:
            raise ValueError(f"loss.rnnt must be one of {RNNT_LOSSES}, got {rnnt_loss!r}")
        tr = self.transducer
        enc_proj = tr.joiner.enc_proj(enc_btd)
        pred = tr.predictor(labels_bu)
        pred_proj = tr.joiner.pred_proj(pred)
        if rnnt_loss == "full":
            loss_b, ok_b = rnnt.rnnt_loss(
                tr.joiner.joint,
                enc_proj,
                enc_len_b,
                pred_proj,
                labels_bu,
                label_len_b,
                blank_id=blank_id,
                frames_per_chunk=frames_per_chunk,
                kernel=kernel,
            )
            return {"rnnt": loss_b}, ok_b
        simple_b, pruned_b, ok_b = rnnt.rnnt_pruned_loss(
            tr.joiner.joint,
            enc_proj,
            enc_len_b,
            pred_proj,
            lambda x: tr.simple_am(x).astype(jnp.float32),  # run a chunk of frames at a time
            enc_btd,
            tr.simple_lm(pred).astype(jnp.float32),
            labels_bu,
            label_len_b,
            prune_range=prune_range,
            blank_id=blank_id,
            frames_per_chunk=frames_per_chunk,
            kernel=kernel,
        )
        return {"rnnt_simple": simple_b, "rnnt_pruned": pruned_b}, ok_b

    # ---------------------------------------------------------------------------------
    # Streaming: audio in, encoder frames out, chunk by chunk (a streaming Conformer:
    # causal=True, chunk_size > 0). The front end's frames feed the encoder's windows
    # directly, so both stay exactly equal to the masked full-sequence computation.
    # ---------------------------------------------------------------------------------

    def stream_samples(self, *, first: bool) -> int:
        """Audio samples one `stream_step` takes: hop * the encoder's frames per call, plus
        on the first call the front end's lag (its first call emits that many frames fewer)."""
        frames = self.encoder.stream_frames(first=first)
        lag = self.frontend.stream_lag() if first else 0
        return self.frontend.cfg.hop_length * (frames + lag)

    def init_stream(self, batch_size: int, *, max_history: int | None = None) -> ASRStreamState:
        """Empty state for `batch_size` audio streams (see `ConformerEncoder.init_stream`)."""
        return ASRStreamState(
            frontend=self.frontend.init_stream(batch_size),
            encoder=self.encoder.init_stream(batch_size, max_history=max_history),
        )

    def stream_step(
        self, state: ASRStreamState, audio_bs: jax.Array
    ) -> tuple[jax.Array, jax.Array, ASRStreamState]:
        """(B, stream_samples(first=...)) audio -> (B, C, D) encodings, (B, C) valid, state."""
        first = not state.encoder.started
        if audio_bs.shape[1] != self.stream_samples(first=first):
            raise ValueError(
                f"the {'first' if first else 'later'} stream_step call takes "
                f"{self.stream_samples(first=first)} samples, got {audio_bs.shape[1]}"
            )
        feats, fe_state = self.frontend.stream_step(state.frontend, audio_bs)
        enc, valid, enc_state = self.encoder.stream_step(state.encoder, feats)
        return enc, valid, ASRStreamState(frontend=fe_state, encoder=enc_state)

    def stream_flush(
        self,
        state: ASRStreamState,
        audio_bs: jax.Array | None = None,
        num_samples_b: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """End the streams with optional last samples (the first `num_samples_b` of each row
        are real) -> (B, N, D) remaining encodings and (B, N) valid frames: the front end's
        remaining frames go through as many (padded) encoder calls as they need."""
        feats, num_feats = self.frontend.stream_flush(state.frontend, audio_bs, num_samples_b)
        enc_state, outs, valids = state.encoder, [], []
        while True:
            n = self.encoder.stream_frames(first=not enc_state.started)
            chunk = feats[:, :n]
            chunk = jnp.pad(chunk, ((0, 0), (0, n - chunk.shape[1]), (0, 0)))
            enc, valid, enc_state = self.encoder.stream_step(
                enc_state, chunk, jnp.clip(num_feats, 0, n).astype(jnp.int32)
            )
            outs.append(enc)
            valids.append(valid)
            feats, num_feats = feats[:, n:], num_feats - n
            if feats.shape[1] == 0:
                break
        return jnp.concatenate(outs, axis=1), jnp.concatenate(valids, axis=1)
