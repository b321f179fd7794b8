"""The check every synthesizer-side ONNX export ends with (`tts_export`, `vocoder_export`):
the converted file run in onnxruntime against the float32 JAX function it was made from,
and the manifest entry that records the difference."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import numpy as np

from jaxspeech.serving import export as export_lib


def checked_function(output: str, report: dict, fn: Callable, feeds: dict) -> dict:
    """Runs `report["file"]` (in `output`, written by `export_lib.run_converter`) on `feeds`
    (input name -> array, in the function's argument order) and `fn` on the same arrays;
    returns the manifest's entry for the function (file, inputs, outputs, dtype, the
    largest absolute difference over every output, conversion time).

    Raises:
      RuntimeError: the ONNX function differs from JAX's by more than ONNX_TOLERANCE.
    """
    import onnxruntime as ort  # noqa: PLC0415 (the `onnx` extra)

    session = ort.InferenceSession(
        os.path.join(output, report["file"]), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, feeds)
    want = jax.jit(fn)(*feeds.values())
    diff = max(
        float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
        for g, w in zip(got, want, strict=True)
    )
    if diff > export_lib.ONNX_TOLERANCE:
        raise RuntimeError(f"{report['file']} differs from the JAX function by {diff:.3g}")
    return {
        "file": report["file"],
        "inputs": export_lib._describe_onnx(session.get_inputs()),
        "outputs": export_lib._describe_onnx(session.get_outputs()),
        "dtype": export_lib.ONNX_DTYPE,
        "max_abs_diff_vs_jax": diff,
        "conversion_seconds": report["seconds"],
    }
