"""int8 ONNX artifacts: static quantization calibrated on real utterances, in QDQ form.

`jaxspeech.export --format onnx --int8 --calibration DIR:SPLIT` calls `quantize_artifact`
after the float32 conversion. onnxruntime's quantization tool does the work (it is the
runtime the artifact targets, and its QDQ graphs are what its int8 kernels fuse):

- weights: the matrices of the MatMuls with a constant right-hand side (every Dense
  layer), per output channel, symmetric int8 (zero point 0);
- activations: the inputs of those MatMuls, per tensor, asymmetric uint8, from ranges
  collected by running the float32 model on N calibration utterances, with the
  min/max or the percentile method;
- the front end (the log-mel filterbank's MatMul) stays float32: log-mel is computed
  from a power spectrum spanning many orders of magnitude, where 8 bits lose the quiet
  bands; so do the transducer's predictor and joiner (one row per decoding step: their
  cost is the encoder's / T).

`quantization.json` records, read back from the quantized graphs themselves, every
quantized tensor's scale(s) and zero point(s) with the method and the calibration set.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence

import numpy as np

from jaxspeech.models.inference import AUDIO_FUNCTIONS

METHODS = ("minmax", "percentile")
QUANTIZATION_JSON = "quantization.json"
DEFAULT_PERCENTILE = 99.999


def int8_file(name: str) -> str:
    return f"{name}.int8.onnx"


def calibration_windows(
    utterances: Sequence[np.ndarray], max_samples: int
) -> tuple[list[np.ndarray], int]:
    """Equal-length windows of the utterances: (windows, number of utterances skipped).

    onnxruntime's calibrators stack each tensor's values over the calibration inputs, so
    they must have one shape; padding would put the padded frames' activations into the
    ranges. So every utterance is cut to one length W, its first W samples, where W is
    the shorter of `max_samples` and the 10th percentile of the lengths (9 in 10
    utterances are used); shorter utterances are skipped (and counted).
    """
    if not len(utterances):
        return [], 0
    w = int(min(max_samples, np.percentile([len(u) for u in utterances], 10)))
    windows = [np.asarray(u[:w], np.float32) for u in utterances if len(u) >= w]
    return windows, len(utterances) - len(windows)


class _AudioReader:
    """onnxruntime's CalibrationDataReader over utterances, one at a time."""

    def __init__(self, utterances: Sequence[np.ndarray], min_samples: int):
        self._feeds = iter(_feeds(utterances, min_samples))

    def get_next(self) -> dict | None:
        return next(self._feeds, None)


def _feeds(utterances: Sequence[np.ndarray], min_samples: int) -> Iterator[dict]:
    for audio in utterances:
        padded = np.zeros((1, max(len(audio), min_samples)), np.float32)
        padded[0, : len(audio)] = audio
        yield {"audio": padded, "audio_len": np.array([len(audio)], np.int32)}


def frontend_nodes(model, num_freqs: int, num_mels: int) -> list[str]:
    """Names of the MatMuls whose constant operand is the (n_fft/2+1, n_mels) mel
    filterbank: the front end, kept in float32."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and shapes.get(n.input[1]) == (num_freqs, num_mels)
    ]


def calibration_id(utt_ids: Sequence[str]) -> str:
    """A fingerprint of the calibration set: sha256 of its sorted utterance ids."""
    return hashlib.sha256("\n".join(sorted(utt_ids)).encode()).hexdigest()[:16]


def quantize_function(
    src: str,
    dst: str,
    utterances: Sequence[np.ndarray],
    *,
    method: str,
    percentile: float,
    min_samples: int,
    num_freqs: int,
    num_mels: int,
) -> None:
    """Static int8 QDQ quantization of the float32 ONNX file `src` into `dst`."""
    import onnx  # noqa: PLC0415 (the `onnx` extra)
    from onnxruntime import quantization as q  # noqa: PLC0415

    model = onnx.load(src)
    calibrate = {"minmax": q.CalibrationMethod.MinMax, "percentile": q.CalibrationMethod.Percentile}
    q.quantize_static(
        model,
        dst,
        _AudioReader(utterances, min_samples),
        quant_format=q.QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
        nodes_to_exclude=frontend_nodes(model, num_freqs, num_mels),
        calibrate_method=calibrate[method],
        extra_options={
            "MatMulConstBOnly": True,  # weights only: no activation x activation MatMul
            "WeightSymmetric": True,
            "ActivationSymmetric": False,
            "CalibPercentile": percentile,
        },
    )


def describe_qdq(path: str) -> dict:
    """Every quantized tensor of a QDQ ONNX file: {"weights": {name: {...}}, "activations":
    {name: {...}}}, each with its scale(s), zero point(s), type and (per channel) axis."""
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    model = onnx.load(path)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out: dict[str, dict] = {"weights": {}, "activations": {}}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        x, scale, zero = node.input[0], consts[node.input[1]], consts[node.input[2]]
        entry = {
            "scale": scale.tolist(),
            "zero_point": zero.tolist(),
            "dtype": str(zero.dtype),
        }
        axis = [a.i for a in node.attribute if a.name == "axis"]
        if scale.ndim:
            entry["axis"] = axis[0] if axis else 1
        if x in consts:  # an int8 weight stored in the graph
            entry["shape"] = list(consts[x].shape)
            out["weights"][x] = entry
        else:  # the output of a QuantizeLinear of an activation
            out["activations"][x] = entry
    return out


def quantize_artifact(
    output: str,
    functions: dict,
    utterances: Sequence[np.ndarray],
    *,
    method: str,
    percentile: float = DEFAULT_PERCENTILE,
    min_samples: int,
    max_samples: int,
    num_freqs: int,
    num_mels: int,
    calibration: dict,
) -> dict:
    """Quantize the artifact's audio functions (`ctc`, `encoder`) in `output`, calibrated
    on windows of at most `max_samples` of the `utterances` (`calibration_windows`); adds
    "int8_file" to their entries of `functions` and returns quantization.json's content.

    Raises:
      ValueError: an unknown method, or no calibration utterances.
    """
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}: choose one of {METHODS}")
    windows, skipped = calibration_windows(utterances, max_samples)
    if not windows:
        raise ValueError("int8 calibration needs at least one utterance")
    calibration = calibration | {
        "window_samples": len(windows[0]),
        "windows": len(windows),
        "skipped_shorter": skipped,
    }
    report = {
        "format": "onnx QDQ",
        "weights": "int8, symmetric (zero point 0), per output channel (axis 1 of (in, out))",
        "activations": "uint8, asymmetric, per tensor",
        "method": method,
        "percentile": percentile if method == "percentile" else None,
        "calibration": calibration,
        "float32": sorted(set(functions) - set(AUDIO_FUNCTIONS)) + ["front end (log-mel)"],
        "functions": {},
    }
    for name in AUDIO_FUNCTIONS:
        if name not in functions:
            continue
        src = os.path.join(output, functions[name]["file"])
        dst = os.path.join(output, int8_file(name))
        quantize_function(
            src,
            dst,
            windows,
            method=method,
            percentile=percentile,
            min_samples=min_samples,
            num_freqs=num_freqs,
            num_mels=num_mels,
        )
        functions[name]["int8_file"] = os.path.basename(dst)
        tensors = describe_qdq(dst)
        report["functions"][name] = {
            "file": os.path.basename(dst),
            "bytes": os.path.getsize(dst),
            "float32_bytes": os.path.getsize(src),
            **tensors,
        }
    return report
