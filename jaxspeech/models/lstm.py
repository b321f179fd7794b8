"""LSTM acoustic encoders: (B)LSTM / LSTMP stacks with low-frame-rate input and output delay.

The encoder family of the hybrid LSTM acoustic models in the references (a 5 x 768
unidirectional LSTM with a three-frame look-ahead on 3-frame stacked, 30 ms
features; a 5 x 768 BLSTM teacher), with the same interface as `ConformerEncoder`
so a CTC or transducer head takes either.

Shapes: B batch, T frames, F features, D input dim, H cell units, P output width of
one direction (the projection size for LSTMP, else H), G = 4 gates (i, f, g, o).

Every step of the recurrence runs inside one `lax.scan`; the input half of the gate
pre-activations, x_t W_x for all t, is one (B*T, D) x (D, 4H) matmul done before the
scan, so the sequential part is only h_{t-1} W_h and the elementwise cell update.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.audio.features import floor_div
from jaxspeech.models.conformer import length_mask
from jaxspeech.models.layers import Dense, Dropout, Dtype, LayerNorm, dense_init, logical_init
from jaxspeech.parallel.rules import constrain

Carry = tuple[jax.Array, jax.Array]


def _gate_bias_init(
    key: jax.Array, shape: tuple[int, ...], dtype: Dtype = jnp.float32
) -> jax.Array:
    """(4, H) zeros with the forget-gate row (index 1) at 1.

    A forget bias of 1 keeps the cell state open at the start of training, so
    gradients reach early frames (Jozefowicz et al., 2015).
    """
    del key
    return jnp.zeros(shape, dtype).at[1].set(1.0)


class LSTMLayer(nnx.Module):
    """One unidirectional LSTM, optionally with a recurrent projection (LSTMP, Sak et al. 2014).

    i, f, g, o = sigma, sigma, tanh, sigma of (x_t W_x + h_{t-1} W_h + b)
    c_t = f * c_{t-1} + i * g;  m_t = o * tanh(c_t);  h_t = m_t W_p (LSTMP) or m_t.

    Sharding: every parameter keeps the 4 gates of one cell unit together on its
    "mlp" (tensor) axis, so the elementwise cell update never needs another
    device's gates. The recurrent kernel's input dimension is left unsharded (no
    "embed"/FSDP): it is read on every time step, and an FSDP-sharded recurrent
    kernel could cost an all-gather per frame instead of one per sequence.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        *,
        proj_dim: int = 0,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if proj_dim < 0:
            raise ValueError(f"proj_dim must be >= 0 (0 = no projection), got {proj_dim}")
        out_dim = proj_dim or hidden
        self.w_x = nnx.Param(
            logical_init(dense_init(), ("embed", None, "mlp"))(rngs.params(), (in_dim, 4, hidden))
        )
        self.w_h = nnx.Param(
            logical_init(dense_init(), (None, None, "mlp"))(rngs.params(), (out_dim, 4, hidden))
        )
        self.bias = nnx.Param(
            logical_init(_gate_bias_init, (None, "mlp"))(rngs.params(), (4, hidden))
        )
        self.w_proj = (
            nnx.Param(logical_init(dense_init(), ("mlp", None))(rngs.params(), (hidden, proj_dim)))
            if proj_dim
            else None
        )
        self.in_dim = in_dim
        self.hidden = hidden
        self.out_dim = out_dim
        self.dtype = dtype
        # The cell state accumulates over thousands of frames: keep it in float32 even
        # when the matmuls run in bfloat16 (float64 stays float64, for gradient checks).
        self.state_dtype = jnp.promote_types(dtype, jnp.float32)

    def init_carry(self, batch_size: int) -> Carry:
        """Zero state: h (B, P) and c (B, H), both in the state dtype (float32 or wider)."""
        return (
            jnp.zeros((batch_size, self.out_dim), self.state_dtype),
            jnp.zeros((batch_size, self.hidden), self.state_dtype),
        )

    def _input_gates(self, x: jax.Array) -> jax.Array:
        """(..., D) -> (..., 4, H) input pre-activations plus bias, in the state dtype."""
        dt = self.dtype
        xg = jnp.einsum("...d,dgh->...gh", x.astype(dt), self.w_x[...].astype(dt))
        return xg.astype(self.state_dtype) + self.bias[...].astype(self.state_dtype)

    def _cell(
        self, carry: Carry, xg_bgh: jax.Array, w_h: jax.Array, w_proj: jax.Array | None
    ) -> Carry:
        """One recurrence step from input pre-activations (B, 4, H); returns the new (h, c)."""
        dt, st = self.dtype, self.state_dtype
        h, c = carry
        gates = xg_bgh + jnp.einsum("bp,pgh->bgh", h.astype(dt), w_h).astype(st)
        i = jax.nn.sigmoid(gates[:, 0])
        f = jax.nn.sigmoid(gates[:, 1])
        g = jnp.tanh(gates[:, 2])
        o = jax.nn.sigmoid(gates[:, 3])
        c = f * c + i * g
        h = o * jnp.tanh(c)
        if w_proj is not None:
            h = jnp.dot(h.astype(dt), w_proj).astype(st)
        return h, c

    def _weights(self) -> tuple[jax.Array, jax.Array | None]:
        dt = self.dtype
        w_proj = None if self.w_proj is None else self.w_proj[...].astype(dt)
        return self.w_h[...].astype(dt), w_proj

    def step(self, carry: Carry, x_bd: jax.Array) -> tuple[Carry, jax.Array]:
        """One time step: ((B, P), (B, H)) carry and (B, D) input -> new carry, (B, P) output."""
        carry = self._cell(carry, self._input_gates(x_bd), *self._weights())
        return carry, carry[0].astype(self.dtype)

    def __call__(self, x_btd: jax.Array, mask_bt: jax.Array, *, reverse: bool = False) -> jax.Array:
        """(B, T, D) inputs, (B, T) bool valid frames -> (B, T, P) outputs, zeros on masked frames.

        A masked frame leaves the carry untouched. With `reverse=True` time runs from
        T - 1 down to 0, so the carry is still the zero state when it reaches a row's
        last valid frame: each row starts at its own end and padding never reaches a
        valid output. Outputs are in the original time order either way.
        """
        b = x_btd.shape[0]
        xg = constrain(self._input_gates(x_btd), ("batch", "time", None, "mlp"))
        w_h, w_proj = self._weights()

        def body(carry: Carry, inputs: tuple[jax.Array, jax.Array]) -> tuple[Carry, jax.Array]:
            xg_bgh, m_b = inputs
            new = self._cell(carry, xg_bgh, w_h, w_proj)
            m = m_b[:, None]
            carry = (jnp.where(m, new[0], carry[0]), jnp.where(m, new[1], carry[1]))
            return carry, jnp.where(m, new[0], 0.0).astype(self.dtype)

        # Time-major for the scan; the transposes are one copy each, outside the loop.
        xs = (jnp.swapaxes(xg, 0, 1), jnp.swapaxes(mask_bt, 0, 1))
        if reverse and not isinstance(x_btd.shape[1], int):
            # A symbolic T (an exported model): jax2onnx lowers no reverse scan; flip
            # time, scan forward, flip back (the same computation).
            xs = jax.tree.map(lambda a: jnp.flip(a, 0), xs)
            _, ys_tbp = jax.lax.scan(body, self.init_carry(b), xs)
            return jnp.swapaxes(jnp.flip(ys_tbp, 0), 0, 1)
        _, ys_tbp = jax.lax.scan(body, self.init_carry(b), xs, reverse=reverse)
        return jnp.swapaxes(ys_tbp, 0, 1)


