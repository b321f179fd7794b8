"""HiFi-GAN's generator (Kong et al., 2020): log-mel frames -> waveform, in Flax NNX.

(B, T, M) log-mel -> conv_pre -> [leaky ReLU -> transposed conv (x u_i) -> MRF]_i ->
leaky ReLU -> conv_post -> tanh -> (B, T * hop) audio in [-1, 1], hop = prod(u_i). The MRF
(multi-receptive-field fusion) averages residual blocks of different kernel sizes, each a
chain of dilated convolutions (the paper's ResBlock1: dilations 1, 3, 5).

The input is the recognizer's front end, raw (`jaxspeech.audio.features.log_mel`: the
natural log of the mel *power* spectrogram + 1e-6, centred frames every hop = 160 samples at
16 kHz): FastSpeech2's (`jaxspeech.tts.model`) normalized prediction once the run's feature
statistics are undone (x * std + mean). The upsampling rates multiply to that hop, so T
frames yield T * hop samples (the front end of an utterance of S samples has
T = 1 + S // hop frames: the output covers it, plus up to one hop).

Padding: every convolution first zeroes the positions past a row's valid length (the
acoustic model's `Conv1d` does the same), so a row's valid output equals that of the row
alone, unpadded: neither the content nor the amount of padding after it matters. (Without
this, the receptive field, ~0.1 s, would read the padding into the last valid samples.)

Weight normalization, which the paper puts on every convolution, is omitted: it
reparametrizes the kernels (it changes the optimization, not the function) and is removed
for inference anyway. With the paper's N(0, 0.01) kernels (weight norm starts at the
kernels' own norms, so the paper starts from the same function) the untrained generator is
near silent, the more so the narrower it is: peak |audio| 7e-5 for the defaults, 1e-6 for
`DEMO_GENERATOR`, 3e-9 at 16 channels; Adam's first steps lift it (tests/tts/test_vocoder.py).

Shapes: B batch, T frames, S samples, M mel bins, C channels, K kernel taps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.layers import Dtype, logical_init

LRELU_SLOPE = 0.1  # the paper's leaky ReLU slope (its last one, before conv_post, is 0.01)

# The paper's V1 at our 16 kHz / hop 160 (its rates 8, 8, 2, 2 make its 22.05 kHz hop 256):
# ~12.9 M parameters. `DEMO_GENERATOR` is a small one (~0.23 M) for CPU runs and tests.
DEFAULT_UPSAMPLE_RATES = (5, 4, 4, 2)
DEMO_GENERATOR = dict(channels=64)


def zero(dtype: Dtype) -> jax.Array:
    """A () zero of `dtype`: `jnp.where`'s fill. The same value as a Python 0, which jax
    keeps at the other operand's dtype but jax2onnx's conversion (`vocoder.artifact`)
    widens to 64 bits (as `tts.model.zero`)."""
    return jnp.zeros((), dtype)


def conv_init(std: float | None):
    """Kernel init: normal(0, std) (HiFi-GAN's generator uses 0.01), or None: fan-in
    variance scaling (the discriminators'; PyTorch's default is of that scale)."""
    if std is not None:
        return nnx.initializers.normal(std)
    return nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


class MaskedConv(nnx.Module):
    """'Same' convolution over the first spatial axis of channels-last input, on the
    valid positions only: (B, L, [W,] Cin) -> (B, ceil(L / stride), [W,] Cout).

    `spatial` = 1: a 1-D convolution over time; 2: a (K, 1) 2-D convolution over
    (time, period) (the period discriminator's). Positions where `mask` is False are
    zeroed first, so they read as the zero padding past the array's end would.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        spatial: int = 1,
        init_std: float | None = None,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        if kernel_size % 2 == 0:
            raise ValueError(f"'same' convolutions need an odd kernel, got {kernel_size}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups {groups} must divide {in_channels} and {out_channels}")
        shape = (kernel_size,) + (1,) * (spatial - 1) + (in_channels // groups, out_channels)
        # Output channels on "embed" (FSDP shards them where the mesh axis divides them),
        # except a grouped convolution's: for its weight gradient XLA's partitioner moved
        # the batch-split activations onto the channel split ("involuntary full
        # rematerialization") on the 8-device test mesh.
        axes = ("conv",) + (None,) * spatial + ("embed" if groups == 1 else None,)
        self.kernel = nnx.Param(logical_init(conv_init(init_std), axes)(rngs.params(), shape))
        self.bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (out_channels,))
        )
        self.pad = dilation * (kernel_size - 1) // 2
        self.stride, self.dilation, self.groups, self.spatial = stride, dilation, groups, spatial
        self.dtype = dtype

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """x: (B, L, [W,] Cin); mask: bool, broadcastable to x ((B, L, [1,] 1))."""
        x = jnp.where(mask, x.astype(self.dtype), zero(self.dtype))
        rest = self.spatial - 1
        dims = ("NWC", "WIO", "NWC") if self.spatial == 1 else ("NHWC", "HWIO", "NHWC")
        y = jax.lax.conv_general_dilated(
            x,
            self.kernel[...].astype(self.dtype),
            window_strides=(self.stride,) + (1,) * rest,
            padding=[(self.pad, self.pad)] + [(0, 0)] * rest,
            rhs_dilation=(self.dilation,) + (1,) * rest,
            dimension_numbers=dims,
            feature_group_count=self.groups,
        )
        return y + self.bias[...].astype(self.dtype)


def upsample_padding(rate: int, kernel_size: int) -> tuple[int, int]:
    """(left, right) padding of the `rate`-dilated input that makes a transposed
    convolution map T frames to exactly T * rate samples. PyTorch's ConvTranspose1d with
    padding p = ceil((K - u) / 2) and output_padding (K - u) % 2 (ESPnet's choice for odd
    rates; HiFi-GAN's (K - u) // 2 for even ones): left K - 1 - p, the rest on the right."""
    p = (kernel_size - rate + 1) // 2
    left = kernel_size - 1 - p
    return left, rate + kernel_size - 2 - left


class Upsample(nnx.Module):
    """Transposed convolution, stride `rate`: (B, T, Cin) -> (B, T * rate, Cout). Its
    kernel is that of the equivalent input-dilated convolution (PyTorch's, flipped in
    time; the same family of functions)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        rate: int,
        kernel_size: int,
        *,
        init_std: float,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        if kernel_size < rate:  # some output samples would see no input frame
            raise ValueError(f"upsampling kernel {kernel_size} is shorter than its rate {rate}")
        init = logical_init(conv_init(init_std), ("conv", None, "embed"))
        self.kernel = nnx.Param(init(rngs.params(), (kernel_size, in_channels, out_channels)))
        self.bias = nnx.Param(
            logical_init(nnx.initializers.zeros, ("embed",))(rngs.params(), (out_channels,))
        )
        self.rate, self.padding = rate, upsample_padding(rate, kernel_size)
        self.dtype = dtype

    def __call__(self, x_btc: jax.Array, mask_bt1: jax.Array) -> jax.Array:
        x = jnp.where(mask_bt1, x_btc.astype(self.dtype), zero(self.dtype))
        y = jax.lax.conv_general_dilated(
            x,
            self.kernel[...].astype(self.dtype),
            window_strides=(1,),
            padding=[self.padding],
            lhs_dilation=(self.rate,),
            dimension_numbers=("NWC", "WIO", "NWC"),
        )
        return y + self.bias[...].astype(self.dtype)


class ResBlock(nnx.Module):
    """The paper's ResBlock1: for each dilation d, x += conv_1(lrelu(conv_d(lrelu(x)))),
    kernel K throughout; (B, S, C) -> (B, S, C)."""

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        dilations: Sequence[int],
        *,
        init_std: float,
        dtype: Dtype,
        rngs: nnx.Rngs,
    ):
        def conv(d: int) -> MaskedConv:
            kw = dict(dilation=d, init_std=init_std, dtype=dtype, rngs=rngs)
            return MaskedConv(channels, channels, kernel_size, **kw)

        self.dilated = nnx.List([conv(d) for d in dilations])
        self.plain = nnx.List([conv(1) for _ in dilations])

    def __call__(self, x_bsc: jax.Array, mask_bs1: jax.Array) -> jax.Array:
        for dilated, plain in zip(self.dilated, self.plain):
            h = dilated(jax.nn.leaky_relu(x_bsc, LRELU_SLOPE), mask_bs1)
            x_bsc = x_bsc + plain(jax.nn.leaky_relu(h, LRELU_SLOPE), mask_bs1)
        return x_bsc


class HiFiGANGenerator(nnx.Module):
    """(B, T, M) log-mel frames + (B, T) frame mask -> (B, T * hop) float32 waveform in
    [-1, 1], zero past each row's valid frames; hop = prod(upsample_rates).

    Channels halve at every upsampling stage, from `channels` (the paper's
    upsample_initial_channel: V1 512, V3 256).
    """

    def __init__(
        self,
        *,
        n_mels: int = 80,
        channels: int = 512,
        upsample_rates: Sequence[int] = DEFAULT_UPSAMPLE_RATES,
        upsample_kernels: Sequence[int] | None = None,
        resblock_kernels: Sequence[int] = (3, 7, 11),
        resblock_dilations: Sequence[Sequence[int]] = ((1, 3, 5),) * 3,
        pre_kernel: int = 7,
        post_kernel: int = 7,
        init_std: float = 0.01,
        dtype: Dtype = jnp.float32,
        rngs: nnx.Rngs,
    ):
        rates = tuple(upsample_rates)
        kernels = tuple(upsample_kernels or (2 * u for u in rates))  # the paper's K = 2u
        if len(kernels) != len(rates) or len(resblock_kernels) != len(resblock_dilations):
            raise ValueError("one kernel per upsampling rate and one dilation list per block")
        if channels % 2 ** len(rates):
            raise ValueError(f"channels {channels} must halve {len(rates)} times")
        kw = dict(init_std=init_std, dtype=dtype, rngs=rngs)
        self.conv_pre = MaskedConv(n_mels, channels, pre_kernel, **kw)
        self.ups = nnx.List()
        self.mrf = nnx.List()
        for i, (u, k) in enumerate(zip(rates, kernels)):
            c = channels // 2 ** (i + 1)
            self.ups.append(Upsample(2 * c, c, u, k, **kw))
            self.mrf.append(
                nnx.List(
                    ResBlock(c, rk, rd, **kw)
                    for rk, rd in zip(resblock_kernels, resblock_dilations)
                )
            )
        self.conv_post = MaskedConv(channels // 2 ** len(rates), 1, post_kernel, **kw)
        self.rates = rates
        self.hop = math.prod(rates)
        self.n_mels = n_mels

    def __call__(self, mel_btm: jax.Array, mask_bt: jax.Array) -> jax.Array:
        mask = mask_bt[..., None]  # (B, T, 1), repeated along time at every stage
        x = self.conv_pre(mel_btm, mask)
        for up, blocks, rate in zip(self.ups, self.mrf, self.rates):
            x = up(jax.nn.leaky_relu(x, LRELU_SLOPE), mask)
            mask = jnp.repeat(mask, rate, axis=1)
            x = sum(block(x, mask) for block in blocks) / len(blocks)
        x = self.conv_post(jax.nn.leaky_relu(x, 0.01), mask)
        return jnp.where(mask, jnp.tanh(x.astype(jnp.float32)), zero(jnp.float32))[..., 0]


def vocode(generator: nnx.Module, log_mel_btf: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """(B, T, F) raw log-mel frames (our front end's, or FastSpeech2's denormalized) and
    their (B, T) bool frame mask -> (B, T * hop) float32 waveform, zero past the valid
    frames' samples (T_b valid frames -> T_b * hop samples). `generator`: a
    HiFiGANGenerator or a `vocoder.vocos.VocosGenerator` (the same contract).

    Of an utterance of S samples the front end gives T = 1 + S // hop frames, so the
    waveform is up to one hop longer than the original; its first S samples align.
    """
    if log_mel_btf.shape[-1] != generator.n_mels:
        raise ValueError(
            f"{log_mel_btf.shape[-1]} mel bins; the generator takes {generator.n_mels}"
        )
    return generator(log_mel_btf, mask_bt)


def num_params(module: nnx.Module) -> int:
    """Parameter count of a module (for logs and the size checks of the tests)."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
