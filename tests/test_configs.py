"""Config files: every variant builds the model its architecture says, of the advertised size.

The expected parameter counts are computed here from the architecture (the shapes of
each layer, Gulati et al.'s Conformer as jaxspeech builds it), not copied from the code's
output, and compared with the parameters of the model the config builds.
"""

import re

import jax
import numpy as np
import pytest
from flax import nnx
from ml_collections import ConfigDict

from configs import conformer, demo
from jaxspeech.config import build, keys
from jaxspeech.decoding import search


def _num_params(config: ConfigDict, vocab: int) -> int:
    """Trainable parameters of the model `config` builds (shapes only, nothing allocated)."""
    model = nnx.eval_shape(lambda: build.make_model(config, vocab, 0))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _dense(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out  # weight + bias


def _norm(d: int) -> int:
    return 2 * d  # LayerNorm scale + bias


def _conformer_encoder_params(config: ConfigDict) -> int:
    e, num_mel = config.model.conformer, config.features.num_mel_bins
    d, c, k, m = e.dim, e.subsampling_channels, e.conv_kernel, e.ff_mult * e.dim
    # Subsampling: 2 (x4) or 3 (x8) VALID 3x3 stride-2 convolutions with bias, 1 -> C
    # channels then C -> C, each halving time and frequency; then a linear map of the
    # C x F' values of a frame to D.
    convs = {4: 2, 8: 3}[e.subsampling_factor]
    freq = num_mel
    for _ in range(convs):
        freq = (freq - 3) // 2 + 1
    subsampling = (9 * 1 * c + c) + (convs - 1) * (9 * c * c + c) + _dense(c * freq, d)
    # Macaron feed-forward (twice per block): LN, D -> 4D, 4D -> D.
    ffn = _norm(d) + _dense(d, m) + _dense(m, d)
    # Relative-position MHSA: LN, the query, key, value and position projections and the
    # output projection (D x D each, no biases), and the Transformer-XL biases u and v
    # (heads x head dim = D each).
    mhsa = _norm(d) + 5 * d * d + 2 * d
    # Convolution module: LN, pointwise D -> 2D (GLU), depthwise K x D with bias, LN
    # (in place of the paper's BatchNorm), pointwise D -> D.
    conv = _norm(d) + _dense(d, 2 * d) + (k * d + d) + _norm(d) + _dense(d, d)
    block = 2 * ffn + mhsa + conv + _norm(d)  # + the block's final LN
    return subsampling + e.num_layers * block


def _lstm_encoder_params(config: ConfigDict) -> int:
    s = config.model.lstm
    h, p = s.hidden, s.proj_dim
    out = p or h  # what one direction emits (its recurrent input too)
    width = out * (2 if s.bidirectional else 1)
    in_dims = [config.features.num_mel_bins * s.stack_frames] + [width] * (s.num_layers - 1)
    # One direction of a layer: input and recurrent kernels and a bias for 4 gates, and
    # the LSTMP projection H -> P when there is one.
    layers = sum(i * 4 * h + out * 4 * h + 4 * h + h * p for i in in_dims)
    layers *= 2 if s.bidirectional else 1
    return layers + _norm(width) + _dense(width, s.output_dim or h)


def expected_params(config: ConfigDict, vocab: int) -> int:
    """Parameters of `config`'s model, counted from its architecture."""
    m = config.model
    if m.encoder == "conformer":
        total, d = _conformer_encoder_params(config), m.conformer.dim
    else:
        total, d = _lstm_encoder_params(config), m.lstm.output_dim or m.lstm.hidden
    heads = m.head.split("+")
    if "ctc" in heads:
        total += _dense(d, vocab)
    if "rnnt" in heads:
        t = m.transducer
        p, j = t.predictor_dim, t.joiner_dim
        assert t.predictor == "stateless"  # what every config uses
        # Stateless predictor: a label embedding (no bias) and a depthwise mixing of the
        # last context_size embeddings (no bias).
        predictor = vocab * p + t.context_size * p
        joiner = _dense(d, j) + _dense(p, j) + _dense(j, vocab)  # enc_proj, pred_proj, out
        simple = _dense(d, vocab) + _dense(p, vocab)  # the pruned loss's linear joiner
        total += predictor + joiner + simple
    if "aed" in heads:  # the attention decoder: bias-free attention, as the encoder's
        dec = m.decoder
        k, ff = dec.dim, dec.ff_mult * dec.dim
        block = (
            2 * _norm(k)  # before self- and cross-attention
            + 4 * k * k  # self-attention q, k, v, o
            + 2 * k * k
            + 2 * d * k  # cross-attention q, o; k, v read the encodings
            + _norm(k)
            + _dense(k, ff)
            + _dense(ff, k)  # feed-forward with its own norm
        )
        total += vocab * k + dec.num_layers * block + _norm(k) + _dense(k, vocab)
    return total


def _stated_sizes() -> dict[str, float]:
    """Millions of parameters per size as configs/conformer.py's docstring states them."""
    found = re.findall(r"\b(S|M|L|XL) ([\d.]+)M\b", conformer.__doc__)
    return {size: float(millions) for size, millions in found}


def test_docstring_states_every_size():
    assert set(_stated_sizes()) == set(conformer.SIZES)


@pytest.mark.parametrize("size", list(conformer.SIZES))
def test_conformer_sizes(size):
    """The model has exactly the architecture's parameter count, and the docstring's
    figure (500-token vocabulary; Gulati et al.: S 10M, M 30M, L 120M) is that count."""
    config = conformer.get_config(size)
    dim, layers, heads, kernel, head_dim = conformer.SIZES[size]
    e = config.model.conformer
    assert (e.dim, e.num_layers, e.num_heads, e.conv_kernel) == (dim, layers, heads, kernel)
    assert e.remat == "dots"  # the memory of benchmarks/README.md's GPU plan
    t = config.model.transducer
    assert (t.predictor_dim, t.joiner_dim) == (head_dim, head_dim)
    expected = expected_params(config, 500)
    assert _num_params(config, 500) == expected
    assert round(expected / 1e6, 1) == _stated_sizes()[size]
    assert config.model.head == "ctc+rnnt"
    assert search.decoding_method(config) == "rnnt_greedy"
    if size == "XL":  # too big for plain data parallelism: sharded parameters and moments
        assert config.mesh.fsdp == -1 and config.mesh.tensor > 1


def test_s_size_by_hand():
    """The S count, spelled out once: 144-dim, 16 blocks, kernel 31, 144 subsampling
    channels, 256-dim predictor and joiner, 500 labels."""
    d, c, v, p = 144, 144, 500, 256
    subsampling = (9 * c + c) + (9 * c * c + c) + (c * 19 * d + d)  # 80 -> 39 -> 19 bins
    block = (
        2 * (2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d))  # two feed-forward modules
        + (2 * d + 5 * d * d + 2 * d)  # attention
        + (2 * d + (d * 2 * d + 2 * d) + (31 * d + d) + 2 * d + (d * d + d))  # convolution
        + 2 * d  # final LayerNorm
    )
    ctc = d * v + v
    predictor = v * p + 2 * p  # embedding, mixing of the last 2 labels
    joiner = (d * p + p) + (p * p + p) + (p * v + v)  # enc_proj, pred_proj, out
    simple = (d * v + v) + (p * v + v)  # simple_am, simple_lm
    transducer = predictor + joiner + simple
    total = subsampling + 16 * block + ctc + transducer
    assert (
        total
        == expected_params(conformer.get_config("S"), v)
        == _num_params(conformer.get_config("S"), v)
    )
    assert round(total / 1e6, 1) == 9.3


