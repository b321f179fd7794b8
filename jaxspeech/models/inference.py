"""A trained model's inference functions, as exported (`jaxspeech.export`).

Pure functions of arrays with the parameters closed over, one per piece a runtime
calls, and the symbolic-shape arguments they are exported for (b: batch, s: samples).
This module needs the model code alone (jax, flax): the ONNX converter's own
environment (`jaxspeech.serving.onnx_convert`) imports it without the training stack.

- CTC (`ctc`, `ctc+rnnt` models): `ctc` (audio f32[b, s], audio_len i32[b]) ->
  (log_probs f32[b, t, V], lengths i32[b]).
- Transducer (`rnnt`, `ctc+rnnt`): `encoder` (audio, audio_len) -> (enc_proj
  f32[b, t, J], lengths); `predictor_init` (tokens i32[b]) -> the predictor's state
  (the tokens only give the batch size); `predictor_step` (state..., tokens i32[b]) ->
  (pred_proj f32[b, J], next_state...); `joiner` (enc_proj f32[b, J], pred_proj f32[b, J])
  -> log_probs f32[b, V]. Greedy search starts with one predictor step on the blank, as
  `jaxspeech.decoding.rnnt` does.
- Streaming encoders (`causal` Conformer with `chunk_size` C > 0) also: `stream_first`
  (audio f32[b, S1]) -> (outputs, valid, next.<state>...); `stream_step` (<state>...,
  audio f32[b, S2]) -> the same; `stream_flush` (<state>..., audio f32[b, S2], audio_len
  i32[b]) -> (outputs, valid) ends the streams with their last 0..S2 samples;
  `stream_flush_first` (audio f32[b, S1], audio_len) ends streams shorter than S1.
  Outputs are `log_probs` (CTC) and/or `enc_proj` (transducer) of C frames per step
  (2C per flush), `valid` bool marks the real ones; together they equal the masked
  full-sequence outputs of the same audio (`ASRModel.stream_step`). The state is the
  `ASRStreamState` leaves by name; the streams of a batch advance together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models.decoder import SOS_EOS

# Shorter audio gives the front end and the subsampling no frame: the runtime pads it.
MIN_SECONDS = 0.1
# Functions whose inputs are audio (the ones int8 calibration feeds).
AUDIO_FUNCTIONS = ("ctc", "encoder")
# A ctc+aed model's attention decoder (StableHLO only, `inference_functions`).
ATTENTION_FUNCTIONS = ("aed_encoder", "decoder_step")
STREAM_FUNCTIONS = ("stream_first", "stream_step", "stream_flush", "stream_flush_first")


def inference_functions(
    graphdef,
    params: dict,
    model_vars: dict,
    *,
    stream_history: int | None = None,
    attention_decoder: bool = False,
) -> dict[str, Callable]:
    """name -> a pure function of arrays with the parameters closed over (numpy constants,
    so the exported program does not depend on the devices they were loaded on).

    `stream_history`: encoder frames of attention cache for a streaming encoder with
    unlimited left context (`left_chunks < 0`; see `ConformerEncoder.init_stream`).
    `attention_decoder`: a ctc+aed model also gets `aed_encoder` and `decoder_step`
    (`ATTENTION_FUNCTIONS`; the StableHLO export asks for them, the ONNX one does not yet).
    """
    params, model_vars = jax.device_get(params), jax.device_get(model_vars)

    def model():  # jnp constants: numpy arrays cannot be indexed by traced values
        return nnx.merge(graphdef, *jax.tree.map(jnp.asarray, (params, model_vars)))

    out: dict[str, Callable] = {}
    head = model().head.split("+")
    if "ctc" in head:

        def ctc(audio_bs, audio_len_b):
            m = model()
            enc, lengths = m(audio_bs, audio_len_b, train=False)
            return jax.nn.log_softmax(m.ctc_logits(enc), axis=-1), lengths

        out["ctc"] = ctc
    if "rnnt" in head:

        def encoder(audio_bs, audio_len_b):
            m = model()
            enc, lengths = m(audio_bs, audio_len_b, train=False)
            return m.transducer.joiner.enc_proj(enc).astype(jnp.float32), lengths

        def predictor_init(tokens_b):
            init, _, _ = model().transducer.decoder_fns()
            return tuple(jax.tree.leaves(init(tokens_b.shape[0])))

        def predictor_step(*state_and_tokens):
            *leaves, tokens_b = state_and_tokens
            init, step, _ = model().transducer.decoder_fns()
            treedef = jax.tree.structure(init(1))
            pred, state = step(jax.tree.unflatten(treedef, leaves), tokens_b)
            return (pred.astype(jnp.float32), *jax.tree.leaves(state))

        def joiner(enc_proj_bj, pred_proj_bj):
            _, _, joint = model().transducer.decoder_fns()
            return jax.nn.log_softmax(joint(enc_proj_bj, pred_proj_bj).astype(jnp.float32), -1)

        out |= {
            "encoder": encoder,
            "predictor_init": predictor_init,
            "predictor_step": predictor_step,
            "joiner": joiner,
        }
    if attention_decoder and "aed" in head:
        out |= _attention_functions(model)
    if streamable(model()):
        out |= _stream_functions(model, stream_history)
    return out


def _attention_functions(model: Callable) -> dict[str, Callable]:
    """`aed_encoder` (audio, audio_len) -> (encodings f32[b, t, E], lengths) and
    `decoder_step` (encodings, lengths, prefix i32[b, u]) -> log_probs f32[b, V] of the
    token after each prefix (which starts with <sos> = `decoder.SOS_EOS`; <eos> ends a
    hypothesis). The step recomputes the whole prefix (no cache): u is small."""

    def aed_encoder(audio_bs, audio_len_b):
        enc, lengths = model()(audio_bs, audio_len_b, train=False)
        return enc.astype(jnp.float32), lengths

    def decoder_step(enc_btd, enc_len_b, prefix_bu):
        logits = model().decoder(prefix_bu, enc_btd, enc_len_b)  # (b, u, V)
        last = jax.lax.dynamic_index_in_dim(logits, logits.shape[1] - 1, 1, keepdims=False)
        return jax.nn.log_softmax(last, axis=-1)

    return {"aed_encoder": aed_encoder, "decoder_step": decoder_step}


def streamable(model) -> bool:
    """Whether the model's encoder streams (a causal Conformer with chunk_size > 0)."""
    enc = model.encoder
    return bool(getattr(enc, "causal", False)) and getattr(enc, "chunk_size", 0) > 0


