"""A trained model's inference functions, as exported (`jaxspeech.export`).

Pure functions of arrays with the parameters closed over, one per piece a runtime
calls, and the symbolic-shape arguments they are exported for (b: batch, s: samples).
This module needs the model code alone (jax, flax): the ONNX converter's own
environment (`jaxspeech.onnx_convert`) imports it without the training stack.

- CTC (`ctc`, `ctc+rnnt` models): `ctc` (audio f32[b, s], audio_len i32[b]) ->
  (log_probs f32[b, t, V], lengths i32[b]).
- Transducer (`rnnt`, `ctc+rnnt`): `encoder` (audio, audio_len) -> (enc_proj
  f32[b, t, J], lengths); `predictor_init` (tokens i32[b]) -> the predictor's state
  (the tokens only give the batch size); `predictor_step` (state..., tokens i32[b]) ->
  (pred_proj f32[b, J], next_state...); `joiner` (enc_proj f32[b, J], pred_proj f32[b, J])
  -> log_probs f32[b, V]. Greedy search starts with one predictor step on the blank, as
  `jaxspeech.decoding.rnnt` does.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

# Shorter audio gives the front end and the subsampling no frame: the runtime pads it.
MIN_SECONDS = 0.1
# Functions whose inputs are audio (the ones int8 calibration feeds).
AUDIO_FUNCTIONS = ("ctc", "encoder")


def inference_functions(graphdef, params: dict, model_vars: dict) -> dict[str, Callable]:
    """name -> a pure function of arrays with the parameters closed over (numpy constants,
    so the exported program does not depend on the devices they were loaded on)."""
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
    return out


def argument_specs(name: str, fns: dict[str, Callable], sample_rate: int) -> tuple:
    """The symbolic-shape arguments each function is exported for (b: batch, s: samples)."""
    min_samples = int(MIN_SECONDS * sample_rate)
    b, s = jax.export.symbolic_shape("b, s", constraints=(f"s >= {min_samples}",))
    audio = (jax.ShapeDtypeStruct((b, s), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.int32))
    if name in AUDIO_FUNCTIONS:
        return audio
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
    return {
        "ctc": (["audio", "audio_len"], ["log_probs", "lengths"]),
        "encoder": (["audio", "audio_len"], ["enc_proj", "lengths"]),
        "predictor_init": (["tokens"], state),
        "predictor_step": ([*state, "tokens"], ["pred_proj", *next_state]),
        "joiner": (["enc_proj", "pred_proj"], ["log_probs"]),
    }[name]


def _path(keys) -> str:
    """A tree path as "a/b/0/c": the same string whether a list index arrives as an int
    or (after a round trip through a checkpoint) as a string."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keys)


def flat_arrays(tree) -> dict:
    """A pure dict of arrays -> {"a/b/0/c": array}: how parameters travel to another
    process (`jaxspeech.onnx_convert`), matched there by path, not by order."""
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
