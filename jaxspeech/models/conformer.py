"""Conformer encoder: x4 or x8 subsampling, then blocks of FFN/2 -> MHSA -> Conv -> FFN/2 -> LN.

Streaming (all off by default, and then the encoder is exactly the full-context model):
- `causal=True`: the depthwise convolutions see only past frames.
- `chunk_size=C`, `left_chunks=L`: subsampled frame i (chunk c = i // C) attends frame j
  iff c - L <= j // C <= c (no lower bound when L < 0) -- the training-time simulation
  of a stream that emits C frames at a time (WeNet U2, icefall).
- `dynamic_chunk=True`: training draws one chunk size per batch (`draw_chunk_size`; the
  same `left_chunks` applies), so one model serves any chunk size at inference (set
  `chunk_size` before `init_stream`).
- `init_stream` / `stream_step`: chunk-by-chunk inference with carried caches that
  equals the masked full-sequence computation (see `stream_step` for the contract).
  From raw audio: `Frontend.stream_step` emits feature frames as their windows complete;
  buffer them and call `stream_step` whenever `stream_frames(first=...)` are available.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxspeech.audio.features import floor_div
from jaxspeech.models.attention_ops import POSITION_ENCODINGS
from jaxspeech.models.layers import (
    ConvModule,
    Dropout,
    Dtype,
    FeedForward,
    LayerNorm,
    RelPositionAttention,
    RotaryAttention,
    layer_stack,
    pipelined_stack,
)
from jaxspeech.models.subsampling import Conv2dSubsampling, subsampled_length
from jaxspeech.parallel import pipeline
from jaxspeech.parallel.rules import constrain

# What each Conformer block keeps for the backward pass: "none" keeps every activation,
# "full" recomputes the block, "dots" keeps only the outputs of weight matmuls (the
# expensive part) and recomputes the cheap element-wise ops and attention probabilities.
REMAT_POLICIES = {
    "none": None,
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def length_mask(lengths_b: jax.Array, t: int) -> jax.Array:
    """(B,) lengths -> (B, T) bool, True on valid frames."""
    return jax.lax.broadcasted_iota(jnp.int32, (1, t), 1) < lengths_b[:, None]


def chunk_attention_mask(t: int, chunk_size: int | jax.Array, left_chunks: int) -> jax.Array:
    """(T, T) bool: query i may attend key j (chunks of `chunk_size` >= 1 frames, may be traced).

    chunk(j) <= chunk(i), and chunk(j) >= chunk(i) - left_chunks when left_chunks >= 0.
    """
    chunk_t = floor_div(jax.lax.broadcasted_iota(jnp.int32, (t,), 0), chunk_size)
    q, k = chunk_t[:, None], chunk_t[None, :]
    allowed = k <= q
    if left_chunks >= 0:
        allowed &= k >= q - left_chunks
    return allowed


def draw_chunk_size(key: jax.Array, max_chunk: int, full_size: int) -> jax.Array:
    """One dynamic-chunk-training chunk size, () int32: `full_size` (full context) with
    probability 1/2, else uniform on [1, max_chunk].

    WeNet draws r ~ U{1, ..., T-1} and takes full context if r > T // 2, else r % 25 + 1:
    full context with probability ~1/2 and a chunk size that is only uniform when T // 2
    is a multiple of 25. We keep the two halves and make both exact and independent of T.
    """
    k_full, k_size = jax.random.split(key)
    size = jax.random.randint(k_size, (), 1, max_chunk + 1, dtype=jnp.int32)
    return jnp.where(jax.random.bernoulli(k_full, 0.5), jnp.int32(full_size), size)


class ConformerBlock(nnx.Module):
    """One macaron Conformer block (pre-LN residuals, final LayerNorm).

    pos_enc: "rel" (Transformer-XL relative positions, `RelPositionAttention`) or "rope"
    (rotary embeddings, `RotaryAttention`: no positional bias, so a fused kernel runs it);
    attention: the kernel, "auto" | "cudnn" | "xla" (`attention_ops.resolve_attention`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ff_mult: int,
        conv_kernel: int,
        dropout: float,
        *,
        causal: bool = False,
        pos_enc: str = "rel",
        attention: str = "auto",
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if pos_enc not in POSITION_ENCODINGS:
            raise ValueError(f"pos_enc must be one of {POSITION_ENCODINGS}, got {pos_enc!r}")
        self.ff1 = FeedForward(dim, ff_mult * dim, dropout, dtype=dtype, rngs=rngs)
        attn = RelPositionAttention if pos_enc == "rel" else RotaryAttention
        self.attn = attn(dim, num_heads, dropout, dtype=dtype, rngs=rngs, attention=attention)
        self.conv = ConvModule(dim, conv_kernel, dropout, causal=causal, dtype=dtype, rngs=rngs)
        self.ff2 = FeedForward(dim, ff_mult * dim, dropout, dtype=dtype, rngs=rngs)
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)

    def __call__(
        self,
        x_btd: jax.Array,
        mask_bt: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
        attn_mask: jax.Array | None = None,
    ) -> jax.Array:
        """attn_mask: (B, T, T) query x key mask for the attention (default: mask_bt's keys)."""
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = x_btd + 0.5 * self.ff1(x_btd, **kw)
        x = x + self.attn(x, mask_bt if attn_mask is None else attn_mask, **kw)
        x = x + self.conv(x, mask_bt, **kw)
        x = x + 0.5 * self.ff2(x, **kw)
        return constrain(self.norm(x), ("batch", "time", "embed"))

    def stream(
        self,
        x_bcd: jax.Array,
        valid_bc: jax.Array,
        cache_valid_bl: jax.Array,
        caches: tuple[jax.Array, jax.Array, jax.Array],
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        """One chunk through the block; caches = (keys, values, conv) of this layer."""
        keys, values, conv = caches
        kw = dict(deterministic=True, rngs=None)
        x = x_bcd + 0.5 * self.ff1(x_bcd, **kw)
        a, keys, values = self.attn.stream(x, valid_bc, keys, values, cache_valid_bl)
        x = x + a
        c, conv = self.conv.stream(x, valid_bc, conv)
        x = x + c
        x = x + 0.5 * self.ff2(x, **kw)
        return self.norm(x), (keys, values, conv)


@struct.dataclass
class EncoderStreamState:
    """Carried state of `ConformerEncoder.stream_step` (a pytree; `started` is static).

    Shapes: N layers, B streams, O = receptive field - factor feature frames of
    subsampling overlap, L cached attention frames, H heads, K head dim, W = conv kernel - 1.
    """

    feats_bof: jax.Array  # (B, O, F) last feature frames of the previous window
    feats_seen_b: jax.Array  # (B,) int32 real feature frames consumed so far
    frames_out: jax.Array  # () int32 encoder frames emitted so far (a multiple of C)
    cache_valid_bl: jax.Array  # (B, L) bool: the cache slot holds a real frame
    keys_nblhk: jax.Array  # (N, B, L, H, K) attention keys of the last L frames
    values_nblhk: jax.Array  # (N, B, L, H, K) attention values of the last L frames
    conv_nbwd: jax.Array  # (N, B, W, D) gated conv inputs of the last W frames
    started: bool = struct.field(pytree_node=False, default=False)


class ConformerEncoder(nnx.Module):
    """(B, T, F) normalized features -> (B, T', D) encodings and (B,) output lengths."""

    def __init__(
        self,
        *,
        num_features: int,
        dim: int,
        num_layers: int,
        num_heads: int,
        ff_mult: int = 4,
        conv_kernel: int = 15,
        subsampling_channels: int = 64,
        dropout: float = 0.1,
        scan_layers: bool = False,
        subsampling_factor: int = 4,
        causal: bool = False,
        chunk_size: int = 0,
        left_chunks: int = -1,
        dynamic_chunk: bool = False,
        max_dynamic_chunk: int = 25,
        remat: str = "none",
        pos_enc: str = "rel",
        attention: str = "auto",
        pipeline_microbatches: int = 4,
        pipeline_repeats: int = 1,
        pipeline_gather_once: bool = True,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {tuple(REMAT_POLICIES)}, got {remat!r}")
        if chunk_size < 0:
            raise ValueError(f"chunk_size must be >= 0 (0 = full context), got {chunk_size}")
        if dynamic_chunk and max_dynamic_chunk < 1:
            raise ValueError(f"max_dynamic_chunk must be >= 1, got {max_dynamic_chunk}")
        self.subsampling = Conv2dSubsampling(
            num_features,
            subsampling_channels,
            dim,
            factor=subsampling_factor,
            dtype=dtype,
            rngs=rngs,
        )
        self.dropout = Dropout(dropout)
        self.num_layers = num_layers
        self.scan_layers = scan_layers
        self.output_dim = dim
        self.num_features = num_features
        self.num_heads = num_heads
        self.conv_kernel = conv_kernel
        self.causal = causal
        self.chunk_size = chunk_size
        self.left_chunks = left_chunks
        self.dynamic_chunk = dynamic_chunk
        self.max_dynamic_chunk = max_dynamic_chunk
        self.remat = remat
        # On a mesh with a stage axis > 1 the scanned blocks run as a pipeline of that many
        # stages (jaxspeech.parallel.pipeline); elsewhere (one device, export) as a scan.
        self.pipeline_microbatches = pipeline_microbatches
        self.pipeline_repeats = pipeline_repeats
        self.pipeline_gather_once = pipeline_gather_once
        self.dtype = dtype
        make = lambda r: ConformerBlock(
            dim,
            num_heads,
            ff_mult,
            conv_kernel,
            dropout,
            causal=causal,
            pos_enc=pos_enc,
            attention=attention,
            dtype=dtype,
            rngs=r,
        )
        self.blocks = layer_stack(make, num_layers, scan_layers, rngs, axis="layers")

    def __call__(
        self,
        feats_btf: jax.Array,
        lengths_b: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        x, lengths = self.subsampling(feats_btf, lengths_b)
        x = constrain(x, ("batch", "time", "embed"))
        x = self.dropout(x, deterministic=deterministic, rngs=rngs)
        mask = length_mask(lengths, x.shape[1])
        attn_mask = self._chunk_mask(mask, deterministic=deterministic, rngs=rngs)

        def body(x, block, rngs):
            return block(x, mask, deterministic=deterministic, rngs=rngs, attn_mask=attn_mask)

        if self.remat != "none":
            body = nnx.remat(body, policy=REMAT_POLICIES[self.remat])
        if not self.scan_layers:
            for block in self.blocks:
                x = body(x, block, rngs)
            return x, lengths
        if pipeline.stages_in_mesh() > 1:
            return self._pipelined(x, mask, attn_mask, deterministic, rngs), lengths
        if rngs is None or deterministic:
            scan = nnx.scan(
                lambda x, b: body(x, b, None), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry
            )
            return scan(x, self.blocks), lengths
        # Each layer draws its dropout masks from its own split of the streams.
        scan = nnx.split_rngs(splits=self.num_layers)(
            nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry)
        )
        return scan(x, self.blocks, rngs), lengths

    def _pipelined(
        self,
        x_btd: jax.Array,
        mask_bt: jax.Array,
        attn_mask: jax.Array | None,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> jax.Array:
        """The scanned blocks as a pipeline over the mesh's stage axis (`pipelined_stack`);
        the padding (and chunk) masks travel with the microbatches."""

        def call(block, x, ex, r):
            return block(
                x, ex["mask"], deterministic=deterministic, rngs=r, attn_mask=ex.get("attn")
            )

        extras = {"mask": mask_bt} | ({"attn": attn_mask} if attn_mask is not None else {})
        return pipelined_stack(
            self.blocks,
            x_btd,
            extras,
            call,
            microbatches=self.pipeline_microbatches,
            repeats=self.pipeline_repeats,
            gather_once=self.pipeline_gather_once,
            key=rngs.dropout() if rngs is not None and not deterministic else None,
        )

    def _chunk_mask(
        self, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array | None:
        """(B, T, T) attention mask of the chunk configuration, or None for full context."""
        t = mask_bt.shape[1]
        if self.dynamic_chunk and not deterministic:
            if rngs is None:
                raise ValueError("dynamic chunk training needs rngs (a 'chunk' or default stream)")
            # A traced size: every batch runs the same compiled step, whatever was drawn.
            chunk = draw_chunk_size(rngs.chunk(), self.max_dynamic_chunk, t)
        elif self.chunk_size > 0:
            chunk = self.chunk_size
        else:
            return None
        return mask_bt[:, None, :] & chunk_attention_mask(t, chunk, self.left_chunks)[None]

    # ---------------------------------------------------------------------------------
    # Streaming inference.
    # ---------------------------------------------------------------------------------

    def stream_frames(self, *, first: bool) -> int:
        """Feature frames one `stream_step` call takes: factor * C, plus on the first call the
        receptive field - factor frames (3 for x4, 7 for x8) that every later window
        shares with the one before it (carried in the state)."""
        self._check_streamable()
        s = self.subsampling.factor
        return s * self.chunk_size + (self.subsampling.receptive_field - s if first else 0)

    def init_stream(self, batch_size: int, *, max_history: int | None = None) -> EncoderStreamState:
        """Empty state for `batch_size` streams.

        The attention cache holds left_chunks * C frames. With left_chunks < 0 (unlimited)
        it holds `max_history` frames: exact for the first max_history + C encoder frames,
        after which the oldest frames fall out (a multiple of C then behaves exactly as
        left_chunks = max_history // C).
        """
        self._check_streamable()
        if self.left_chunks >= 0:
            history = self.left_chunks * self.chunk_size
        elif max_history is None or max_history < 0:
            raise ValueError("left_chunks < 0 (unlimited) needs max_history >= 0 cached frames")
        else:
            history = max_history
        b, n, dt = batch_size, self.num_layers, self.dtype
        h = self.num_heads
        k = self.output_dim // h
        overlap = self.subsampling.receptive_field - self.subsampling.factor
        return EncoderStreamState(
            feats_bof=jnp.zeros((b, overlap, self.num_features), jnp.float32),
            feats_seen_b=jnp.zeros((b,), jnp.int32),
            frames_out=jnp.zeros((), jnp.int32),
            cache_valid_bl=jnp.zeros((b, history), bool),
            keys_nblhk=jnp.zeros((n, b, history, h, k), dt),
            values_nblhk=jnp.zeros((n, b, history, h, k), dt),
            conv_nbwd=jnp.zeros((n, b, self.conv_kernel - 1, self.output_dim), dt),
        )

    def stream_step(
        self,
        state: EncoderStreamState,
        feats_bnf: jax.Array,
        num_frames_b: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array, EncoderStreamState]:
        """Consume the next feature frames; emit the next C encoder frames (deterministic).

        Contract. Encoder frame t reads feature frames s*t .. s*t + r - 1 (s = 4 or 8, r = 7
        or 15), so chunk c (frames cC .. cC + C - 1) needs the features up to s*C*(c + 1) +
        r - s - 1: the first call takes s*C + r - s frames (`stream_frames(first=True)`),
        every later call the next s*C (`stream_frames(first=False)`); the r - s frames a
        window shares with the previous one are carried in the state. That is the least
        input that completes a chunk, so a stream adds no latency beyond the chunk itself.

        End of a stream: pad the last call to its full size and pass `num_frames_b`, the real
        frames among the new ones per stream (default: all; 0 for streams already ended).
        The encoder frames whose receptive field reaches a padded frame are marked invalid,
        exactly the frames past `subsampled_length(total frames)` of the full computation,
        and are masked out of attention and the convolution as its padding is. A stream
        takes ceil(T' / C) calls for T' encoder frames; after a short call it is finished.

        Args:
          state: from `init_stream` or the previous call.
          feats_bnf: (B, N, F) normalized feature frames, N = stream_frames(first=...).
          num_frames_b: (B,) int32 real frames among the N, or None.
        Returns:
          (B, C, D) encodings, (B, C) bool valid frames, and the new state.
        """
        s, c = self.subsampling.factor, self.chunk_size
        n = feats_bnf.shape[1]
        expected = self.stream_frames(first=not state.started)
        if n != expected:
            which = "later" if state.started else "first"
            raise ValueError(f"the {which} stream_step call takes {expected} frames, got {n}")
        if num_frames_b is None:
            # broadcast_to, not full: jax2onnx lowers jnp.full only for constant shapes
            num_frames_b = jnp.broadcast_to(jnp.int32(n), feats_bnf.shape[:1])
        real = jax.lax.broadcasted_iota(jnp.int32, (1, n), 1) < num_frames_b[:, None]
        feats = jnp.where(real[..., None], feats_bnf.astype(jnp.float32), 0.0)
        window = jnp.concatenate([state.feats_bof, feats], axis=1) if state.started else feats
        x, _ = self.subsampling(window, num_frames_b)  # exactly C frames (VALID convs)
        seen = state.feats_seen_b + num_frames_b
        frame = state.frames_out + jax.lax.broadcasted_iota(jnp.int32, (1, c), 1)
        valid = frame < subsampled_length(seen, s)[:, None]

        caches = (state.keys_nblhk, state.values_nblhk, state.conv_nbwd)
        if self.scan_layers:

            def body(x, block, keys, values, conv):
                return block.stream(x, valid, state.cache_valid_bl, (keys, values, conv))

            scan = nnx.scan(body, in_axes=(nnx.Carry, 0, 0, 0, 0), out_axes=(nnx.Carry, 0))
            x, caches = scan(x, self.blocks, *caches)
        else:
            per_layer = []
            for i, block in enumerate(self.blocks):
                x, layer = block.stream(x, valid, state.cache_valid_bl, tuple(a[i] for a in caches))
                per_layer.append(layer)
            caches = tuple(jnp.stack(a) for a in zip(*per_layer))
        history = state.cache_valid_bl.shape[1]
        cache_valid = jnp.concatenate([state.cache_valid_bl, valid], axis=1)
        overlap = state.feats_bof.shape[1]
        new_state = EncoderStreamState(
            feats_bof=window[:, window.shape[1] - overlap :],
            feats_seen_b=seen,
            frames_out=state.frames_out + c,
            cache_valid_bl=cache_valid[:, cache_valid.shape[1] - history :],
            keys_nblhk=caches[0],
            values_nblhk=caches[1],
            conv_nbwd=caches[2],
            started=True,
        )
        return x, valid, new_state

    def _check_streamable(self) -> None:
        if self.chunk_size <= 0:
            raise ValueError("streaming needs chunk_size > 0 (the C frames each step emits)")
        if not self.causal:
            raise ValueError("streaming needs causal=True (a centred convolution sees the future)")