def _head_outputs(m, enc_btd: jax.Array) -> tuple[jax.Array, ...]:
    """Encodings -> the stream outputs of the model's heads: CTC log-probs, enc_proj."""
    head = m.head.split("+")
    out = ()
    if "ctc" in head:
        out += (jax.nn.log_softmax(m.ctc_logits(enc_btd), axis=-1),)
    if "rnnt" in head:
        out += (m.transducer.joiner.enc_proj(enc_btd).astype(jnp.float32),)
    return out


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """A streaming artifact's contract (each stream function carries it as `.stream`)."""

    first_samples: int  # S1: audio samples of `stream_first` / `stream_flush_first`
    step_samples: int  # S2: audio samples of `stream_step` / `stream_flush`
    frames: int  # C: encoder frames each step emits (a flush emits 2C)
    frame_samples: int  # audio samples per encoder frame (hop * subsampling factor)
    history: int  # L: encoder frames of attention cache
    outputs: tuple[str, ...]  # "log_probs" (CTC) and/or "enc_proj" (transducer)
    state: tuple[str, ...]  # the state's leaves, by name ("encoder.keys_nblhk", ...)


def _stream_functions(model: Callable, history: int | None) -> dict[str, Callable]:
    """The four stream functions (see the module docstring) over `ASRModel.stream_step`
    and `stream_flush`: the first call's shapes differ from the later ones' (the front
    end's lag and the subsampling's receptive field), so each is its own function, and
    the state after the first call is the one every later call takes."""
    m = model()
    s1, s2 = m.stream_samples(first=True), m.stream_samples(first=False)
    heads = m.head.split("+")

    def fresh(b):
        return model().init_stream(b, max_history=history)

    started = jax.eval_shape(
        lambda a: model().stream_step(fresh(1), a)[2], jax.ShapeDtypeStruct((1, s1), jnp.float32)
    )
    paths = jax.tree_util.tree_flatten_with_path(started)[0]
    info = StreamInfo(
        first_samples=s1,
        step_samples=s2,
        frames=m.encoder.chunk_size,
        frame_samples=m.frame_samples,
        history=int(started.encoder.cache_valid_bl.shape[1]),
        outputs=tuple(n for h, n in (("ctc", "log_probs"), ("rnnt", "enc_proj")) if h in heads),
        state=tuple(jax.tree_util.keystr(k, simple=True, separator=".") for k, _ in paths),
    )
    treedef = jax.tree.structure(started)  # started=True: what every later call takes

    def stream_first(audio_bs):
        m = model()
        enc, valid, state = m.stream_step(fresh(audio_bs.shape[0]), audio_bs)
        return (*_head_outputs(m, enc), valid, *jax.tree.leaves(state))

    def stream_step(*state_and_audio):
        *leaves, audio_bs = state_and_audio
        m = model()
        enc, valid, state = m.stream_step(jax.tree.unflatten(treedef, leaves), audio_bs)
        return (*_head_outputs(m, enc), valid, *jax.tree.leaves(state))

    def stream_flush(*state_and_audio):
        *leaves, audio_bs, audio_len_b = state_and_audio
        m = model()
        enc, valid = m.stream_flush(jax.tree.unflatten(treedef, leaves), audio_bs, audio_len_b)
        return (*_head_outputs(m, enc), valid)

    def stream_flush_first(audio_bs, audio_len_b):
        m = model()
        enc, valid = m.stream_flush(fresh(audio_bs.shape[0]), audio_bs, audio_len_b)
        return (*_head_outputs(m, enc), valid)

    fns = {
        "stream_first": stream_first,
        "stream_step": stream_step,
        "stream_flush": stream_flush,
        "stream_flush_first": stream_flush_first,
    }
    for fn in fns.values():
        fn.stream = info
    return fns


