"""Conformer building blocks (Gulati et al., 2020) in Flax NNX.

Every parameter carries logical axis names (see `jaxspeech.parallel.rules`);
no layer names a mesh axis. The attention and convolution modules also run one
chunk at a time against carried caches (`stream`), for streaming inference.
Shapes: B batch, T frames, D model dim, H heads, K head dim, M feed-forward dim,
C chunk frames, L cached frames.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.attention_ops import fused_attention, resolve_attention, rotate
from jaxspeech.parallel import pipeline, rules
from jaxspeech.parallel.rules import constrain

Dtype = jnp.dtype


def logical_init(init: Callable, axes: Sequence[str | None]) -> Callable:
    """Wrap an initializer so the parameter carries logical axis names (sharded later)."""
    return nnx.with_partitioning(init, tuple(axes), eager_sharding=False)


def dense_init(fan_in_axes: int = 1) -> Callable:
    """Lecun-normal-like init for einsum kernels whose first `fan_in_axes` dims are inputs."""
    return nnx.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=tuple(range(fan_in_axes)), out_axis=-1
    )


def layer_stack(
    make: Callable, num_layers: int, scan: bool, rngs: nnx.Rngs, axis: str | None = None
):
    """`num_layers` blocks `make(rngs)`: with `scan`, one block whose every parameter is
    stacked on a leading layer axis (logical name `axis`: "layers" for a stack the
    pipeline splits over stages, None = unsharded), run by `nnx.scan`, so XLA compiles
    the block once instead of num_layers times; else an `nnx.List` of separate blocks."""
    if scan:
        stacked = nnx.vmap(
            make, in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: axis}
        )
        return nnx.split_rngs(splits=num_layers)(stacked)(rngs)
    return nnx.List([make(rngs) for _ in range(num_layers)])


def pipelined_stack(
    blocks: nnx.Module,
    x: jax.Array,
    extras: dict,
    call: Callable,
    *,
    microbatches: int,
    repeats: int,
    gather_once: bool,
    key: jax.Array | None,
) -> jax.Array:
    """A scanned `layer_stack` (axis "layers") applied to (B, ...) `x` as a pipeline over
    the mesh's stage axis (`jaxspeech.parallel.pipeline.run`, `microbatches` and `repeats`
    fitted to B). `extras`: (B, ...) arrays that travel with the microbatches (masks,
    encodings); call(block, x, extras' microbatch, rngs or None) -> x applies one layer.
    Dropout draws from `key` (None: deterministic) folded with the layer group, the
    microbatch and the layer, so every slot draws its own masks.

    `gather_once`: the stack's weights all-gathered over the data-parallel mesh axes
    (FSDP) once, before the loop; their gradients are summed across iterations and
    reduce-scattered once after it. Left to XLA, the gathers sit in the loop body and run
    at every iteration (MaxText's pipeline_fsdp_ag_once)."""
    schedule = pipeline.Schedule(pipeline.stages_in_mesh(), microbatches, repeats)
    schedule = pipeline.fit(schedule, x.shape[0])
    block_def, block_state = nnx.split(blocks)
    if gather_once:
        data_axes = [a for a in rules.batch_axes() if a != pipeline.STAGE_AXIS]
        block_state = rules.constrain_state(block_state, data_axes)

    def apply_group(p, x, ex, group, microbatch):
        def one(x, layer):
            state, index = layer
            r = None
            if key is not None:
                k = jax.random.fold_in(jax.random.fold_in(key, group), microbatch)
                r = nnx.Rngs(dropout=jax.random.fold_in(k, index))
            return call(nnx.merge(block_def, state), x, ex, r), None

        per = jax.tree.leaves(p)[0].shape[0]
        return jax.lax.scan(one, x, (p, jnp.arange(per)))[0]

    return pipeline.run(apply_group, block_state, x, extras, schedule)


class Dropout(nnx.Dropout):
    """nnx.Dropout that returns its input untouched when deterministic, without calling
    nnx.Dropout at all: inference traces no dropout (jax2onnx replaces nnx.Dropout.__call__
    with a version that takes no `rngs` and emits an ONNX Dropout node)."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        if self.deterministic if deterministic is None else deterministic:
            return inputs
        return super().__call__(inputs, deterministic=deterministic, rngs=rngs)


class Dense(nnx.Module):
    """y = x @ W + b with logical axes for W of shape (in, out)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        axes: tuple[str | None, str | None],
        *,
        use_bias: bool = True,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.kernel = nnx.Param(
            logical_init(dense_init(), axes)(rngs.params(), (in_features, out_features))
        )
        self.bias = (
            nnx.Param(
                logical_init(nnx.initializers.zeros, axes[1:])(rngs.params(), (out_features,))
            )
            if use_bias
            else None
        )
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.dot(x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis; statistics in float32 whatever the compute dtype."""

    def __init__(self, dim: int, *, dtype: Dtype = jnp.float32, eps: float = 1e-5, rngs: nnx.Rngs):
        self.scale = nnx.Param(
            logical_init(nnx.initializers.ones, ("embed",))(rngs.params(), (dim,))
        )
        self.bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (dim,))
        )
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(self.dtype)


class FeedForward(nnx.Module):
    """LN -> D x M -> swish -> dropout -> M x D -> dropout (the macaron half-step FFN)."""

    def __init__(self, dim: int, hidden: int, dropout: float, *, dtype: Dtype, rngs: nnx.Rngs):
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.up = Dense(dim, hidden, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.down = Dense(hidden, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout)

    def __call__(
        self, x_btd: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        h = jax.nn.silu(self.up(self.norm(x_btd)))
        h = constrain(h, ("batch", "time", "mlp"))
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return self.dropout(self.down(h), deterministic=deterministic, rngs=rngs)


def distance_sinusoids(dist_r: jax.Array, dim: int) -> jax.Array:
    """(R,) relative distances -> (R, D) interleaved sin/cos embeddings (Transformer-XL)."""
    pos = dist_r.astype(jnp.float32)[:, None]
    inv = jnp.exp(jnp.arange(0, dim, 2, dtype=jnp.float32) * (-math.log(10000.0) / dim))
    ang = pos * inv[None, :]
    return jnp.stack([jnp.sin(ang), jnp.cos(ang)], axis=-1).reshape(dist_r.shape[0], dim)


def relative_sinusoids(length: int, dim: int) -> jax.Array:
    """(2T - 1, D) sinusoidal embeddings of relative distances T-1, T-2, ..., -(T-1)."""
    return distance_sinusoids(jnp.arange(length - 1, -length, -1, dtype=jnp.float32), dim)


def rel_shift(scores_bhtr: jax.Array) -> jax.Array:
    """(B, H, Tq, Tq+Tk-1) scores over relative distances -> (B, H, Tq, Tk) over key positions.

    Column r of the input holds distance Tk - 1 - r (largest first), and query i sits at
    key position Tk - Tq + i (self-attention: Tk = Tq; a streamed chunk after L cached
    frames: Tk = L + Tq). out[..., i, j] = in[..., i, Tq - 1 - i + j], the score of distance
    Tk - Tq + i - j, done with a pad and two reshapes (Transformer-XL) instead of a gather.
    """
    b, h, t, r = scores_bhtr.shape
    padded = jnp.pad(scores_bhtr, ((0, 0), (0, 0), (0, 0), (1, 0)))  # (B, H, Tq, R + 1)
    # lax.slice_in_dim, not [:, :, 1:]: with symbolic T, jnp indexing lowers to a gather.
    shifted = jax.lax.slice_in_dim(padded.reshape(b, h, r + 1, t), 1, r + 1, axis=2)
    return jax.lax.slice_in_dim(shifted.reshape(b, h, t, r), 0, r - t + 1, axis=3)


class _SelfAttention(nnx.Module):
    """What the Conformer's self-attention modules share: the pre-LN projections, the
    full-sequence and streaming calls, the softmax and the output projection. Subclasses
    create the parameters (wq, wk, wv, wo, norm, dropout, dtype, attention) and define
    `_attend`."""

    def __call__(
        self, x_btd: jax.Array, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        """(B, T, D) -> (B, T, D). mask_bt: (B, T) valid keys (a length mask), or (B, T, T)
        query x key (e.g. a chunked-attention mask already combined with the valid keys)."""
        q, k, v = self._project(x_btd)
        fused = resolve_attention(self.attention, self.dtype, q.shape[-1]) == "cudnn"
        return self._attend(q, k, v, mask_bt, deterministic=deterministic, rngs=rngs, fused=fused)

    def stream(
        self,
        x_bcd: jax.Array,
        valid_bc: jax.Array,
        key_blhk: jax.Array,
        value_blhk: jax.Array,
        cache_valid_bl: jax.Array,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One chunk of C queries against the cached L keys/values before it plus its own.

        The cache holds the projected keys and values of the L frames just before the
        chunk (slots with cache_valid False, e.g. before the stream start, are masked), so
        the relative distances are fixed: query i (0..C-1) to key j (0..L+C-1) is
        i + L - j. Returns (B, C, D) and the cache shifted by C frames (the newest L).
        """
        q, k, v = self._project(x_bcd)
        k_all = jnp.concatenate([key_blhk, k], axis=1)
        v_all = jnp.concatenate([value_blhk, v], axis=1)
        keys_ok = jnp.concatenate([cache_valid_bl, valid_bc], axis=1)  # (B, L + C)
        out = self._attend(q, k_all, v_all, keys_ok, deterministic=True, rngs=None)
        cache = key_blhk.shape[1]
        return out, k_all[:, k_all.shape[1] - cache :], v_all[:, v_all.shape[1] - cache :]

    def _project(self, x_btd: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """LN, then (B, T, H, K) queries, keys and values."""
        dt = self.dtype
        x = self.norm(x_btd)
        q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(dt))
        q, k, v = (constrain(a, ("batch", "time", "heads", "kv")) for a in (q, k, v))
        return q, k, v

    def _softmax_context(
        self,
        scores_bhts: jax.Array,
        v: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> jax.Array:
        """float32 (B, H, Tq, Tk) scores, masked, softmaxed, dropped out -> (B, Tq, H, K)."""
        mask = mask[:, None, None, :] if mask.ndim == 2 else mask[:, None]
        scores = jnp.where(mask, scores_bhts, -1e9)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        return jnp.einsum("bhts,bshk->bthk", probs, v)

    def _output(
        self, ctx_bthk: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        """(B, T, H, K) -> (B, T, D): the output projection and its dropout."""
        out = jnp.einsum("bthk,hkd->btd", ctx_bthk, self.wo[...].astype(self.dtype))
        return self.dropout(out, deterministic=deterministic, rngs=rngs)


class RelPositionAttention(_SelfAttention):
    """Multi-head self-attention with relative positional encoding (Transformer-XL style).

    score(i, j) = (q_i + u) . k_j + (q_i + v) . W_p p(i - j), as in ESPnet's and
    NeMo's Conformer `rel_pos` attention.

    `attention` ("auto" | "cudnn" | "xla", `attention_ops.resolve_attention`): with cuDNN
    the positional term enters the fused kernel as a (B, H, T, T) bias (its gradient is
    written in the backward pass) and the attention probabilities get no dropout (the
    output still does); streaming always runs XLA's.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
        attention: str = "auto",
    ):
        if dim % num_heads:
            raise ValueError(f"model dim {dim} is not divisible by num_heads {num_heads}")
        k = dim // num_heads
        init = logical_init(dense_init(), ("embed", "heads", "kv"))
        self.wq = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wk = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wv = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wpos = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wo = nnx.Param(
            logical_init(dense_init(2), ("heads", "kv", "embed"))(
                rngs.params(), (num_heads, k, dim)
            )
        )
        bias = logical_init(nnx.initializers.zeros, ("heads", "kv"))
        self.pos_bias_u = nnx.Param(bias(rngs.params(), (num_heads, k)))
        self.pos_bias_v = nnx.Param(bias(rngs.params(), (num_heads, k)))
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout)
        self.dtype = dtype
        self.dim = dim
        resolve_attention(attention, dtype, k)  # an impossible explicit choice fails here
        self.attention = attention

    def _attend(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
        fused: bool = False,
    ) -> jax.Array:
        """(B, Tq, H, K) queries, (B, Tk, H, K) keys/values, the last Tq keys at the queries'
        own positions; mask (B, Tk) or (B, Tq, Tk) -> (B, Tq, D). `fused`: cuDNN's kernel."""
        dt = self.dtype
        tq, tk = q.shape[1], k.shape[1]
        # Distances Tk-1 .. -(Tq-1): for Tq = Tk this is relative_sinusoids(T).
        dist = (tk - 1) - jax.lax.broadcasted_iota(jnp.int32, (tk + tq - 1,), 0).astype(jnp.float32)
        p = jnp.einsum(
            "rd,dhk->rhk", distance_sinusoids(dist, self.dim).astype(dt), self.wpos[...].astype(dt)
        )
        scale = 1.0 / math.sqrt(q.shape[-1])
        bd = rel_shift(jnp.einsum("bthk,rhk->bhtr", q + self.pos_bias_v[...].astype(dt), p))
        if fused:
            ctx = fused_attention(
                q + self.pos_bias_u[...].astype(dt),
                k,
                v,
                mask,
                scale=scale,
                bias_bhqs=(bd.astype(jnp.float32) * scale).astype(dt),
            )
            return self._output(ctx, deterministic=deterministic, rngs=rngs)
        ac = jnp.einsum("bthk,bshk->bhts", q + self.pos_bias_u[...].astype(dt), k)
        scores = (ac.astype(jnp.float32) + bd.astype(jnp.float32)) * scale
        ctx = self._softmax_context(scores, v, mask, deterministic=deterministic, rngs=rngs)
        return self._output(ctx, deterministic=deterministic, rngs=rngs)


class RotaryAttention(_SelfAttention):
    """Multi-head self-attention with rotary position embeddings (RoFormer; NeMo's
    Conformer for fused attention): queries and keys are rotated by their positions
    (`attention_ops.rotate`), so score(i, j) = q_i . k_j depends on i - j with no
    positional bias, and cuDNN's fused kernel runs it without a (B, H, T, T) input.
    `attention` as in `RelPositionAttention` (cuDNN: no dropout on the probabilities).
    In a stream, the cached keys are stored unrotated and rotated with the window's
    positions, so the distances are those of the full sequence.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
        attention: str = "auto",
    ):
        if dim % num_heads:
            raise ValueError(f"model dim {dim} is not divisible by num_heads {num_heads}")
        k = dim // num_heads
        if k % 2:
            raise ValueError(
                f"rotary embeddings need an even head dim, got {dim} / {num_heads} = {k}"
            )
        init = logical_init(dense_init(), ("embed", "heads", "kv"))
        self.wq = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wk = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wv = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wo = nnx.Param(
            logical_init(dense_init(2), ("heads", "kv", "embed"))(
                rngs.params(), (num_heads, k, dim)
            )
        )
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout)
        self.dtype = dtype
        self.dim = dim
        resolve_attention(attention, dtype, k)
        self.attention = attention

    def _attend(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
        fused: bool = False,
    ) -> jax.Array:
        """(B, Tq, H, K) queries, (B, Tk, H, K) keys/values, the last Tq keys at the queries'
        own positions; mask (B, Tk) or (B, Tq, Tk) -> (B, Tq, D)."""
        tq, tk = q.shape[1], k.shape[1]
        pos_k = jax.lax.broadcasted_iota(jnp.int32, (tk,), 0)
        q = rotate(q, pos_k[tk - tq :] if tq != tk else pos_k)
        k = rotate(k, pos_k)
        scale = 1.0 / math.sqrt(q.shape[-1])
        if fused:
            ctx = fused_attention(q, k, v, mask, scale=scale)
            return self._output(ctx, deterministic=deterministic, rngs=rngs)
        scores = jnp.einsum("bthk,bshk->bhts", q, k).astype(jnp.float32) * scale
        ctx = self._softmax_context(scores, v, mask, deterministic=deterministic, rngs=rngs)
        return self._output(ctx, deterministic=deterministic, rngs=rngs)


def depthwise_conv1d(
    x_btc: jax.Array, w_kc: jax.Array, b_c: jax.Array, *, block: int = 32, causal: bool = False
) -> jax.Array:
    """'Same' depthwise 1-D convolution, (B, T, C) x (K, C) -> (B, T, C), as blocked band matmuls.

    out[t] = b + sum_s w[s] * x[t + s - pad] with zeros outside [0, T); pad = (K - 1) // 2
    (centred), or K - 1 when `causal` (out[t] sees x[t - K + 1 .. t] only, so a stream can
    emit it as soon as frame t arrives).

    Time is cut into blocks of L frames; block n's output needs its L input frames
    plus the next K - 1 (the halo), so each block is one small matmul with a
    banded (L, L + K - 1, C) matrix built from the kernel. Why not `lax.conv`: its
    grouped-convolution forward + backward on XLA:CPU is 7-9x slower (benchmarks/depthwise_conv.py).
    Why not a sum of K shifted slices: as fast in isolation at the demo's sizes, but
    3x slower for long inputs and wide kernels (T = 750, K = 31), and inside the
    demo's scanned Conformer step this form cut the forward pass from 312 to 212 ms.
    The extra FLOPs ((L + K - 1) / K times the direct convolution's) are negligible
    next to the feed-forward matmuls, and the cost stays linear in T.
    """
    b, t, c = x_btc.shape
    ksize = w_kc.shape[0]
    pad = ksize - 1 if causal else (ksize - 1) // 2
    if not isinstance(t, int):
        # A symbolic T (an exported model): the blocks' padding to a multiple of L would
        # be a symbolic pad width, which ONNX converters (jax2onnx) cannot lower. A
        # grouped convolution (ONNX Conv, group = C) pads by constants.
        out = jax.lax.conv_general_dilated(
            x_btc,
            w_kc[:, None, :].astype(x_btc.dtype),
            window_strides=(1,),
            padding=[(pad, ksize - 1 - pad)],
            dimension_numbers=("NWC", "WIO", "NWC"),
            feature_group_count=c,
            precision="highest",
        )
        return out + b_c
    # L >= K - 1 so one following block always holds the whole halo. A symbolic T (an
    # exported model's, jaxspeech.export) cannot be compared with the block: full blocks.
    short = min(block, t) if isinstance(t, int) else block
    length = max(short, ksize - 1)
    n = -(-t // length)
    xp = jnp.pad(x_btc, ((0, 0), (pad, (n + 1) * length - t - pad), (0, 0)))
    blocks = xp.reshape(b, n + 1, length, c)
    windows = jnp.concatenate([blocks[:, :n], blocks[:, 1:, : ksize - 1]], axis=2)
    # band[i, s, c] = w[s - i, c] where 0 <= s - i < K: output frame i of a block reads
    # window frames i .. i + K - 1.
    offset = jnp.arange(length + ksize - 1)[None, :] - jnp.arange(length)[:, None]
    inside = (offset >= 0) & (offset < ksize)
    band = jnp.where(inside[..., None], w_kc[jnp.clip(offset, 0, ksize - 1)], 0.0)
    out = jnp.einsum("bnsc,isc->bnic", windows, band.astype(x_btc.dtype))
    return out.reshape(b, n * length, c)[:, :t] + b_c


class ConvModule(nnx.Module):
    """LN -> pointwise D x 2D -> GLU -> depthwise conv -> LN -> swish -> pointwise -> dropout.

    LayerNorm replaces the paper's BatchNorm: no running statistics, no
    cross-device reductions, and padding cannot leak into the statistics.
    `causal=True` makes the depthwise convolution look only at past frames (streaming).
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int,
        dropout: float,
        *,
        causal: bool = False,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if kernel_size % 2 == 0 and not causal:
            raise ValueError(f"conv kernel size must be odd, got {kernel_size}")
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.pw1 = Dense(dim, 2 * dim, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.dw_kernel = nnx.Param(
            logical_init(dense_init(), ("conv", "embed"))(rngs.params(), (kernel_size, dim))
        )
        self.dw_bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (dim,))
        )
        self.dw_norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.pw2 = Dense(dim, dim, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.dropout = Dropout(dropout)
        self.causal = causal
        self.dtype = dtype

    def __call__(
        self, x_btd: jax.Array, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        h = self._gated(x_btd, mask_bt)
        h = depthwise_conv1d(
            h,
            self.dw_kernel[...].astype(self.dtype),
            self.dw_bias[...].astype(self.dtype),
            causal=self.causal,
        )
        return self._output(h, deterministic=deterministic, rngs=rngs)

    def stream(
        self, x_bcd: jax.Array, valid_bc: jax.Array, cache_bkd: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """One chunk of a causal convolution: (B, C, D) and the (B, K-1, D) gated inputs of
        the frames before it (zeros at the stream start, as the full computation's left
        padding) -> (B, C, D) and the new cache (the last K - 1 gated frames)."""
        if not self.causal:
            raise ValueError("streaming needs the causal convolution (causal=True)")
        h = jnp.concatenate([cache_bkd, self._gated(x_bcd, valid_bc)], axis=1)
        out = depthwise_conv1d(
            h,
            self.dw_kernel[...].astype(self.dtype),
            self.dw_bias[...].astype(self.dtype),
            causal=True,
        )
        context = cache_bkd.shape[1]
        new_cache = h[:, h.shape[1] - context :]
        return self._output(out[:, context:], deterministic=True, rngs=None), new_cache

    def _gated(self, x_btd: jax.Array, mask_bt: jax.Array) -> jax.Array:
        h = self.pw1(self.norm(x_btd))
        h = jax.nn.glu(h, axis=-1)
        # Zero the padding so the convolution cannot carry it into valid frames.
        return jnp.where(mask_bt[..., None], h, 0.0)

    def _output(self, h: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
        h = jax.nn.silu(self.dw_norm(h))
        return self.dropout(self.pw2(h), deterministic=deterministic, rngs=rngs)
