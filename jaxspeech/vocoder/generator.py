"""The vocoder's exported function, and its ONNX conversion in the converter's own
environment (`make install-onnx`): `python -m jaxspeech.vocoder.generator --input
STAGE --output DIR`, run by `jaxspeech.vocoder.artifact`.

`vocoder` (log_mel (b, t, M) float32, frame_mask (b, t) bool) -> (audio (b, t * hop)
float32, sample_mask (b, t * hop) bool): the run's generator, HiFi-GAN's
(`vocoder.hifigan`) or Vocos's (`vocoder.vocos`), through `hifigan.vocode`, on the
recognizer front end's raw log-mel (natural log of mel power + log_floor, not normalized:
the generator was trained on exactly that, so nothing is normalized inside), what the
synthesizer's exported `acoustic` outputs. b and t are symbolic: every layer is a
convolution, a per-frame one or Vocos's fixed inverse STFT (matmuls and shifted adds), so
the length is free (no static frame axis, unlike the acoustic model's). Frames where
frame_mask is false are ignored whatever they hold (every convolution zeroes them first);
their samples are 0 and sample_mask (the frame mask repeated hop times) is false there.

STAGE (written by `onnx_convert.stage_arrays`, from `artifact.export_onnx`) holds
`model.json` ("generator": the class's name in `GENERATORS`, "hifigan" when absent; its
arguments, dtype by name) and `arrays.npz` (the
generator's parameters by path). Imports the model code only (jax, flax, numpy); the last
stdout line is JSON {"file", "einsum_to_matmul", "seconds"}.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspeech.models import DTYPES
from jaxspeech.serving import onnx_convert
from jaxspeech.vocoder.hifigan import HiFiGANGenerator, vocode
from jaxspeech.vocoder.vocos import VocosGenerator

NAME = "vocoder"
INPUTS = ("log_mel", "frame_mask")
OUTPUTS = ("audio", "sample_mask")
# config.vocoder.generator -> its class (config.validate's VOCODER_GENERATORS names them).
GENERATORS = {"hifigan": HiFiGANGenerator, "vocos": VocosGenerator}


def vocoder_function(graphdef, params: dict) -> Callable:
    """The exported function (module docstring) over a generator's `graphdef` with
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
    """A generator's keyword arguments (`vocoder.loading.generator_arguments`) as JSON:
    the dtype by name, sequences as lists."""
    names = {v: k for k, v in DTYPES.items()}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in arguments.items()}
    return out | {"dtype": names[arguments["dtype"]]}


def abstract_generator(arguments: dict, kind: str = "hifigan") -> nnx.Module:
    """The `kind` generator of JSON `arguments` (dtype by name), shapes only."""
    kwargs = dict(arguments, dtype=DTYPES[arguments["dtype"]])
    return nnx.eval_shape(lambda: GENERATORS[kind](**kwargs, rngs=nnx.Rngs(0)))


def load_staged(where: str) -> tuple[Callable, dict]:
    """STAGE -> (the vocoder function, the staged description), every path checked."""
    described, arrays = onnx_convert.read_stage(where)
    kind = described.get("generator", "hifigan")  # staged before Vocos: HiFi-GAN's
    graphdef, params = nnx.split(abstract_generator(described["arguments"], kind), nnx.Param)
    params = onnx_convert.staged_tree(arrays, "params", nnx.to_pure_dict(params))
    return vocoder_function(graphdef, params), described


def convert(where: str, output: str) -> dict:
    """The staged generator -> DIR/vocoder.onnx; returns its description."""
    fn, described = load_staged(where)
    specs = argument_specs(int(described["arguments"]["n_mels"]))
    return onnx_convert.write_onnx(fn, specs, NAME, INPUTS, OUTPUTS, output)


def main(argv: list[str] | None = None) -> None:
    onnx_convert.converter_main(convert, __doc__, "Directory for vocoder.onnx.", argv)


if __name__ == "__main__":
    onnx_convert.run_converter_process(main)
