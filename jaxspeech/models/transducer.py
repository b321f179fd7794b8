"""RNN-T (transducer) parts: a predictor (the "decoder" of icefall) and a joiner.

The predictor turns the labels emitted so far into a vector; the joiner combines it
with one encoder frame into logits over the vocabulary (blank included). Two
predictors, chosen by config:

- `StatelessPredictor` (Ghodsi et al. 2020; icefall's default): an embedding of the
  last `context_size` labels mixed by a depthwise convolution. Cheap, and its state
  in decoding is just those labels.
- `LSTMPredictor`: an embedding and stacked LSTM layers (the classic RNN-T).

Both offer the same two views: the whole label sequence at once for training
(`__call__`), and one label at a time with an explicit state for decoding
(`init_state` / `step`), which `jaxspeech.decoding.rnnt` drives.

The joiner is split so the loss can project each side once: `project_enc` (B, T, D)
and `project_pred` (B, U+1, D) run outside the T x U lattice, and only
`joint(a, b) = out(tanh(a + b))` runs per lattice cell. The "simple" projections
(`simple_am`, `simple_lm`) are the trivial joiner of the pruned loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.layers import Dense, Dtype, LayerNorm, logical_init
from jaxspeech.models.lstm import LSTMLayer
from jaxspeech.parallel.rules import constrain

PREDICTORS = ("stateless", "lstm")


def _embedding(vocab_size: int, dim: int, rngs: nnx.Rngs) -> nnx.Param:
    init = logical_init(nnx.initializers.normal(1.0), ("vocab", "embed"))
    return nnx.Param(init(rngs.params(), (vocab_size, dim)))


class StatelessPredictor(nnx.Module):
    """Labels -> (B, U+1, D): embedding of the last `context_size` labels, depthwise conv, ReLU.

    Row u sees labels u - context_size + 1 .. u (1-based), blank standing in for labels
    before the first: row 0 is the start-of-sequence output.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        *,
        context_size: int = 2,
        blank_id: int = 0,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if context_size < 1:
            raise ValueError(f"predictor context_size must be >= 1, got {context_size}")
        self.embed = _embedding(vocab_size, dim, rngs)
        # Mixing weights per context position and channel; initialised to average.
        self.conv = nnx.Param(
            logical_init(nnx.initializers.constant(1.0 / context_size), ("conv", "embed"))(
                rngs.params(), (context_size, dim)
            )
        )
        self.context_size = context_size
        self.blank_id = blank_id
        self.output_dim = dim
        self.dtype = dtype

    def _mix(self, emb_bkd: jax.Array) -> jax.Array:
        """(..., K, D) embeddings of K consecutive labels -> (..., D)."""
        return jax.nn.relu(jnp.einsum("...kd,kd->...d", emb_bkd, self.conv[...].astype(self.dtype)))

    def __call__(self, labels_bu: jax.Array) -> jax.Array:
        """(B, U) int32 labels -> (B, U+1, D) outputs (row u: after u labels)."""
        k, u = self.context_size, labels_bu.shape[1]
        ys = jnp.pad(labels_bu, ((0, 0), (k, 0)), constant_values=self.blank_id)  # (B, U+K)
        emb = self.embed[...].astype(self.dtype)[ys]
        # windows[b, u, j] = emb[b, u + j]: row u's K most recent labels, oldest first.
        windows = jnp.stack([emb[:, j : j + u + 1] for j in range(k)], axis=2)
        return constrain(self._mix(windows), ("batch", "time", "embed"))

    def init_state(self, batch_size: int) -> jax.Array:
        """(B, K) int32: the last K labels, all blank at the start."""
        # broadcast_to, not jnp.full: an exported predictor has a symbolic batch, which
        # the ONNX converter's jnp.full cannot take.
        blank = jnp.asarray(self.blank_id, jnp.int32)
        return jnp.broadcast_to(blank, (batch_size, self.context_size))

    def step(self, state_bk: jax.Array, tokens_b: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Feed one label per row -> ((B, D) output, new state)."""
        state = jnp.concatenate([state_bk[:, 1:], tokens_b[:, None].astype(jnp.int32)], axis=1)
        return self._mix(self.embed[...].astype(self.dtype)[state]), state


class LSTMPredictor(nnx.Module):
    """Labels -> (B, U+1, D): embedding, `num_layers` LSTM layers, LayerNorm."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        *,
        num_layers: int = 1,
        hidden: int = 0,
        blank_id: int = 0,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if num_layers < 1:
            raise ValueError(f"predictor num_layers must be >= 1, got {num_layers}")
        hidden = hidden or dim
        self.embed = _embedding(vocab_size, dim, rngs)
        # proj_dim=dim when hidden != dim: each layer outputs `dim` (LSTMP), so layers stack.
        proj = dim if hidden != dim else 0
        self.layers = nnx.List(
            [
                LSTMLayer(dim, hidden, proj_dim=proj, dtype=dtype, rngs=rngs)
                for _ in range(num_layers)
            ]
        )
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.blank_id = blank_id
        self.output_dim = dim
        self.dtype = dtype

    def __call__(self, labels_bu: jax.Array) -> jax.Array:
        ys = jnp.pad(labels_bu, ((0, 0), (1, 0)), constant_values=self.blank_id)  # (B, U+1)
        x = self.embed[...].astype(self.dtype)[ys]
        # Padding labels sit after the real ones, so a causal LSTM never lets them reach
        # valid rows; no mask needed.
        mask = jnp.ones(ys.shape, bool)
        for layer in self.layers:
            x = layer(x, mask)
        return constrain(self.norm(x), ("batch", "time", "embed"))

    def init_state(self, batch_size: int) -> tuple:
        return tuple(layer.init_carry(batch_size) for layer in self.layers)

    def step(self, state: tuple, tokens_b: jax.Array) -> tuple[jax.Array, tuple]:
        x = self.embed[...].astype(self.dtype)[tokens_b]
        new_state = []
        for layer, carry in zip(self.layers, state):
            carry, x = layer.step(carry, x)
            new_state.append(carry)
        return self.norm(x), tuple(new_state)


class Joiner(nnx.Module):
    """logits = out(tanh(enc_proj(enc) + pred_proj(pred))), split for lattice efficiency."""

    def __init__(
        self,
        enc_dim: int,
        pred_dim: int,
        joiner_dim: int,
        vocab_size: int,
        *,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.enc_proj = Dense(enc_dim, joiner_dim, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.pred_proj = Dense(pred_dim, joiner_dim, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.out = Dense(joiner_dim, vocab_size, ("mlp", "vocab"), dtype=dtype, rngs=rngs)

    def joint(self, enc_proj: jax.Array, pred_proj: jax.Array) -> jax.Array:
        """Broadcastable projected inputs (..., J) -> float32 logits (..., V)."""
        return self.out(jnp.tanh(enc_proj + pred_proj)).astype(jnp.float32)


class Transducer(nnx.Module):
    """Predictor + joiner + the simple (linear) joiner of the pruned loss."""

    def __init__(
        self,
        *,
        enc_dim: int,
        vocab_size: int,
        joiner_dim: int,
        predictor: str = "stateless",
        predictor_dim: int = 256,
        context_size: int = 2,
        lstm_layers: int = 1,
        lstm_hidden: int = 0,
        blank_id: int = 0,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if predictor == "stateless":
            self.predictor = StatelessPredictor(
                vocab_size,
                predictor_dim,
                context_size=context_size,
                blank_id=blank_id,
                dtype=dtype,
                rngs=rngs,
            )
        elif predictor == "lstm":
            self.predictor = LSTMPredictor(
                vocab_size,
                predictor_dim,
                num_layers=lstm_layers,
                hidden=lstm_hidden,
                blank_id=blank_id,
                dtype=dtype,
                rngs=rngs,
            )
        else:
            raise ValueError(f"unknown predictor {predictor!r}; choose one of {PREDICTORS}")
        self.joiner = Joiner(enc_dim, predictor_dim, joiner_dim, vocab_size, dtype=dtype, rngs=rngs)
        self.simple_am = Dense(enc_dim, vocab_size, ("embed", "vocab"), dtype=dtype, rngs=rngs)
        self.simple_lm = Dense(
            predictor_dim, vocab_size, ("embed", "vocab"), dtype=dtype, rngs=rngs
        )
        self.blank_id = blank_id

    def decoder_fns(self) -> tuple:
        """(pred_init, pred_step, joint) for `jaxspeech.decoding.rnnt` on projected encodings.

        pred_step returns the *projected* predictor output, so the decoder's joint is one
        add + tanh + matmul per hypothesis and frame.
        """

        def pred_step(state, tokens_b):
            out, state = self.predictor.step(state, tokens_b)
            return self.joiner.pred_proj(out), state

        return self.predictor.init_state, pred_step, self.joiner.joint
