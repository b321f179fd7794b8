"""Every documented option and every model constructor argument is a config key that the
command line can override, and an override reaches the model.

`ml_collections.config_flags` only accepts `--config.<key>=...` for keys the config file
defines, so an option the README documents, or a constructor argument the config does
not name, cannot be set from the command line. The configs are parsed here exactly as
`python -m jaxspeech.train` parses them: absl flags with `DEFINE_config_file` (on a fresh
`flags.FlagValues`, not the global FLAGS).
"""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from flax import nnx
from ml_collections import ConfigDict, config_flags

from jaxspeech import models
from jaxspeech.audio import augment
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.audio.mfcc import FEATURE_KINDS
from jaxspeech.config import build
from jaxspeech.data import tokenizer
from jaxspeech.decoding.search import DECODERS
from jaxspeech.losses import distill as distill_losses
from jaxspeech.losses.kernels import common as loss_kernels
from jaxspeech.models import asr
from jaxspeech.models.attention_ops import ATTENTION_IMPLS, POSITION_ENCODINGS
from jaxspeech.models.conformer import REMAT_POLICIES, ConformerEncoder
from jaxspeech.models.lstm import LSTMEncoder
from jaxspeech.models.transducer import PREDICTORS, Transducer
from jaxspeech.parallel import pipeline, sync

REPO = pathlib.Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "demo.py")
TINY = DEMO + ":tiny"
CONFIG_FILES = [DEMO, str(REPO / "configs" / "conformer.py") + ":M"]


