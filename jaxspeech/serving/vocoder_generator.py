"""The vocoder's exported function, and its ONNX conversion in the converter's own
environment (`make install-onnx`): `python -m jaxspeech.serving.vocoder_generator --input
STAGE --output DIR`, run by `jaxspeech.serving.vocoder_export`.

`vocoder` (log_mel (b, t, M) float32, frame_mask (b, t) bool) -> (audio (b, t * hop)
float32, sample_mask (b, t * hop) bool): HiFi-GAN's generator (`tts.hifigan.vocode`) on the
recognizer front end's raw log-mel (natural log of mel power + log_floor, not normalized:
the generator was trained on exactly that, so nothing is normalized inside), what the
synthesizer's exported `acoustic` outputs. b and t are symbolic: every layer is a
convolution, so the length is free (no static frame axis, unlike the acoustic model's).
Frames where frame_mask is false are ignored whatever they hold (every convolution zeroes
them first); their samples are 0 and sample_mask (the frame mask repeated hop times) is
false there.

STAGE (written by `tts_acoustic.stage`, from `vocoder_export.export_onnx`) holds
`model.json` (HiFiGANGenerator's arguments, dtype by name) and `arrays.npz` (the
generator's parameters by path). Imports the model code only (jax, flax, numpy); the last
stdout line is JSON {"file", "einsum_to_matmul", "seconds"}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.models import DTYPES
from jaxspeech.models.inference import flat_arrays, unflatten_like
from jaxspeech.serving import tts_acoustic
from jaxspeech.tts.hifigan import HiFiGANGenerator, vocode

NAME = "vocoder"
INPUTS = ("log_mel", "frame_mask")
OUTPUTS = ("audio", "sample_mask")


def vocoder_function(graphdef, params: dict) -> Callable:
    """The exported function (module docstring) over HiFiGANGenerator `graphdef` with
    `params` as constants."""
    params = jax.tree.map(jnp.asarray, params)

    def vocoder(log_mel, frame_mask):
        generator = nnx.merge(graphdef, params)
        mask = frame_mask.astype(jnp.bool_)
        audio = vocode(generator, log_mel.astype(jnp.float32), mask)
        return audio, jnp.repeat(mask, generator.hop, axis=1)

    return vocoder


def argument_specs(n_mels: int) -> tuple:
    """The symbolic-shape arguments: batch b, frames t >= 1."""
    b, t = jax.export.symbolic_shape("b, t", constraints=("t >= 1",))
    return (
        jax.ShapeDtypeStruct((b, t, n_mels), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.bool_),
    )


def json_arguments(arguments: dict) -> dict:
    """HiFiGANGenerator's keyword arguments (`runs.vocoder_loading.generator_arguments`)
    as JSON: the dtype by name, sequences as lists."""
    names = {v: k for k, v in DTYPES.items()}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in arguments.items()}
    return out | {"dtype": names[arguments["dtype"]]}


def abstract_generator(arguments: dict) -> HiFiGANGenerator:
    """HiFiGANGenerator of JSON `arguments` (dtype by name), shapes only."""
    kwargs = dict(arguments, dtype=DTYPES[arguments["dtype"]])
    return nnx.eval_shape(lambda: HiFiGANGenerator(**kwargs, rngs=nnx.Rngs(0)))


def load_staged(where: str) -> tuple[Callable, dict]:
    """STAGE -> (the vocoder function, the staged description), every path checked."""
    with open(os.path.join(where, tts_acoustic.MODEL_JSON)) as f:
        described = json.load(f)
    graphdef, params = nnx.split(abstract_generator(described["arguments"]), nnx.Param)
    tree = nnx.to_pure_dict(params)
    with np.load(os.path.join(where, tts_acoustic.ARRAYS)) as npz:
        got = {k[len("params/") :]: v for k, v in npz.items() if k.startswith("params/")}
    want = flat_arrays(tree)
    if set(got) != set(want) or any(got[k].shape != tuple(a.shape) for k, a in want.items()):
        raise ValueError(
            f"staged parameters do not match the generator ({sorted(set(got) ^ set(want))})"
        )
    return vocoder_function(graphdef, unflatten_like(tree, got)), described


def convert(where: str, output: str) -> dict:
    """The staged generator -> DIR/vocoder.onnx; returns its description."""
    fn, described = load_staged(where)
    specs = argument_specs(int(described["arguments"]["n_mels"]))
    return tts_acoustic.write_onnx(fn, specs, NAME, INPUTS, OUTPUTS, output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="Staging directory.")
    parser.add_argument("--output", required=True, help="Directory for vocoder.onnx.")
    args = parser.parse_args(argv)
    print(json.dumps(convert(args.input, args.output)), flush=True)


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)  # one warning per untyped shape
    sys.exit(main())