# The head variants were measured without the default's waveform augmentation.
CLEAN = {
    "waveform_aug.speeds": (1.0,),
    "waveform_aug.noise_prob": 0.0,
    "waveform_aug.start_epoch": 0,
}
# The default decodes by RNN-T beam search after 1,800 steps, with its own LM weights; the
# variants by their head's default search after the library's 1,350.
AUTO = {
    "decoding.method": "auto",
    "train.num_steps": 1350,
    "decoding.lm_weight": 1.2,  # the library's LM fusion weights, not the default's
    "decoding.word_bonus": 10.0,
}
# What each demo variant changes from the default, as configs/demo.py's docstring says.
VARIANT_CHANGES = {
    # "the same augmentation with the CTC head", from the end of the short phase (step 300)
    "ctc": {"model.head": "ctc", "waveform_aug.start_epoch": 4, **AUTO},
    "rnnt": {**CLEAN, **AUTO},  # "the transducer without the waveform ..."
    "ctc_rnnt": {"model.head": "ctc+rnnt", **CLEAN, **AUTO},  # "... + CTC"
    "ctc_aed": {  # "hybrid CTC/attention ... 1,250 steps (its step costs ~8% more)"
        **CLEAN,
        "model.head": "ctc+aed",
        "loss.ctc_weight": 0.5,
        "model.decoder.dim": 144,
        "model.decoder.num_layers": 3,
        "model.decoder.dropout": 0.0,
        "decoding.method": "aed_beam",
        "train.num_steps": 1250,
        "decoding.lm_weight": 1.2,
        "decoding.word_bonus": 10.0,
    },
}
DECODING = {
    "ctc": "ctc_greedy",
    "rnnt": "rnnt_greedy",
    "ctc+rnnt": "rnnt_greedy",
    "ctc+aed": "aed_beam",  # set by the variant (auto would be CTC's greedy search)
}