def stack_frames(feats_btf: jax.Array, lengths_b: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Low frame rate input: (B, T, F) -> (B, ceil(T / k), k * F), lengths -> ceil(lengths / k).

    Output frame j is the concatenation of input frames jk, jk + 1, ..., jk + k - 1
    (non-overlapping, frame jk first). Frames at or past a row's length, and the
    frames that pad T up to a multiple of k, are zeros, so the last stacked frame
    of a row whose length is not a multiple of k is zero-padded and no padding
    content reaches a valid frame. k = 1 only zeroes the padding.
    """
    if k < 1:
        raise ValueError(f"stack_frames must be >= 1, got {k}")
    b, t, f = feats_btf.shape
    x = jnp.where(length_mask(lengths_b, t)[..., None], feats_btf, 0.0)
    # (t + k - 1) // k, not -(-t // k): jax2onnx lowers a symbolic floordiv with ONNX's
    # truncating integer Div, wrong for a negative numerator.
    t_out = (t + k - 1) // k
    if isinstance(t, int):
        x = jnp.pad(x, ((0, 0), (0, t_out * k - t), (0, 0)))
    else:
        # A symbolic T (an exported model): pad by a constant (ONNX Pad needs constant
        # widths), then cut to t_out * k frames.
        x = jax.lax.slice_in_dim(jnp.pad(x, ((0, 0), (0, k - 1), (0, 0))), 0, t_out * k, axis=1)
    return x.reshape(b, t_out, k * f), -floor_div(-lengths_b, k)


class LSTMEncoder(nnx.Module):
    """(B, T, F) normalized features -> (B, T', output_dim) encodings and (B,) output lengths.

    stack_frames -> num_layers x (LSTM | BLSTM), dropout between layers -> LayerNorm -> Dense.
    T' = ceil(T / stack_frames). `lookahead = n` delays the output by n (stacked)
    frames: the unidirectional stack runs over each row's valid frames followed by n
    zero frames (what a streaming recognizer feeds at end of stream), and its
    outputs are shifted left by n, so the encoding of frame t has seen inputs up to
    t + n through every layer. A delayed output was chosen over splicing n future
    frames onto each input: it adds no parameters, keeps the input width, and is
    exactly how the model runs when streaming (emit frame t once t + n has arrived).

    `output_dim` defaults to `hidden`. Encodings past a row's output length do not
    depend on the padding's content but are not zeros. The references' trick of
    stacking each utterance at all k offsets to use every frame is a data-side
    augmentation and is not done here.
    """

    def __init__(
        self,
        *,
        num_features: int,
        hidden: int,
        num_layers: int,
        bidirectional: bool = False,
        proj_dim: int = 0,
        stack_frames: int = 1,
        lookahead: int = 0,
        dropout: float = 0.0,
        output_dim: int | None = None,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        if lookahead and bidirectional:
            raise ValueError(
                "lookahead applies to unidirectional encoders only: a bidirectional "
                "encoder already sees the whole utterance"
            )
        if stack_frames < 1:
            raise ValueError(f"stack_frames must be >= 1, got {stack_frames}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.stack_frames = stack_frames
        self.lookahead = lookahead
        self.bidirectional = bidirectional
        self.output_dim = output_dim or hidden
        width = (proj_dim or hidden) * (2 if bidirectional else 1)
        in_dims = [num_features * stack_frames] + [width] * (num_layers - 1)
        make = lambda d: LSTMLayer(d, hidden, proj_dim=proj_dim, dtype=dtype, rngs=rngs)
        self.fw_layers = nnx.List([make(d) for d in in_dims])
        self.bw_layers = nnx.List([make(d) for d in in_dims]) if bidirectional else None
        self.dropout = Dropout(dropout)
        self.norm = LayerNorm(width, dtype=dtype, rngs=rngs)
        self.out = Dense(width, self.output_dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)

    def __call__(
        self,
        feats_btf: jax.Array,
        lengths_b: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """(B, T, F) features, (B,) lengths -> (B, T', output_dim) in `dtype`, (B,) lengths'."""
        x, lengths = stack_frames(feats_btf, lengths_b, self.stack_frames)
        t, n = x.shape[1], self.lookahead
        # The n delay frames after each row's end are valid for the recurrence (their
        # input is the zero padding), then dropped by the shift below.
        x = jnp.pad(x, ((0, 0), (0, n), (0, 0)))
        mask = length_mask(lengths + n, t + n)
        last = len(self.fw_layers) - 1
        for i, layer in enumerate(self.fw_layers):
            y = layer(x, mask)
            if self.bw_layers is not None:
                y = jnp.concatenate([y, self.bw_layers[i](x, mask, reverse=True)], axis=-1)
            if i < last:
                y = self.dropout(y, deterministic=deterministic, rngs=rngs)
            x = y
        x = self.out(self.norm(x[:, n:]))
        return constrain(x, ("batch", "time", "embed")), lengths
