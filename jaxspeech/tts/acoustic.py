"""The synthesizer's exported function, and its ONNX conversion in the converter's own
environment (`make install-onnx`): `python -m jaxspeech.tts.acoustic --input
STAGE --output DIR`, run by `jaxspeech.tts.artifact`.

`acoustic` (phonemes (b, n) int32, phoneme_len (b,) int32, speaker (b,) int32,
duration_scale (b,) float32) -> (log_mel (b, T, M) float32, frame_mask (b, T) bool,
durations (b, n) int32, truncated (b,) bool): FastSpeech2's inference
(`FastSpeech2.synthesize`: predicted durations, pitch and energy) with the run's feature
statistics inside, so that log_mel is the recognizer's front end's raw log-mel, what a
vocoder takes. T = max_frames is static (the length regulator's output length depends
on the predicted durations, so the graph has a fixed frame axis and a mask); b and n are
symbolic. Positions >= phoneme_len are padding whatever they hold. Frames past a row's
end hold log(log_floor), the front end's silence; a row whose durations sum past T is
cut at T (truncated; its mask is all true).

Inputs outside the tables are CLAMPED, never an error and never NaN (`sanitized`): a
speaker id < 0 or >= the speaker table speaks as the nearest valid id (0 or the last);
a phoneme id outside the phoneme table as <unk> (id 1); phoneme_len is clipped to
[0, n] (0: no frame, log_mel all silence, not truncated); a duration_scale that is not
a finite number > 0 as 1. Unclamped, `jnp.take` filled an id past a table with NaN (the
row's durations then came from a NaN cast to int: no frame on CPU, undefined elsewhere)
and wrapped a negative one round to the table's end. Callers that want an error check
the ids against the manifest's tables first (`python -m jaxspeech.synthesize --artifact`
does: one line, exit 2).

STAGE (written by `stage`, from `tts.artifact.export_onnx`) holds `model.json`
(FastSpeech2's arguments, max_frames, log_floor) and `arrays.npz` (parameters and
statistics by path). The converter imports the model code only (jax, flax, numpy),
never the training stack; the last stdout line is JSON {"file", "einsum_to_matmul",
"seconds"}.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.models import DTYPES
from jaxspeech.serving import onnx_convert
from jaxspeech.tts.model import FastSpeech2, zero

NAME = "acoustic"
INPUTS = ("phonemes", "phoneme_len", "speaker", "duration_scale")
OUTPUTS = ("log_mel", "frame_mask", "durations", "truncated")
UNK_ID = 1  # "<unk>" of every phoneme table (tts.batch.PhonemeTable)


def sanitized(
    phonemes, phoneme_len, speaker, duration_scale, num_phonemes: int, num_speakers: int
) -> tuple:
    """The acoustic function's inputs clamped into its tables (module docstring): (b, n)
    int32 tokens (<pad> 0 at and past each row's clipped length), (b,) int32 speakers,
    (b, 1) float32 duration scales. Typed constants throughout: jax2onnx widens Python
    numbers to 64 bits."""
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    phonemes = phonemes.astype(jnp.int32)
    # iota and expand_dims, not arange()[None]: jax2onnx cannot slice a symbolic axis.
    position = jax.lax.broadcasted_iota(jnp.int32, phonemes.shape, 1)
    valid = position < jnp.expand_dims(phoneme_len.astype(jnp.int32), 1)  # len <= 0: none
    known = (phonemes >= i32(0)) & (phonemes < i32(num_phonemes))
    tokens = jnp.where(known, phonemes, i32(UNK_ID))
    tokens = jnp.where(valid, tokens, zero(tokens))  # 0: <pad>
    speaker = jnp.clip(speaker.astype(jnp.int32), i32(0), i32(num_speakers - 1))
    scale = duration_scale.astype(jnp.float32)
    usable = (scale > jnp.float32(0)) & (scale < jnp.float32(np.inf))  # NaN: neither
    scale = jnp.where(usable, scale, jnp.ones((), jnp.float32))
    return tokens, speaker, jnp.expand_dims(scale, 1)


def acoustic_function(
    graphdef, params: dict, stats: dict, max_frames: int, log_floor: float
) -> Callable:
    """The exported function (module docstring) over FastSpeech2 `graphdef` with `params`
    and the target statistics `stats` (`tts.loading.target_stats`) as constants."""
    mean = np.asarray(stats["frontend"]["mean"], np.float32)  # (M,)
    std = np.asarray(stats["frontend"]["std"], np.float32)
    silence = np.float32(math.log(log_floor))
    # jax arrays, not numpy: the model indexes some parameters with traced indices.
    params = jax.tree.map(jnp.asarray, params)

    def acoustic(phonemes, phoneme_len, speaker, duration_scale):
        model = nnx.merge(graphdef, params)
        tokens, speaker, scale = sanitized(
            phonemes, phoneme_len, speaker, duration_scale, *model.id_ranges
        )
        mel, mask, durations = model.synthesize(tokens, speaker, max_frames, duration_scale=scale)
        log_mel = jnp.where(mask[..., None], mel * std + mean, silence)
        return log_mel, mask, durations, jnp.sum(durations, axis=1) > max_frames

    return acoustic


def argument_specs() -> tuple:
    """The symbolic-shape arguments: batch b, phonemes n >= 1 (the length regulator needs
    one token per row; a row's phoneme_len may still be 0)."""
    b, n = jax.export.symbolic_shape("b, n", constraints=("n >= 1",))
    return (
        jax.ShapeDtypeStruct((b, n), jnp.int32),
        jax.ShapeDtypeStruct((b,), jnp.int32),
        jax.ShapeDtypeStruct((b,), jnp.int32),
        jax.ShapeDtypeStruct((b,), jnp.float32),
    )


def abstract_model(arguments: dict) -> FastSpeech2:
    """FastSpeech2 of JSON `arguments` (dtype by name), shapes only."""
    kwargs = dict(arguments, dtype=DTYPES[arguments["dtype"]])
    return nnx.eval_shape(lambda: FastSpeech2(**kwargs, rngs=nnx.Rngs(0)))


def stage(arguments: dict, params: dict, stats: dict, extra: dict, where: str) -> None:
    """Write what the converter reads into `where`: JSON `arguments` (dtype by name) and
    `extra` (max_frames, log_floor), and the host arrays by path."""
    onnx_convert.stage_arrays(
        where, {"arguments": arguments, **extra}, {"params": params, "stats": stats}
    )


def load_staged(where: str) -> tuple[Callable, dict]:
    """STAGE -> (the acoustic function, the staged description), every path checked."""
    described, arrays = onnx_convert.read_stage(where)
    graphdef, params = nnx.split(abstract_model(described["arguments"]), nnx.Param)
    params = onnx_convert.staged_tree(arrays, "params", nnx.to_pure_dict(params))
    stats = {"frontend": {k: arrays[f"stats/frontend/{k}"] for k in ("mean", "std")}}
    fn = acoustic_function(
        graphdef,
        params,
        stats,
        int(described["max_frames"]),
        float(described["log_floor"]),
    )
    return fn, described


def convert(where: str, output: str) -> dict:
    """The staged model -> DIR/acoustic.onnx; returns its description."""
    fn, _ = load_staged(where)
    return onnx_convert.write_onnx(fn, argument_specs(), NAME, INPUTS, OUTPUTS, output)


def main(argv: list[str] | None = None) -> None:
    onnx_convert.converter_main(convert, __doc__, "Directory for acoustic.onnx.", argv)


if __name__ == "__main__":
    onnx_convert.run_converter_process(main)