def _stream_specs(name: str, fns: dict[str, Callable]) -> tuple:
    """The stream functions' arguments: the state's leaves (their shapes after the first
    call, batch b), audio of the call's fixed size, and the flushes' lengths."""
    info = fns[name].stream
    (b,) = jax.export.symbolic_shape("b")
    audio = lambda n: jax.ShapeDtypeStruct((b, n), jnp.float32)  # noqa: E731
    lengths = jax.ShapeDtypeStruct((b,), jnp.int32)
    first = jax.eval_shape(fns["stream_first"], audio(info.first_samples))
    state = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in first[len(info.outputs) + 1 :])
    return {
        "stream_first": (audio(info.first_samples),),
        "stream_step": (*state, audio(info.step_samples)),
        "stream_flush": (*state, audio(info.step_samples), lengths),
        "stream_flush_first": (audio(info.first_samples), lengths),
    }[name]


def argument_specs(name: str, fns: dict[str, Callable], sample_rate: int) -> tuple:
    """The symbolic-shape arguments each function is exported for (b: batch, s: samples)."""
    if name in STREAM_FUNCTIONS:
        return _stream_specs(name, fns)
    min_samples = int(MIN_SECONDS * sample_rate)
    b, s = jax.export.symbolic_shape("b, s", constraints=(f"s >= {min_samples}",))
    audio = (jax.ShapeDtypeStruct((b, s), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.int32))
    if name in AUDIO_FUNCTIONS or name == "aed_encoder":
        return audio
    if name == "decoder_step":  # encodings of t frames, prefixes of u >= 1 tokens
        b, t, u = jax.export.symbolic_shape("b, t, u", constraints=("t >= 1", "u >= 1"))
        enc = jax.eval_shape(fns["aed_encoder"], *audio)[0]
        return (
            jax.ShapeDtypeStruct((b, t, enc.shape[-1]), jnp.float32),
            jax.ShapeDtypeStruct((b,), jnp.int32),
            jax.ShapeDtypeStruct((b, u), jnp.int32),
        )
    (b,) = jax.export.symbolic_shape("b")  # the decoder's functions see no audio length
    tokens = jax.ShapeDtypeStruct((b,), jnp.int32)
    if name == "predictor_init":
        return (tokens,)
    if name == "joiner":
        enc_out = jax.eval_shape(fns["encoder"], *audio)[0]  # (b, t, J)
        pred = jax.eval_shape(fns["predictor_step"], *state_specs(fns, b), tokens)[0]
        return (
            jax.ShapeDtypeStruct((b, enc_out.shape[-1]), jnp.float32),
            jax.ShapeDtypeStruct((b, pred.shape[-1]), pred.dtype),
        )
    return (*state_specs(fns, b), tokens)  # predictor_step


