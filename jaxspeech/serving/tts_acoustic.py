"""The synthesizer's exported function, and its ONNX conversion in the converter's own
environment (`make install-onnx`): `python -m jaxspeech.serving.tts_acoustic --input
STAGE --output DIR`, run by `jaxspeech.serving.tts_export`.

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

STAGE (written by `stage`, from `tts_export.export_onnx`) holds `model.json`
(FastSpeech2's arguments, max_frames, log_floor) and `arrays.npz` (parameters and
statistics by path). The converter imports the model code only (jax, flax, numpy),
never the training stack; the last stdout line is JSON {"file", "einsum_to_matmul",
"seconds"}.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.models import DTYPES
from jaxspeech.models.inference import flat_arrays, unflatten_like
from jaxspeech.tts.model import FastSpeech2, zero

NAME = "acoustic"
INPUTS = ("phonemes", "phoneme_len", "speaker", "duration_scale")
OUTPUTS = ("log_mel", "frame_mask", "durations", "truncated")
MODEL_JSON = "model.json"
ARRAYS = "arrays.npz"


def acoustic_function(
    graphdef, params: dict, stats: dict, max_frames: int, log_floor: float
) -> Callable:
    """The exported function (module docstring) over FastSpeech2 `graphdef` with `params`
    and the target statistics `stats` (`runs.tts_loading.target_stats`) as constants."""
    mean = np.asarray(stats["frontend"]["mean"], np.float32)  # (M,)
    std = np.asarray(stats["frontend"]["std"], np.float32)
    silence = np.float32(math.log(log_floor))
    # jax arrays, not numpy: the model indexes some parameters with traced indices.
    params = jax.tree.map(jnp.asarray, params)

    def acoustic(phonemes, phoneme_len, speaker, duration_scale):
        model = nnx.merge(graphdef, params)
        # iota and expand_dims, not arange()[None]: jax2onnx cannot slice a symbolic axis.
        position = jax.lax.broadcasted_iota(jnp.int32, phonemes.shape, 1)
        valid = position < jnp.expand_dims(phoneme_len, 1)
        tokens = jnp.where(valid, phonemes.astype(jnp.int32), zero(phonemes))  # 0: <pad>
        scale = jnp.expand_dims(duration_scale.astype(jnp.float32), 1)
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
    with open(os.path.join(where, MODEL_JSON), "w") as f:
        json.dump({"arguments": arguments, **extra}, f)
    arrays = {}
    for part, tree in (("params", params), ("stats", stats)):
        arrays |= {f"{part}/{k}": np.asarray(v) for k, v in flat_arrays(tree).items()}
    np.savez(os.path.join(where, ARRAYS), **arrays)


def load_staged(where: str) -> tuple[Callable, dict]:
    """STAGE -> (the acoustic function, the staged description), every path checked."""
    with open(os.path.join(where, MODEL_JSON)) as f:
        described = json.load(f)
    graphdef, params = nnx.split(abstract_model(described["arguments"]), nnx.Param)
    tree = nnx.to_pure_dict(params)
    with np.load(os.path.join(where, ARRAYS)) as npz:
        arrays = dict(npz)
    got = {k[len("params/") :]: v for k, v in arrays.items() if k.startswith("params/")}
    want = flat_arrays(tree)
    if set(got) != set(want) or any(got[k].shape != tuple(a.shape) for k, a in want.items()):
        raise ValueError(
            f"staged parameters do not match the model ({sorted(set(got) ^ set(want))})"
        )
    stats = {"frontend": {k: arrays[f"stats/frontend/{k}"] for k in ("mean", "std")}}
    fn = acoustic_function(
        graphdef,
        unflatten_like(tree, got),
        stats,
        int(described["max_frames"]),
        float(described["log_floor"]),
    )
    return fn, described


def convert(where: str, output: str) -> dict:
    """The staged model -> DIR/acoustic.onnx; returns its description."""
    fn, _ = load_staged(where)
    return write_onnx(fn, argument_specs(), NAME, INPUTS, OUTPUTS, output)


def write_onnx(
    fn: Callable, specs: tuple, name: str, inputs: tuple, outputs: tuple, output: str
) -> dict:
    """jax2onnx's conversion of `fn` at `specs` -> DIR/<name>.onnx (Einsums as MatMuls, as
    the recognizer's; the vocoder's converter shares it) -> {"file", "einsum_to_matmul",
    "seconds"}."""
    import onnx  # noqa: PLC0415 (the converter environment's packages)
    from jax2onnx import to_onnx  # noqa: PLC0415

    from jaxspeech.serving.onnx_convert import einsum_to_matmul  # noqa: PLC0415

    path = os.path.join(output, f"{name}.onnx")
    if os.path.exists(path):
        os.remove(path)
    t0 = time.perf_counter()
    to_onnx(
        fn,
        inputs=list(specs),
        input_names=list(inputs),
        output_names=list(outputs),
        model_name=name,
        return_mode="file",
        output_path=path,
    )
    model = onnx.load(path)
    rewritten = einsum_to_matmul(model)
    onnx.save(model, path)  # these models' parameters stay far below protobuf's 2 GB
    seconds = round(time.perf_counter() - t0, 2)
    return {"file": os.path.basename(path), "einsum_to_matmul": rewritten, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="Staging directory.")
    parser.add_argument("--output", required=True, help="Directory for acoustic.onnx.")
    args = parser.parse_args(argv)
    print(json.dumps(convert(args.input, args.output)), flush=True)


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)  # one warning per untyped shape
    sys.exit(main())
