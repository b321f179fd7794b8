"""Conformer encoder: x4 subsampling, then blocks of FFN/2 -> MHSA -> Conv -> FFN/2 -> LN."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.layers import ConvModule, Dtype, FeedForward, LayerNorm, RelPositionAttention
from jaxspeech.models.subsampling import Conv2dSubsampling4
from jaxspeech.parallel.rules import constrain


def length_mask(lengths_b: jax.Array, t: int) -> jax.Array:
    """(B,) lengths -> (B, T) bool, True on valid frames."""
    return jnp.arange(t)[None, :] < lengths_b[:, None]


class ConformerBlock(nnx.Module):
    """One macaron Conformer block (pre-LN residuals, final LayerNorm)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ff_mult: int,
        conv_kernel: int,
        dropout: float,
        *,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        self.ff1 = FeedForward(dim, ff_mult * dim, dropout, dtype=dtype, rngs=rngs)
        self.attn = RelPositionAttention(dim, num_heads, dropout, dtype=dtype, rngs=rngs)
        self.conv = ConvModule(dim, conv_kernel, dropout, dtype=dtype, rngs=rngs)
        self.ff2 = FeedForward(dim, ff_mult * dim, dropout, dtype=dtype, rngs=rngs)
        self.norm = LayerNorm(dim, dtype=dtype, rngs=rngs)

    def __call__(
        self, x_btd: jax.Array, mask_bt: jax.Array, *, deterministic: bool, rngs: nnx.Rngs | None
    ) -> jax.Array:
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = x_btd + 0.5 * self.ff1(x_btd, **kw)
        x = x + self.attn(x, mask_bt, **kw)
        x = x + self.conv(x, mask_bt, **kw)
        x = x + 0.5 * self.ff2(x, **kw)
        return constrain(self.norm(x), ("batch", "time", "embed"))


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
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.subsampling = Conv2dSubsampling4(
            num_features, subsampling_channels, dim, dtype=dtype, rngs=rngs
        )
        self.dropout = nnx.Dropout(dropout)
        self.num_layers = num_layers
        self.scan_layers = scan_layers
        make = lambda r: ConformerBlock(
            dim, num_heads, ff_mult, conv_kernel, dropout, dtype=dtype, rngs=r
        )
        if scan_layers:
            # One block with every parameter stacked on a leading (unsharded) layer axis:
            # XLA compiles the block once instead of num_layers times.
            stacked = nnx.vmap(
                make, in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: None}
            )
            self.blocks = nnx.split_rngs(splits=num_layers)(stacked)(rngs)
        else:
            self.blocks = nnx.List([make(rngs) for _ in range(num_layers)])

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
        if not self.scan_layers:
            for block in self.blocks:
                x = block(x, mask, deterministic=deterministic, rngs=rngs)
            return x, lengths

        def body(x, block, rngs):
            return block(x, mask, deterministic=deterministic, rngs=rngs)

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