def state_specs(fns: dict[str, Callable], b) -> tuple:
    """The predictor state's leaves for a batch of `b`."""
    return tuple(
        jax.ShapeDtypeStruct(x.shape, x.dtype)
        for x in jax.eval_shape(fns["predictor_init"], jax.ShapeDtypeStruct((b,), jnp.int32))
    )


def io_names(name: str, fns: dict[str, Callable]) -> tuple[list[str], list[str]]:
    """Input and output names of each function (the manifest's and the ONNX graph's)."""
    n_state = len(state_specs(fns, 1)) if "predictor_init" in fns else 0
    state = [f"state_{i}" for i in range(n_state)]
    # ONNX graphs need names unique over inputs and outputs: the step's new state is
    # next_state_i (fed back as state_i).
    next_state = [f"next_{n}" for n in state]
    if name in STREAM_FUNCTIONS:
        info = fns[name].stream
        outs = [*info.outputs, "valid"]
        nxt = [f"next.{n}" for n in info.state]
        return {
            "stream_first": (["audio"], [*outs, *nxt]),
            "stream_step": ([*info.state, "audio"], [*outs, *nxt]),
            "stream_flush": ([*info.state, "audio", "audio_len"], outs),
            "stream_flush_first": (["audio", "audio_len"], outs),
        }[name]
    return {
        "ctc": (["audio", "audio_len"], ["log_probs", "lengths"]),
        "encoder": (["audio", "audio_len"], ["enc_proj", "lengths"]),
        "predictor_init": (["tokens"], state),
        "predictor_step": ([*state, "tokens"], ["pred_proj", *next_state]),
        "joiner": (["enc_proj", "pred_proj"], ["log_probs"]),
        "aed_encoder": (["audio", "audio_len"], ["encodings", "lengths"]),
        "decoder_step": (["encodings", "lengths", "prefix"], ["log_probs"]),
    }[name]


def _path(keys) -> str:
    """A tree path as "a/b/0/c": the same string whether a list index arrives as an int
    or (after a round trip through a checkpoint) as a string."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keys)


def flat_arrays(tree) -> dict:
    """A pure dict of arrays -> {"a/b/0/c": array}: how parameters travel to another
    process (`jaxspeech.serving.onnx_convert`), matched there by path, not by order."""
    return {_path(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def unflatten_like(tree, flat: dict):
    """`flat_arrays`'s inverse onto `tree`'s structure (its leaves' paths index `flat`)."""
    return jax.tree_util.tree_map_with_path(lambda k, _: flat[_path(k)], tree)


def unscanned(arguments: dict, params: dict) -> tuple[dict, dict]:
    """A scanned Conformer (`scan_layers`: parameters stacked on a leading layer axis) as
    the same model with one block per layer: (arguments, params).

    An exported graph with the layers unrolled is the one that onnxruntime optimizes
    across layers and that int8 quantization reaches (a scan becomes an ONNX Loop, whose
    body static quantization does not enter). The computation is the same.
    """
    kwargs = arguments["encoder_kwargs"]
    if arguments["encoder"] != "conformer" or not kwargs.get("scan_layers"):
        return arguments, params
    stacked = params["encoder"]["blocks"]
    blocks = {i: jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(kwargs["num_layers"])}
    params = params | {"encoder": params["encoder"] | {"blocks": blocks}}
    return arguments | {"encoder_kwargs": kwargs | {"scan_layers": False}}, params


def attention_manifest(head: str, exported: bool) -> dict | None:
    """The manifest's "attention_decoder": None for a model without one; else whether the
    artifact holds `ATTENTION_FUNCTIONS` (StableHLO) or not yet (ONNX), never silent."""
    if "aed" not in head.split("+"):
        return None
    if exported:
        return {"exported": True, "functions": list(ATTENTION_FUNCTIONS), "sos_eos": SOS_EOS}
    return {
        "exported": False,
        "why": "ONNX export of the attention decoder is not implemented yet; this artifact "
        "decodes through its CTC function",
    }