@pytest.mark.parametrize("variant", demo.VARIANTS)
def test_demo_variants_build(variant):
    """Every variant builds exactly the architecture's model; its decoder matches its head."""
    config = demo.get_config(variant)
    assert _num_params(config, 30) == expected_params(config, 30)
    method = search.decoding_method(config)
    want = "rnnt_beam" if variant == "default" else DECODING[config.model.head]
    assert method in search.DECODERS and method == want
    if variant in VARIANT_CHANGES:
        base, this = keys.flat(demo.get_config().to_dict()), keys.flat(config.to_dict())
        assert {k: v for k, v in this.items() if base[k] != v} == VARIANT_CHANGES[variant]


def test_demo_default_model():
    """The demo's own model: Conformer-transducer, 144-dim, 8 blocks, x4 subsampling, full
    context, no rematerialization; about 4.4M parameters with a 30-character vocabulary."""
    config = demo.get_config()
    assert (config.model.encoder, config.model.head) == ("conformer", "rnnt")
    e = config.model.conformer
    assert (e.dim, e.num_layers, e.subsampling_factor, e.remat) == (144, 8, 4, "none")
    assert (e.causal, e.chunk_size, e.dynamic_chunk) == (False, 0, False)
    assert round(expected_params(config, 30) / 1e6, 1) == 4.4


@pytest.mark.parametrize("variant", ["default", "tiny"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"proj_dim": 16, "output_dim": 40}, {"bidirectional": False, "lookahead": 2}],
    ids=["plain", "lstmp", "unidirectional"],
)
def test_lstm_encoder_builds(variant, overrides):
    config = demo.get_config(variant)
    config.model.encoder = "lstm"
    config.model.lstm.update(overrides)
    assert _num_params(config, 30) == expected_params(config, 30)
    config.model.head = "ctc+rnnt"
    assert _num_params(config, 30) == expected_params(config, 30)


def test_conformer_x8_subsampling_size():
    config = demo.get_config("tiny")
    config.model.conformer.subsampling_factor = 8
    assert _num_params(config, 30) == expected_params(config, 30)


def test_unknown_variants_are_clear_errors():
    with pytest.raises(ValueError, match="use one of"):
        conformer.get_config("XXL")
    with pytest.raises(ValueError, match="variant 'huge'"):
        demo.get_config("huge")
