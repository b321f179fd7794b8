"""What every export shares, whatever it exports (the recognizer's
`serving.recognizer_export`, the synthesizer's `tts.artifact`, the vocoder's
`vocoder.artifact`): the formats, the one-device trace, a function written as StableHLO
with its manifest entry, the ONNX converter run in its own environment, and the check of
a converted file in onnxruntime against the JAX function it was made from.

An export stages its files in a directory and `artifact_dir.publish`es it whole; the
ONNX path stages the model's arguments and arrays for the converter
(`onnx_convert.stage_arrays`), runs `python -m CONVERTER` (`run_converter`) and checks
what came back (`check_onnx_function`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.config import build

FORMATS = ("stablehlo", "onnx")
PLATFORMS = ("cpu", "cuda", "tpu")  # a StableHLO artifact runs on each

# ONNX artifacts compute in float32 whatever the run trained in: onnxruntime's CPU
# kernels have no bfloat16 for most operators.
ONNX_DTYPE = "float32"
ONNX_TOLERANCE = 1e-3  # export fails past it: a conversion error, not rounding
ONNX_CONVERTER = "jaxspeech.serving.onnx_convert"  # the recognizer's converter module

# The checkout this module runs from (jaxspeech/serving/staging.py -> the repository
# root): the converter's environment lives there, and its process imports jaxspeech
# from there.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# onnxruntime's NodeArg types as the manifest's dtypes.
_ONNX_TYPES = {
    "tensor(float)": "float32",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


def check_format(fmt: str) -> None:
    """Raises UserError naming the choices when `fmt` is not one of FORMATS."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}: choose one of {FORMATS}")


def single_device(config: ConfigDict) -> ConfigDict:
    """The run's config with a one-device mesh: the export traces one program."""
    c = config.copy_and_resolve_references()
    c.mesh.replica, c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1, 1
    return c


def one_device_mesh(config: ConfigDict) -> Mesh:
    """The mesh an export loads a run's checkpoint onto: the first device alone, laid out
    by the run's mesh axes (call it inside the run's `rules.axis_rules`)."""
    return build.mesh_from_config(single_device(config), devices=jax.devices()[:1])


def describe_avals(names: Sequence[str], avals) -> list[dict]:
    """Names and `jax.export`'s abstract values -> the manifest's {"name", "shape", "dtype"}
    (symbolic dimensions by name)."""
    return [
        {"name": n, "shape": [str(d) for d in a.shape], "dtype": str(a.dtype)}
        for n, a in zip(names, avals, strict=True)
    ]


def _onnx_type(name: str) -> str:
    return _ONNX_TYPES.get(name, name)


def describe_onnx_args(args) -> list[dict]:
    """onnxruntime's NodeArgs as the manifest's {"name", "shape", "dtype"}."""
    return [
        {"name": a.name, "shape": [str(d) for d in a.shape], "dtype": _onnx_type(a.type)}
        for a in args
    ]


def write_stablehlo(
    fn: Callable,
    specs: Sequence,
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    output: str,
) -> dict:
    """`fn` exported at `specs` (`jax.ShapeDtypeStruct`s, symbolic dimensions allowed) ->
    OUTPUT/<name>.stablehlo (parameters inside as constants); returns its manifest entry
    {"file", "inputs", "outputs", "platforms"}."""
    exported = jax.export.export(jax.jit(fn), platforms=PLATFORMS)(*specs)
    path = os.path.join(output, f"{name}.stablehlo")
    files.atomic_write(path, exported.serialize())
    return {
        "file": os.path.basename(path),
        "inputs": describe_avals(inputs, exported.in_avals),
        "outputs": describe_avals(outputs, exported.out_avals),
        "platforms": list(exported.platforms),
    }


def default_onnx_python() -> str:
    """$JAXSPEECH_ONNX_PYTHON, else the checkout's .venv-onnx (`make install-onnx`)."""
    return os.environ.get("JAXSPEECH_ONNX_PYTHON") or os.path.join(
        REPO_ROOT, ".venv-onnx", "bin", "python"
    )


def run_converter(stage: str, output: str, onnx_python: str, module: str = "") -> dict:
    """`python -m MODULE --input STAGE --output OUTPUT` (default ONNX_CONVERTER; the
    synthesizer's and the vocoder's converters too) in the converter's environment -> its
    report, the last line it printed as JSON.

    Raises:
      UserError: `onnx_python` does not exist.
      RuntimeError: the converter failed (its stderr's tail in the message).
    """
    if not os.path.exists(onnx_python):
        raise UserError(
            f"the ONNX converter's environment is missing ({onnx_python}): run "
            "`make install-onnx`, or pass --onnx_python (or set JAXSPEECH_ONNX_PYTHON) to a "
            "python with jax2onnx and the main install's jax and flax"
        )
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one CPU device is all a conversion traces for
    cmd = [onnx_python, "-m", module or ONNX_CONVERTER, "--input", stage, "--output", output]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"ONNX conversion failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_onnx_function(output: str, report: dict, fn: Callable, feeds: dict) -> dict:
    """Runs `report["file"]` (in `output`, one function's entry of `run_converter`'s report)
    on `feeds` (input name -> array, in the function's argument order) and `fn` on the
    same arrays; returns the manifest's entry for the function (file, inputs, outputs,
    dtype, the largest absolute difference over every output, conversion time).

    Raises:
      RuntimeError: the ONNX function differs from JAX's by more than ONNX_TOLERANCE.
    """
    import onnxruntime as ort  # noqa: PLC0415 (the `onnx` extra)

    session = ort.InferenceSession(
        os.path.join(output, report["file"]), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, feeds)
    want = jax.tree.leaves(jax.jit(fn)(*feeds.values()))
    diff = max(
        float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
        for g, w in zip(got, want, strict=True)
    )
    if diff > ONNX_TOLERANCE:
        raise RuntimeError(f"{report['file']} differs from the JAX function by {diff:.3g}")
    return {
        "file": report["file"],
        "inputs": describe_onnx_args(session.get_inputs()),
        "outputs": describe_onnx_args(session.get_outputs()),
        "dtype": ONNX_DTYPE,
        "max_abs_diff_vs_jax": diff,
        "conversion_seconds": report["seconds"],
    }
