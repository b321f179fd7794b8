"""Attention decoder (the `aed` half of `model.head = "ctc+aed"`): a Transformer decoder
over the encoder's output, trained by teacher forcing (ESPnet's / WeNet's joint CTC-
attention model).

Pre-LN blocks: causal self-attention over the label prefix, cross-attention to the
encodings (their padding masked), feed-forward; a final LayerNorm and a projection to
the vocabulary. Tokens are embedded (scaled by sqrt(D), as ESPnet's) plus absolute
sinusoidal positions.

Token ids are the tokenizer's. The decoder needs a start and an end symbol: it uses the
blank id (0) for both (`SOS_EOS = BLANK_ID`), as ESPnet and WeNet share one symbol for
<sos> and <eos>. The blank is never a target label (the tokenizer never emits it), so it
is free as the decoder's sentinel; the CTC head keeps it as its blank.

Shapes: B batch, U label positions (the prefix, <sos> included), T encoder frames,
D decoder width, E encoder width, H heads, K head dim, M feed-forward units, V vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.data.tokenizer import BLANK_ID
from jaxspeech.models.layers import (
    Dense,
    Dropout,
    Dtype,
    FeedForward,
    LayerNorm,
    dense_init,
    distance_sinusoids,
    layer_stack,
    logical_init,
    pipelined_stack,
)
from jaxspeech.parallel import pipeline
from jaxspeech.parallel.rules import constrain

SOS_EOS = BLANK_ID  # the decoder's <sos> and <eos> (see the module docstring)


def causal_mask(u: int) -> jax.Array:
    """(U, U) bool: query i may attend key j iff j <= i."""
    i = jax.lax.broadcasted_iota(jnp.int32, (u, u), 0)
    return jax.lax.broadcasted_iota(jnp.int32, (u, u), 1) <= i


class MultiHeadAttention(nnx.Module):
    """Scaled dot-product attention of (B, U, D) queries over (B, T, E) keys/values.

    Self-attention when the memory is the queries' own input (E = D), cross-attention
    to the encodings otherwise. No biases, as the Conformer's attention.
    """

    def __init__(
        self,
        dim: int,
        memory_dim: int,
        num_heads: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if dim % num_heads:
            raise ValueError(f"decoder dim {dim} is not divisible by num_heads {num_heads}")
        k = dim // num_heads
        init = logical_init(dense_init(), ("embed", "heads", "kv"))
        self.wq = nnx.Param(init(rngs.params(), (dim, num_heads, k)))
        self.wk = nnx.Param(init(rngs.params(), (memory_dim, num_heads, k)))
        self.wv = nnx.Param(init(rngs.params(), (memory_dim, num_heads, k)))
        self.wo = nnx.Param(
            logical_init(dense_init(2), ("heads", "kv", "embed"))(
                rngs.params(), (num_heads, k, dim)
            )
        )
        self.dropout = Dropout(dropout)
        self.dtype = dtype

    def project_kv(self, memory_bte: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(B, T, E) memory -> its keys and values, (B, T, H, K) each (what a decoding
        cache keeps: the encodings' once per utterance, the prefix's once per token)."""
        dt = self.dtype
        k = jnp.einsum("bte,ehk->bthk", memory_bte.astype(dt), self.wk[...].astype(dt))
        v = jnp.einsum("bte,ehk->bthk", memory_bte.astype(dt), self.wv[...].astype(dt))
        axes = ("batch", "time", "heads", "kv")
        return constrain(k, axes), constrain(v, axes)

    def attend(
        self,
        x_bud: jax.Array,
        k_bthk: jax.Array,
        v_bthk: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
        with_probs: bool = False,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """(B, U, D) queries over projected (B, T, H, K) keys and values, mask (B, U, T) or
        (B, 1, T) of the keys each query may see -> (B, U, D) (and with `with_probs` the
        (B, H, U, T) attention weights). A query that sees no key gets the values' mean."""
        dt = self.dtype
        q = jnp.einsum("bud,dhk->buhk", x_bud.astype(dt), self.wq[...].astype(dt))
        q = constrain(q, ("batch", "time", "heads", "kv"))
        k, v = k_bthk.astype(dt), v_bthk.astype(dt)
        scores = jnp.einsum("buhk,bthk->bhut", q, k).astype(jnp.float32) / math.sqrt(q.shape[-1])
        scores = jnp.where(mask[:, None], scores, -1e9)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        ctx = jnp.einsum("bhut,bthk->buhk", probs, v)
        out = jnp.einsum("buhk,hkd->bud", ctx, self.wo[...].astype(dt))
        out = self.dropout(out, deterministic=deterministic, rngs=rngs)
        return (out, probs) if with_probs else out

    def __call__(
        self,
        x_bud: jax.Array,
        memory_bte: jax.Array,
        mask: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> jax.Array:
        """(B, U, D) queries, (B, T, E) memory, mask (B, U, T) or (B, 1, T) -> (B, U, D)."""
        k, v = self.project_kv(memory_bte)
        return self.attend(x_bud, k, v, mask, deterministic=deterministic, rngs=rngs)


class DecoderBlock(nnx.Module):
    """x + SelfAttn(LN(x)); x + CrossAttn(LN(x), enc); x + FFN(x) (the FFN has its own LN)."""

    def __init__(
        self,
        dim: int,
        enc_dim: int,
        num_heads: int,
        ff_mult: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        self.self_norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.self_attn = MultiHeadAttention(dim, dim, num_heads, dropout, dtype=dtype, rngs=rngs)
        self.cross_norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.cross_attn = MultiHeadAttention(
            dim, enc_dim, num_heads, dropout, dtype=dtype, rngs=rngs
        )
        self.ff = FeedForward(dim, ff_mult * dim, dropout, dtype=dtype, rngs=rngs)

    def __call__(
        self,
        x_bud: jax.Array,
        enc_bte: jax.Array,
        self_mask_buu: jax.Array,
        enc_mask_b1t: jax.Array,
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> jax.Array:
        kw = dict(deterministic=deterministic, rngs=rngs)
        h = self.self_norm(x_bud)
        x = x_bud + self.self_attn(h, h, self_mask_buu, **kw)
        x = x + self.cross_attn(self.cross_norm(x), enc_bte, enc_mask_b1t, **kw)
        x = x + self.ff(x, **kw)
        return constrain(x, ("batch", "time", "embed"))

    def step(
        self,
        x_n1d: jax.Array,
        cache: dict,
        enc_mask_b1t: jax.Array,
        pos: jax.Array,
    ) -> tuple[jax.Array, dict, jax.Array]:
        """One new token per hypothesis (inference): (N, 1, D) inputs at position `pos` with
        this layer's `cache` ("self_k"/"self_v" (N, L, H, K): the prefix's keys and values;
        "cross_k"/"cross_v" (B, T, H, K): the encodings', N = B * beam rows grouped by
        utterance) -> (N, 1, D), the cache with position `pos` written, and the (N, T)
        cross-attention weights (the heads' mean)."""
        h = self.self_norm(x_n1d)
        k_new, v_new = self.self_attn.project_kv(h)
        sk = jax.lax.dynamic_update_slice_in_dim(
            cache["self_k"], k_new.astype(cache["self_k"].dtype), pos, axis=1
        )
        sv = jax.lax.dynamic_update_slice_in_dim(
            cache["self_v"], v_new.astype(cache["self_v"].dtype), pos, axis=1
        )
        seen = jax.lax.broadcasted_iota(jnp.int32, (1, 1, sk.shape[1]), 2) <= pos
        x = x_n1d + self.self_attn.attend(h, sk, sv, seen, deterministic=True, rngs=None)
        # Cross-attention: an utterance's beam rows are its queries (B, beam, D), so the
        # encodings' keys and values are kept once per utterance, not once per hypothesis.
        b, n, d = cache["cross_k"].shape[0], x.shape[0], x.shape[-1]
        q = self.cross_norm(x).reshape(b, n // b, d)
        ctx, probs_bhut = self.cross_attn.attend(
            q,
            cache["cross_k"],
            cache["cross_v"],
            enc_mask_b1t,
            deterministic=True,
            rngs=None,
            with_probs=True,
        )
        x = x + ctx.reshape(n, 1, d)
        x = x + self.ff(x, deterministic=True, rngs=None)
        align_nt = probs_bhut.astype(jnp.float32).mean(axis=1).reshape(n, -1)
        return x, cache | {"self_k": sk, "self_v": sv}, align_nt


class AttentionDecoder(nnx.Module):
    """(B, U) token prefixes and (B, T, E) encodings -> (B, U, V) next-token logits."""

    def __init__(
        self,
        *,
        vocab_size: int,
        enc_dim: int,
        dim: int = 256,
        num_layers: int = 6,
        num_heads: int = 4,
        ff_mult: int = 4,
        dropout: float = 0.1,
        scan_layers: bool = False,
        pipeline_microbatches: int = 4,
        pipeline_repeats: int = 1,
        pipeline_gather_once: bool = True,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if num_layers < 1:
            raise ValueError(f"decoder num_layers must be >= 1, got {num_layers}")
        self.embed = nnx.Param(
            logical_init(nnx.initializers.normal(1.0), ("vocab", "embed"))(
                rngs.params(), (vocab_size, dim)
            )
        )
        self.dropout = Dropout(dropout)
        make = lambda r: DecoderBlock(  # noqa: E731
            dim, enc_dim, num_heads, ff_mult, dropout, dtype=dtype, rngs=r
        )
        # A scanned stack's layer axis is "layers": on a mesh with a stage axis > 1 it splits
        # into the pipeline's stages, as the Conformer's does (jaxspeech.parallel.pipeline).
        self.blocks = layer_stack(make, num_layers, scan_layers, rngs, axis="layers")
        self.pipeline_microbatches = pipeline_microbatches
        self.pipeline_repeats = pipeline_repeats
        self.pipeline_gather_once = pipeline_gather_once
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)
        self.out = Dense(dim, vocab_size, ("embed", "vocab"), dtype=dtype, rngs=rngs)
        self.dim, self.num_layers, self.scan_layers = dim, num_layers, scan_layers
        self.dtype = dtype

    def embed_tokens(self, tokens_bu: jax.Array) -> jax.Array:
        """(B, U) ids -> (B, U, D): embedding * sqrt(D) + sinusoid of the position."""
        pos = distance_sinusoids(jnp.arange(tokens_bu.shape[1]), self.dim)
        x = jnp.take(self.embed[...], tokens_bu, axis=0) * math.sqrt(self.dim) + pos[None]
        return constrain(x.astype(self.dtype), ("batch", "time", "embed"))

    def __call__(
        self,
        tokens_bu: jax.Array,
        enc_bte: jax.Array,
        enc_len_b: jax.Array,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """(B, U) prefixes (<sos> first), (B, T, E) encodings with (B,) valid frames ->
        (B, U, V) float32 logits: row u predicts the token after prefix[:u + 1].

        The self-attention is causal, so a position never sees later (padded) tokens and
        a row's logits do not depend on the label padding; padded frames are masked."""
        x = self.dropout(self.embed_tokens(tokens_bu), deterministic=deterministic, rngs=rngs)
        self_mask = causal_mask(tokens_bu.shape[1])[None]  # (1, U, U)
        t = enc_bte.shape[1]
        enc_mask = (jax.lax.broadcasted_iota(jnp.int32, (1, t), 1) < enc_len_b[:, None])[:, None]

        def body(x, block, rngs):
            return block(x, enc_bte, self_mask, enc_mask, deterministic=deterministic, rngs=rngs)

        if not self.scan_layers:
            for block in self.blocks:
                x = body(x, block, rngs)
        elif pipeline.stages_in_mesh() > 1:
            x = pipelined_stack(
                self.blocks,
                x,
                {"enc": enc_bte, "enc_mask": enc_mask},  # travel with the microbatches
                lambda block, x, ex, r: block(
                    x, ex["enc"], self_mask, ex["enc_mask"], deterministic=deterministic, rngs=r
                ),
                microbatches=self.pipeline_microbatches,
                repeats=self.pipeline_repeats,
                gather_once=self.pipeline_gather_once,
                key=rngs.dropout() if rngs is not None and not deterministic else None,
            )
        elif rngs is None or deterministic:
            scan = nnx.scan(
                lambda x, b: body(x, b, None), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry
            )
            x = scan(x, self.blocks)
        else:  # each layer draws its dropout masks from its own split of the streams
            scan = nnx.split_rngs(splits=self.num_layers)(
                nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry)
            )
            x = scan(x, self.blocks, rngs)
        logits = self.out(self.norm(x)).astype(jnp.float32)
        return constrain(logits, ("batch", "time", "vocab"))

    def _each_layer(self, fn, x, per_layer):
        """fn(block, x, layer's slice of `per_layer`) -> (x, out) over the blocks in order;
        -> (x, outs stacked on a leading layer axis), for a scanned or a looped stack."""
        if self.scan_layers:
            scan = nnx.scan(
                lambda x, block, p: fn(block, x, p),
                in_axes=(nnx.Carry, 0, 0),
                out_axes=(nnx.Carry, 0),
            )
            return scan(x, self.blocks, per_layer)
        outs = []
        for i, block in enumerate(self.blocks):
            x, out = fn(block, x, jax.tree.map(lambda a, i=i: a[i], per_layer))
            outs.append(out)
        return x, jax.tree.map(lambda *a: jnp.stack(a), *outs)

    def start(self, enc_bte: jax.Array, enc_len_b: jax.Array, beam: int, max_len: int) -> dict:
        """The decoding cache of B utterances with `beam` hypotheses each (rows b * beam ..
        b * beam + beam - 1 are utterance b's) and prefixes of up to `max_len` tokens (<sos>
        included): every layer's keys and values of the encodings (L, B, T, H, K), empty
        (L, B * beam, max_len, H, K) ones of the prefixes, and the (B, 1, T) frame mask."""
        t = enc_bte.shape[1]
        enc_mask = (jax.lax.broadcasted_iota(jnp.int32, (1, t), 1) < enc_len_b[:, None])[:, None]

        def cross(block, x, _):
            return x, block.cross_attn.project_kv(enc_bte)

        _, (ck, cv) = self._each_layer(cross, jnp.zeros(()), jnp.zeros((self.num_layers,)))
        n, heads, k = enc_bte.shape[0] * beam, ck.shape[-2], ck.shape[-1]
        empty = jnp.zeros((self.num_layers, n, max_len, heads, k), self.dtype)
        return {"cross_k": ck, "cross_v": cv, "self_k": empty, "self_v": empty, "mask": enc_mask}

    def step(
        self, cache: dict, tokens_n: jax.Array, pos: jax.Array
    ) -> tuple[jax.Array, dict, jax.Array]:
        """(N,) tokens at prefix position `pos` (the same for every row: the search extends
        all hypotheses together) -> (N, V) float32 log-probs of the next token (equal to the
        last row of `__call__` on the whole prefix: tests), the cache with the tokens' keys
        and values written, and (N, T) the last layer's cross-attention weights (where the
        next token looks in the audio: its time when there is no CTC alignment)."""
        pos = jnp.asarray(pos, jnp.int32)
        emb = jnp.take(self.embed[...], tokens_n, axis=0) * math.sqrt(self.dim)
        x = (emb + distance_sinusoids(pos[None], self.dim)).astype(self.dtype)[:, None]
        layers = {k: cache[k] for k in ("self_k", "self_v", "cross_k", "cross_v")}

        def one(block, x, layer):
            x, new, align = block.step(x, layer, cache["mask"], pos)
            return x, (new["self_k"], new["self_v"], align)

        x, (sk, sv, align_lnt) = self._each_layer(one, x, layers)
        logits = self.out(self.norm(x[:, 0])).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return logp, cache | {"self_k": sk, "self_v": sv}, align_lnt[-1]

    @staticmethod
    def reorder(cache: dict, src_n: jax.Array) -> dict:
        """The cache with row n's prefix keys and values taken from row src_n[n] (the
        hypotheses the search keeps, each from the row it extends)."""
        take = lambda a: jnp.take(a, src_n, axis=1)  # noqa: E731
        return cache | {"self_k": take(cache["self_k"]), "self_v": take(cache["self_v"])}


def teacher_forcing(
    labels_bu: jax.Array, label_len_b: jax.Array, *, sos_eos: int = SOS_EOS
) -> tuple[jax.Array, jax.Array]:
    """(B, U) labels with (B,) counts -> (B, U + 1) decoder inputs [sos, y_1 .. y_n, pad]
    and (B, U + 1) targets [y_1 .. y_n, eos, pad] (pad = sos_eos; masked by the loss at
    positions > label_len). U is the batch's label padding, one of the buckets' fixed
    widths, so U + 1 takes as few values as the buckets do: no new compiled shapes."""
    b, u = labels_bu.shape
    sentinel = jnp.full((b, 1), sos_eos, labels_bu.dtype)
    inputs = jnp.concatenate([sentinel, labels_bu], axis=1)
    pos = jax.lax.broadcasted_iota(jnp.int32, (b, u + 1), 1)
    targets = jnp.concatenate([labels_bu, sentinel], axis=1)
    targets = jnp.where(pos < label_len_b[:, None], targets, sos_eos)  # eos at label_len
    inputs = jnp.where(pos <= label_len_b[:, None], inputs, sos_eos)
    return inputs, targets