def parse(config_file: str, *overrides: str) -> ConfigDict:
    """The config `--config config_file overrides...` gives, parsed as the CLI does.

    `sys_argv` is how config_flags learns which `--config.<key>` flags to define (the
    entry points get it from sys.argv).
    """
    argv = ["prog", "--config", config_file, *overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
    fv(argv)
    return fv.config


def get(config: ConfigDict, key: str):
    for part in key.split("."):
        assert part in config, f"config key {key} does not exist ({part!r} missing)"
        config = config[part]
    return config


# Allowed values of the string-valued keys, from the code that reads them.
STR_CHOICES = {
    "features.kind": FEATURE_KINDS,
    "model.dtype": tuple(models.DTYPES),
    "model.encoder": tuple(models.ENCODERS),
    "model.head": asr.HEADS,
    "model.conformer.remat": tuple(REMAT_POLICIES),
    "model.conformer.pos_enc": POSITION_ENCODINGS,
    "model.conformer.attention": ATTENTION_IMPLS,
    "model.transducer.predictor": PREDICTORS,
    "loss.rnnt": asr.RNNT_LOSSES,
    "loss.kernel": loss_kernels.KERNEL_SETTINGS,
    "decoding.method": ("auto", *DECODERS),
    "sync.strategy": sync.STRATEGIES,
    "sync.outer": sync.OUTER_METHODS,
    "sync.gtc_values": sync.GTC_VALUES,
    "distill.loss": distill_losses.LOSS_KINDS,
    "distill.rest": distill_losses.REST_MODES,
    "pipeline.schedule": pipeline.SCHEDULES,
}


def other_value(config: ConfigDict, key: str) -> tuple[object, tuple[str, ...]]:
    """A valid value of `key` other than its value in `config`, and any other overrides it
    needs to be valid (e.g. a look-ahead needs a unidirectional LSTM)."""
    default = get(config, key)
    conf = config.model.conformer
    # Keys whose valid values depend on other keys.
    if key == "model.conformer.dim":
        return 2 * default, ()  # still a multiple of num_heads
    if key == "model.conformer.num_heads":
        assert conf.dim % (2 * default) == 0
        return 2 * default, ()
    if key == "model.conformer.conv_kernel":
        return default + 2, ()  # odd (centred convolutions)
    if key == "model.conformer.subsampling_factor":
        return {4: 8, 8: 4}[default], ()
    if key == "model.conformer.attention":  # cudnn needs 16-bit compute the default lacks
        return "xla", ()
    if key == "model.lstm.lookahead":
        return default + 1, ("--config.model.lstm.bidirectional=False",)
    if isinstance(default, bool):
        return not default, ()
    if isinstance(default, int):
        return (default + 1 if default >= 0 else 2), ()
    if isinstance(default, float):
        # Halving stays in every float key's range (ratios, weights, fmax <= sr / 2, ...).
        return (default / 2 if default else 0.5), ()
    if isinstance(default, str):
        if key in STR_CHOICES:
            return next(v for v in STR_CHOICES[key] if v != default), ()
        if key.startswith("mesh.rules."):  # mesh axes: another valid one, or replicated
            return ("" if default else "tensor"), ()
        if key == "init_from" or key.endswith(("dir", "_manifest", "_file", "_path")):
            return "runs/other", ()
        if key == "data.eval_split":  # a comma-separated list of splits
            return f"{default},other", ()
        if key in ("data.train_split", "distill.other_split"):
            return "other", ()
        if key == "distill.targets":
            return "runs/other/targets", ()
        if key == "distill.schedule":
            return "0.5:2,1.0:1", ()
        if key == "monitor.trackers":  # none: metrics.jsonl only (the others need servers)
            return "", ()
    raise AssertionError(f"no valid test value for {key} = {default!r}: add one here")


def typed(text: str, default: object) -> object:
    """A command-line value as the key's type would hold it."""
    if isinstance(default, bool):
        assert text in ("True", "False"), text
        return text == "True"
    if isinstance(default, int | float | str):
        return type(default)(text)
    raise AssertionError(f"README value {text!r} for a {type(default).__name__} key")


def check_override(config_file: str, key: str, value: object, *extra: str) -> ConfigDict:
    """`--config.key=value` parses, and the config then holds exactly `value`."""
    default = get(parse(config_file), key)
    config = parse(config_file, f"--config.{key}={value}", *extra)
    got = get(config, key)
    assert got == value and type(got) is type(default), (key, value, got)
    return config


# ---------------------------------------------------------------- a. the README
# `config.<key>` where the README names a setting: as a flag (`--config.`) or in prose,
# with `=<value>` or without; `config.mesh.{a, b}` names several keys, `config.model.lstm.*`
# a group of them.
README_REF = re.compile(
    r"(?<![\w/.-])(--)?config\.([A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|\{[^}]*\}|\*))*)(?:=([^\s`]+))?"
)
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # N, K, PATH, OTHER_RUN: "some value"
NOT_KEYS = {"json"}  # RUN/config.json, the file


# The user guide and the reference it points to for the details.
DOCS = ("README.md", "docs/reference.md")
# Overrides of a task section the recognizers' configs lack, checked in that task's config.
TASK_CONFIGS = {
    "vocoder": str(REPO / "configs" / "vocoder.py"),
    "tts": str(REPO / "configs" / "tts.py"),
}


def readme_refs() -> dict[str, list]:
    """The config references of README.md and docs/reference.md (read now: they change),
    by kind."""
    refs = {"override": [], "task_override": [], "reference": [], "syntax": [], "file": []}
    text = "\n".join((REPO / doc).read_text() for doc in DOCS)
    for m in README_REF.finditer(text):
        _, key, value = m.groups()
        if key in NOT_KEYS:
            refs["file"].append(key)
        elif any(PLACEHOLDER.fullmatch(part) for part in key.split(".")):
            refs["syntax"].append(key)  # --config.KEY=VALUE, the syntax itself
        elif value is not None and key.split(".")[0] in TASK_CONFIGS:
            refs["task_override"].append((key, value))
        elif value is not None:
            refs["override"].append((key, value))
        else:
            refs["reference"].append(key)
    return refs


def test_readme_walk_finds_every_reference():
    """Counted by hand. README.md (the guide): 6 settings with a value (num_steps,
    num_layers, fsdp, run_steps, init_from, monitor.trackers), 3 without
    (max_corrupt_fraction, sync.strategy, device_hour_price) and the syntax
    `--config.KEY=VALUE`. docs/reference.md (the commands' and keys' details, the former
    README's among them): 23 with a value (the same six, log_batch_ids, eval_split, the
    student's train_split, distill.other_split, distill.targets, distill.schedule,
    distill.other_dir; model.head=ctc+aed, mesh.stage, conformer.scan_layers,
    pipeline.schedule, features.kind, features.deltas, dtype, grad_accum, remat,
    loader_shards), 53 without (features, max_corrupt_fraction, read_retries,
    read_backoff_s, seed, count_flops, peak_tflops, monitor.trackers, device_hour_price,
    encoder, conformer.*, lstm.*, head, ctc_weight, decoder.*, rnnt, kernel,
    batch_seconds, features.{kind, num_mel_bins, num_ceps, lifter, deltas} one by one,
    waveform_aug, specaug, mesh.{...}, mesh.rules, mesh.rules.embed (set empty),
    pipeline.{...}, decoding.method, lm_path, lm_weight, word_bonus, streaming, the
    attention searches' decoding.{...}, the five scoring keys, distill, distill.schedule,
    distill.other_split; model.decoder.{...}, label_smoothing,
    loss.ctc_weight, decoding.method, decoding.ctc_weight, pipeline.microbatches,
    pipeline.gather_weights_once, model.decoder.scan_layers, features) and RUN/config.json
    twice. Pinned, so a regex that stops matching cannot leave the tests below with nothing
    to check; after editing the documents' options, recount and update."""
    refs = readme_refs()
    counts = {kind: len(found) for kind, found in refs.items()}
    assert counts == {
        "override": 29,
        "task_override": 1,  # the README's vocoder.gta_mels=G.npz
        "reference": 56,
        "syntax": 1,
        "file": 2,
    }, refs
    assert "model.conformer.remat" in dict(refs["override"])  # the example


@pytest.mark.parametrize("config_file", CONFIG_FILES, ids=["demo", "conformer-M"])
def test_readme_overrides_parse(config_file):
    """Every `config.<key>=<value>` the README shows works as `--config.<key>=<value>`;
    placeholders (N, K, OTHER_RUN) and `a|b|c` alternatives become real values."""
    config = parse(config_file)
    for key, text in readme_refs()["override"]:
        default = get(config, key)
        values = []
        for alternative in text.split("|"):
            if PLACEHOLDER.fullmatch(alternative):
                values.append(other_value(config, key)[0])
            else:
                values.append(typed(alternative, default))
        # ... and one value other than the file's own, so the override changes something.
        values.append(other_value(config, key)[0])
        for value in values:
            check_override(config_file, key, value)


def test_readme_task_overrides_parse():
    """A `config.<key>=<value>` of another task's section (the vocoder's) works as
    `--config.<key>=<value>` of that task's config."""
    for key, text in readme_refs()["task_override"]:
        config_file = TASK_CONFIGS[key.split(".")[0]]
        default = get(parse(config_file), key)
        value = typed(text, default)
        check_override(config_file, key, value)


@pytest.mark.parametrize("config_file", CONFIG_FILES, ids=["demo", "conformer-M"])
def test_readme_references_are_keys(config_file):
    """Every `config.<key>` the README names exists: a group (`config.specaug`,
    `config.model.lstm.*`) is a sub-config, a setting is overridable."""
    config = parse(config_file)
    for ref in readme_refs()["reference"]:
        head, _, last = ref.rpartition(".")
        if last == "*":
            assert isinstance(get(config, head), ConfigDict), ref
            continue
        names = [n.strip() for n in last.strip("{}").split(",")]
        for name in names:
            key = f"{head}.{name}" if head else name
            node = get(config, key)
            if isinstance(node, ConfigDict):
                assert len(node) > 0, key
            else:
                check_override(config_file, key, other_value(config, key)[0])


# ---------------------------------------------------------------- b. the constructors
# Arguments the wiring itself supplies (jaxspeech/models/asr.py: ASRModel), never config keys.
WIRED = {
    "conformer": {"num_features", "dtype", "rngs"},
    "lstm": {"num_features", "dtype", "rngs"},
    "transducer": {"enc_dim", "vocab_size", "dtype", "rngs"},
}
# Arguments built from another config section: the Conformer's pipeline settings come from
# config.pipeline (jaxspeech/config/build.py: pipeline_kwargs), not model.conformer.
FROM_PIPELINE = {"conformer": {"pipeline_microbatches", "pipeline_repeats", "pipeline_gather_once"}}
# Not passed by anyone and not a key: the blank is the tokenizer's id 0, which the losses
# and decoders take from the tokenizer; a config value could only disagree with them.
FIXED = {"transducer": {"blank_id"}}
# Frontend(specaug=...) takes `augment.spec_augment`'s keyword arguments plus its own
# `freq_warp` (the VTLP range); `enabled` is the config's on/off switch.
FRONTEND_OWN = {"freq_warp"}


def _signature(fn) -> inspect.Signature:
    # An nnx.Module class's own signature is its metaclass' (*args, **kwargs): read __init__.
    return inspect.signature(fn.__init__ if isinstance(fn, type) else fn)


def _keyword_params(fn) -> set[str]:
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = {n for n, p in _signature(fn).parameters.items() if p.kind in kinds} - {"self"}
    assert params, fn  # never an empty (vacuous) list of arguments
    return params


COMPONENTS = {
    # name: (config sub-dict, its keys the constructor must take as keyword arguments)
    "conformer": (
        "model.conformer",
        _keyword_params(ConformerEncoder) - WIRED["conformer"] - FROM_PIPELINE["conformer"],
    ),
    "lstm": ("model.lstm", _keyword_params(LSTMEncoder) - WIRED["lstm"]),
    "transducer": (
        "model.transducer",
        _keyword_params(Transducer) - WIRED["transducer"] - FIXED["transducer"],
    ),
    "features": ("features", {f.name for f in dataclasses.fields(LogMelConfig)}),
    "specaug": (
        "specaug",
        {
            n
            for n, p in _signature(augment.spec_augment).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }
        | FRONTEND_OWN,
    ),
}
# The variant each component is built in: its encoder / head selected.
SELECT = {
    "conformer": (),
    "lstm": ("--config.model.encoder=lstm",),
    "transducer": ("--config.model.head=ctc+rnnt",),
    "features": (),
    "specaug": (),
}


def _spy(monkeypatch) -> dict[str, dict]:
    """Record the keyword arguments the encoders and the transducer are built with."""
    calls: dict[str, dict] = {}

    def wrap(name, cls):
        def build(**kwargs):
            calls[name] = kwargs
            return cls(**kwargs)

        return build

    for name, cls in list(models.ENCODERS.items()):
        monkeypatch.setitem(models.ENCODERS, name, wrap(name, cls))
    monkeypatch.setattr(asr, "Transducer", wrap("transducer", Transducer))
    return calls


def _build(config: ConfigDict, monkeypatch) -> tuple[nnx.Module, dict[str, dict]]:
    calls = _spy(monkeypatch)
    model = nnx.eval_shape(lambda: build.make_model(config, 10, 0))
    return model, calls


def _reached(model, calls, component: str, name: str):
    """The value argument `name` of `component` was built with."""
    if component in ("conformer", "lstm", "transducer"):
        return calls[component][name]
    if component == "features":
        assert isinstance(model.frontend.cfg, LogMelConfig)
        return getattr(model.frontend.cfg, name)
    if name == "freq_warp":
        return model.frontend.freq_warp
    return model.frontend.specaug[name]


def test_wiring_supplies_exactly_the_excluded_arguments(monkeypatch):
    """What ASRModel passes besides the config's keys is exactly WIRED: the exclusions
    above hide no argument the config should have had."""
    for component in ("conformer", "lstm", "transducer"):
        config = parse(TINY, *SELECT[component])
        _, calls = _build(config, monkeypatch)
        section = get(config, COMPONENTS[component][0])
        from_elsewhere = WIRED[component] | FROM_PIPELINE.get(component, set())
        assert set(calls[component]) - set(section) == from_elsewhere, component
        assert set(section) <= set(calls[component]), component  # every key is passed on
    assert _signature(Transducer).parameters["blank_id"].default == tokenizer.BLANK_ID


@pytest.mark.parametrize("config_file", [DEMO, TINY, CONFIG_FILES[1]], ids=["demo", "tiny", "M"])
@pytest.mark.parametrize("component", list(COMPONENTS))
def test_constructor_arguments_are_exactly_the_keys(config_file, component):
    """A config sub-dict holds every keyword argument of its constructor and nothing else
    (an extra key would fail at build time, a missing one cannot be set)."""
    section, params = COMPONENTS[component]
    keys = set(get(parse(config_file), section))
    if component == "specaug":
        keys -= {"enabled"}
    assert keys == params, (sorted(params - keys), sorted(keys - params))


def _defaults(component: str) -> dict:
    if component == "features":
        return {f.name: f.default for f in dataclasses.fields(LogMelConfig)}
    fn = {
        "conformer": ConformerEncoder,
        "lstm": LSTMEncoder,
        "transducer": Transducer,
        "specaug": augment.spec_augment,
    }[component]
    return {n: p.default for n, p in _signature(fn).parameters.items() if n != "self"}


@pytest.mark.parametrize("component", ["conformer", "lstm", "transducer"])
def test_unset_keys_pass_the_constructor_default(component, monkeypatch):
    """The demo's encoder and transducer are built with the constructors' own defaults
    wherever the demo has no reason to differ: what the keys added for the command line
    pass is what the constructor used before they existed (None defaults become the
    typed sentinel the constructor treats alike, e.g. LSTM output_dim 0 = hidden)."""
    config = parse(DEMO, *SELECT[component])
    _, calls = _build(config, monkeypatch)
    # Set deliberately by configs/demo.py, each with its reason there.
    chosen = {
        "conformer": {"dim", "num_layers", "num_heads", "scan_layers", "dropout"},
        "lstm": {"hidden", "num_layers", "bidirectional", "stack_frames"},
        "transducer": {"joiner_dim"},
    }[component]
    sentinels = {("lstm", "output_dim"): (0, None)}  # 0 or hidden == None or hidden
    for name, default in _defaults(component).items():
        if name in chosen or name in WIRED[component] or name in FIXED.get(component, ()):
            continue
        passed = calls[component][name]
        if (component, name) in sentinels:
            assert (passed, default) == sentinels[(component, name)], name
        else:
            assert passed == default and type(passed) is type(default), (name, passed, default)


CASES = [(c, name) for c, (_, params) in COMPONENTS.items() for name in sorted(params)]


@pytest.mark.parametrize("component,name", CASES, ids=[f"{c}.{n}" for c, n in CASES])
def test_constructor_argument_overridable(component, name, monkeypatch):
    """`--config.<section>.<arg>=<another valid value>` parses on demo.py and conformer.py:M,
    and on the tiny variant the model builds with that value in the constructor call."""
    section = COMPONENTS[component][0]
    key = f"{section}.{name}"
    for config_file in CONFIG_FILES:
        value, extra = other_value(parse(config_file), key)
        check_override(config_file, key, value, *extra)
    value, extra = other_value(parse(TINY, *SELECT[component]), key)
    config = check_override(TINY, key, value, *SELECT[component], *extra)
    model, calls = _build(config, monkeypatch)
    got = _reached(model, calls, component, name)
    assert got == value and type(got) is type(value), (key, value, got)


def test_no_key_is_none():
    """A None-valued key cannot be overridden with a typed value from the command line."""

    def leaves(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    for config_file in [DEMO, TINY, *CONFIG_FILES[1:]]:
        nones = [k for k, v in leaves(parse(config_file).to_dict()) if v is None]
        assert not nones, (config_file, nones)


# ---------------------------------------------------------------- c. end to end
HOP = 160  # configs/demo.py's features.hop_length (checked below)


def _audio(seconds: list[float], seed: int = 0):
    n = [int(s * 16000) for s in seconds]
    rng = np.random.default_rng(seed)
    audio = 0.1 * rng.standard_normal((len(n), max(n))).astype(np.float32)
    for i, k in enumerate(n):
        audio[i, k:] = 0.0
    return jnp.asarray(audio), jnp.asarray(n, jnp.int32)


def _expected_frames(num_samples: int, factor: int) -> int:
    """Encoder frames, computed independently: centred STFT frames 1 + S // hop, then a
    VALID 3x3 stride-2 convolution per factor of 2 (out = (in - 3) // 2 + 1)."""
    t = 1 + num_samples // HOP
    for _ in range(int(np.log2(factor))):
        t = (t - 3) // 2 + 1
    return t


def _num_params(model) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@nnx.jit(static_argnames="train")
def _forward(model, audio, lengths, rngs=None, train=False):
    return model(audio, lengths, train=train, rngs=rngs)


def _grad_jaxpr(model, audio, lengths) -> str:
    """The jaxpr of a CTC-logit loss's gradient (traced, never run)."""
    graphdef, params = nnx.split(model)

    def loss(p):
        m = nnx.merge(graphdef, p)
        enc, _ = m(audio, lengths, train=False)
        return jnp.sum(m.ctc_logits(enc) ** 2)

    return str(jax.make_jaxpr(jax.grad(loss))(params))


def test_remat_full_reaches_the_model():
    """The blocks of the gradient computation are rematerialized (a remat/checkpoint call
    in the jaxpr) with remat=full and not by default. That the policies leave losses and
    gradients unchanged is tests/models/test_streaming.py's."""
    config = parse(TINY, "--config.model.conformer.remat=full")
    model = build.make_model(config, vocab_size=10, seed=0)
    base = build.make_model(parse(TINY), vocab_size=10, seed=0)
    assert (model.encoder.remat, base.encoder.remat) == ("full", "none")
    audio, lengths = _audio([0.6, 0.45])
    remat_call = r"= (remat\w*|checkpoint)\["
    assert re.search(remat_call, _grad_jaxpr(model, audio, lengths))
    assert not re.search(remat_call, _grad_jaxpr(base, audio, lengths))


def test_subsampling_factor_8_reaches_the_model():
    config = parse(TINY, "--config.model.conformer.subsampling_factor=8")
    base_config = parse(TINY)
    assert config.features.hop_length == HOP
    model = build.make_model(config, vocab_size=10, seed=0)
    base = build.make_model(base_config, vocab_size=10, seed=0)
    assert model.encoder.subsampling.factor == 8

    seconds = [1.0, 0.73]
    audio, lengths = _audio(seconds)
    enc, enc_len = _forward(model, audio, lengths)
    enc4, enc_len4 = _forward(base, audio, lengths)
    n = [int(s * 16000) for s in seconds]
    assert enc.shape[1] == _expected_frames(n[0], 8) == 11  # 101 feature frames
    assert enc4.shape[1] == _expected_frames(n[0], 4) == 24
    assert enc_len.tolist() == [_expected_frames(k, 8) for k in n]
    assert enc_len4.tolist() == [_expected_frames(k, 4) for k in n]

    # Parameters: one more C -> C 3x3 convolution, and the output projection reads
    # C x F/8 instead of C x F/4 values (80 mel bins: 19 -> 9 after the third conv).
    c, d = config.model.conformer.subsampling_channels, config.model.conformer.dim
    f4, f8 = 19, 9
    assert _num_params(model) - _num_params(base) == (9 * c * c + c) + c * (f8 - f4) * d


def test_streaming_options_reach_the_model():
    flags_ = [
        "--config.model.conformer.causal=True",
        "--config.model.conformer.chunk_size=4",
        "--config.model.conformer.left_chunks=2",
        "--config.model.conformer.dynamic_chunk=True",
    ]
    config = parse(TINY, *flags_)
    model = build.make_model(config, vocab_size=10, seed=0)
    enc = model.encoder
    assert (enc.causal, enc.chunk_size, enc.left_chunks, enc.dynamic_chunk) == (True, 4, 2, True)
    assert enc.blocks.conv.causal  # the (scanned) blocks' depthwise convolutions
    enc.stream_frames(first=True)  # streamable: raises unless causal with chunk_size > 0

    # Causal convolutions + chunks of 4 frames: the first chunk (encoder frames 0-3, feature
    # frames up to 4 * 3 + 6 = 18, audio up to sample 18 * 160 + 256) is unchanged by later
    # audio. The full-context model's frames all change.
    audio, lengths = _audio([1.0, 1.0])
    later = audio.at[:, 8000:].set(jnp.asarray(np.random.default_rng(1).standard_normal(8000)))
    full = build.make_model(parse(TINY), vocab_size=10, seed=0)
    out, _ = _forward(model, audio, lengths)
    out_later, _ = _forward(model, later, lengths)
    np.testing.assert_array_equal(out[:, :4], out_later[:, :4])
    assert not np.allclose(out[:, -4:], out_later[:, -4:])
    f_out, _ = _forward(full, audio, lengths)
    f_later, _ = _forward(full, later, lengths)
    assert not np.allclose(f_out[:, :4], f_later[:, :4])

    # dynamic_chunk: in training the chunk size is drawn from the "chunk" stream, so the
    # same batch and augmentation give different encodings for different draws; with it
    # off, the chunk stream is never read.
    def train_outputs(m):
        return [
            np.asarray(_forward(m, audio, lengths, nnx.Rngs(0, specaug=1, chunk=k), train=True)[0])
            for k in range(4)
        ]

    dyn = train_outputs(model)
    assert any(not np.array_equal(dyn[0], o) for o in dyn[1:])
    static = build.make_model(
        parse(TINY, *flags_[:3], "--config.model.conformer.dynamic_chunk=False"), 10, 0
    )
    fixed = train_outputs(static)
    assert all(np.array_equal(fixed[0], o) for o in fixed[1:])
