"""Deployment artifacts: `python -m jaxspeech.export --workdir RUN --format stablehlo|onnx
--output DIR [--int8 --calibration DATA_DIR:SPLIT]`.

The artifact takes 16 kHz audio: the front end (log-mel, or MFCC) and the run's feature
normalization are inside it, with a symbolic batch `b` and length `s` (any length,
also longer than every training bucket). Its functions (`jaxspeech.models.inference`)
depend on the head: CTC models `ctc` (audio, audio_len) -> (log_probs, lengths);
transducers `encoder`, `predictor_init`, `predictor_step` and `joiner`, so that a
runtime can run greedy or beam search. Streaming encoders (causal, chunk_size > 0)
add `stream_first`, `stream_step`, `stream_flush` and `stream_flush_first`: fixed-size
audio chunks in, C frames of the heads' outputs out, the state as named inputs and
outputs (the manifest's "streaming" says how to drive them).

- stablehlo: `<name>.stablehlo`, `jax.export`'s serialization (parameters inside as
  constants): `jax.export.deserialize(bytes).call(*arrays)` runs it with jax alone.
- onnx: `<name>.onnx`, float32, converted by jax2onnx in the converter's own
  environment (`make install-onnx`; `jaxspeech.serving.onnx_convert`), each checked in
  onnxruntime against the JAX function here. `--int8` adds `ctc.int8.onnx` /
  `encoder.int8.onnx` (QDQ, `jaxspeech.serving.quantize`) and `quantization.json`.

Beside them: `manifest.json` (inputs, outputs, shapes, sample rate, feature settings,
tokenizer, the run's step, config and parameter fingerprint, dev WER/CER of the
exported checkpoint) and `tokenizer/` (the run's tokenizer files).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from jaxspeech import models
from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import reader, records
from jaxspeech.evaluation import run as eval_run
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.models import inference
from jaxspeech.models.inference import MIN_SECONDS, argument_specs, inference_functions
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading
from jaxspeech.serving import artifact_dir, quantize, staging

CALIBRATION_SECONDS = 4.0  # the longest int8 calibration window (quantize.calibration_windows)


MANIFEST = artifact_dir.MANIFEST


# ---------------------------------------------------------------- StableHLO
def export_stablehlo(fns: dict[str, Callable], sample_rate: int, output: str) -> dict:
    """Write <name>.stablehlo for every function; returns the manifest's "functions"."""
    described = {}
    for name, fn in fns.items():
        specs = argument_specs(name, fns, sample_rate)
        inputs, outputs = inference.io_names(name, fns)
        described[name] = staging.write_stablehlo(fn, specs, name, inputs, outputs, output)
    return described


# ---------------------------------------------------------------- ONNX
def stage_for_conversion(
    arguments: dict,
    params: dict,
    model_vars: dict,
    sample_rate: int,
    names,
    stage: str,
    stream_history: int | None = None,
) -> None:
    """Write what `jaxspeech.serving.onnx_convert` reads: the model's arguments and its arrays."""
    from jaxspeech.serving import onnx_convert  # noqa: PLC0415 (file names only; no jax2onnx)

    described = {
        "arguments": arguments,
        "sample_rate": sample_rate,
        "functions": list(names),
        "stream_history": stream_history,
    }
    trees = {"params": params, "model_vars": model_vars}
    onnx_convert.stage_arrays(stage, described, jax.device_get(trees))


def check_inputs(name: str, fns: dict[str, Callable], sample_rate: int, seed: int = 0) -> dict:
    """Concrete inputs for `name` (a ragged audio batch; tokens; random projections):
    what export compares the ONNX functions with the JAX ones on."""
    rng = np.random.default_rng(seed)
    inputs, _ = inference.io_names(name, fns)
    if name in inference.AUDIO_FUNCTIONS:
        s = int(1.3 * sample_rate)
        lengths = np.array([s, s * 2 // 3], np.int32)
        audio = (0.1 * rng.standard_normal((2, s))).astype(np.float32)
        audio[1, lengths[1] :] = 0.0
        return {"audio": audio, "audio_len": lengths}
    if name in inference.STREAM_FUNCTIONS:
        return _stream_check_inputs(name, fns, rng)
    tokens = np.array([1, 2, 3], np.int32)
    if name == "predictor_init":
        return {"tokens": tokens}
    if name == "predictor_step":
        state = [np.asarray(x) for x in jax.jit(fns["predictor_init"])(tokens)]
        return dict(zip(inputs, [*state, tokens], strict=True))
    specs = argument_specs(name, fns, sample_rate)  # joiner: (b, J) projections
    return {
        n: rng.standard_normal((3, a.shape[-1])).astype(np.float32)
        for n, a in zip(inputs, specs, strict=True)
    }


def _stream_check_inputs(name: str, fns: dict[str, Callable], rng) -> dict:
    """A stream function's inputs: 2 streams of noise, the state after a first step (run
    in JAX), and for the flushes lengths short of and equal to the call's size."""
    info = fns[name].stream
    inputs, _ = inference.io_names(name, fns)
    first = (0.1 * rng.standard_normal((2, info.first_samples))).astype(np.float32)
    if name == "stream_first":
        arrays = [first]
    elif name == "stream_flush_first":
        arrays = [first, np.array([info.first_samples // 3, info.first_samples], np.int32)]
    else:
        state = jax.jit(fns["stream_first"])(first)[len(info.outputs) + 1 :]
        audio = (0.1 * rng.standard_normal((2, info.step_samples))).astype(np.float32)
        arrays = [*(np.asarray(x) for x in state), audio]
        if name == "stream_flush":
            arrays.append(np.array([info.step_samples // 3, info.step_samples], np.int32))
    return dict(zip(inputs, arrays, strict=True))


def export_onnx(
    arguments: dict,
    params: dict,
    model_vars: dict,
    sample_rate: int,
    output: str,
    onnx_python: str,
    stream_history: int | None = None,
) -> dict:
    """Write <name>.onnx for every function (converted in the converter's environment),
    each run in onnxruntime against the JAX function; returns the manifest's "functions".

    Raises:
      UserError: the converter's environment is missing.
      RuntimeError: the conversion failed, or an ONNX function differs from JAX's.
    """
    arguments, params = inference.unscanned(dict(arguments, dtype=staging.ONNX_DTYPE), params)
    abstract = nnx.eval_shape(lambda: models.model_from_arguments(arguments, nnx.Rngs(0)))
    graphdef = nnx.graphdef(abstract)
    fns = inference_functions(graphdef, params, model_vars, stream_history=stream_history)
    with tempfile.TemporaryDirectory(dir=output, prefix=".stage-") as stage:
        stage_for_conversion(arguments, params, model_vars, sample_rate, fns, stage, stream_history)
        report = staging.run_converter(stage, output, onnx_python)
    return {
        name: staging.check_onnx_function(
            output, report[name], fn, check_inputs(name, fns, sample_rate)
        )
        for name, fn in fns.items()
    }


# ---------------------------------------------------------------- the command
def _check_format(fmt: str, int8: bool, calibration_method: str) -> None:
    """`export_run`'s format options.

    Raises:
      UserError: an unknown format or calibration method, or int8 for a float format.
    """
    staging.check_format(fmt)
    if int8 and fmt != "onnx":
        raise UserError(f"--int8 needs --format onnx (the {fmt} artifact is float)")
    if int8 and calibration_method not in quantize.METHODS:
        raise UserError(
            f"unknown calibration method {calibration_method!r}: choose one of {quantize.METHODS}"
        )


def _load_and_score(
    workdir: str,
    config,
    step: int | None,
    data_dir: str | None,
    eval_split: str | None,
) -> tuple[loading.Run, dict | None]:
    """RUN's checkpoint on one device, and the manifest's "eval": its scores on `eval_split`
    ("" to skip; None: the first of data.eval_split) of `data_dir` (default data.dir)."""
    with rules.axis_rules(build.rules_from_config(config)):
        one = staging.one_device_mesh(config)
        run = loading.load_run(workdir, step=step, mesh=one)
        scores = None
        split = parse_splits(config.data.eval_split)[0] if eval_split is None else eval_split
        if split:
            data_dir = data_dir or config.data.dir
            result = eval_run.evaluate_run(run, config, data_dir, split)
            scores = {k: result[k] for k in ("split", "num_utts", "wer", "cer")}
            scores["data"] = os.path.abspath(data_dir)
    return run, scores


def _write_int8(
    output: str,
    functions: dict,
    calib: tuple[list[np.ndarray], dict],
    config,
    method: str,
    percentile: float,
) -> None:
    """Add the int8 versions of the audio functions to `output` (`quantize.quantize_artifact`,
    calibrated on `calib`, `read_calibration`'s) and write quantization.json."""
    sample_rate = int(config.features.sample_rate)
    utterances, calibration_set = calib
    feats = config.features
    report = quantize.quantize_artifact(
        output,
        functions,
        utterances,
        method=method,
        percentile=percentile,
        min_samples=int(MIN_SECONDS * sample_rate),
        max_samples=int(CALIBRATION_SECONDS * sample_rate),
        num_freqs=int(feats.n_fft) // 2 + 1,
        num_mels=int(feats.num_mel_bins),
        calibration=calibration_set,
    )
    files.atomic_write(os.path.join(output, quantize.QUANTIZATION_JSON), json.dumps(report))


def _manifest(
    fmt: str,
    functions: dict,
    config,
    run: loading.Run,
    tokenizer_out: str,
    workdir: str,
    scores: dict | None,
) -> dict:
    """The manifest up to its "eval" (`export_run` adds "quantization" and "streaming")."""
    return {
        "format": fmt,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "functions": functions,
        "audio": {
            "sample_rate": int(config.features.sample_rate),
            "min_samples": int(MIN_SECONDS * config.features.sample_rate),
            "dtype": "float32",
            "range": "[-1, 1]",
        },
        "features": dict(config.features.to_dict(), normalization="the run's, inside"),
        "tokenizer": {
            "dir": "tokenizer",
            "kind": run.tokenizer.kind,
            "vocab_size": run.tokenizer.vocab_size,
            "blank_id": run.tokenizer.blank_id,
            "files": sorted(os.listdir(tokenizer_out)),
        },
        "run": {
            "workdir": storage.absolute(workdir),
            "step": run.step,
            "params_fingerprint": ckpt_lib.fingerprint(run.params),
            "head": config.model.head,
            "decoding": config.decoding.to_dict(),
            "config": config.to_dict(),
        },
        "eval": scores,
    }


def export_run(
    workdir: str,
    output: str,
    *,
    fmt: str = "stablehlo",
    step: int | None = None,
    data_dir: str | None = None,
    eval_split: str | None = None,
    onnx_python: str | None = None,
    int8: bool = False,
    calibration: str | None = None,
    calibration_utts: int = 64,
    calibration_method: str = "minmax",
    calibration_percentile: float = quantize.DEFAULT_PERCENTILE,
    stream_history: int | None = None,
) -> dict:
    """Export RUN's checkpoint (latest unless `step`) to `output`; returns the manifest.

    `eval_split` ("" to skip; default the run's data.eval_split) is scored with the
    exported checkpoint and recorded in the manifest. `onnx_python`: the converter's
    interpreter for `fmt="onnx"` (default `staging.default_onnx_python()`). `int8` (ONNX only)
    adds int8 QDQ versions of the audio functions calibrated on `calibration_utts`
    utterances of `calibration` ("DATA_DIR:SPLIT"), and quantization.json. A streaming
    encoder also gets the stream functions; `stream_history` is their attention cache
    (encoder frames) where the model's left context is unlimited (`left_chunks < 0`).

    Raises:
      UserError: not a run, no checkpoint, an unknown format, a split that is not prepared,
        an --output holding files no export wrote (`artifact_dir.check_output`).
    """
    _check_format(fmt, int8, calibration_method)
    artifact_dir.check_output(output)
    try:
        calib = read_calibration(calibration, calibration_utts) if int8 else None
        config = loading.load_run_config(workdir)
        if "conformer" in config.model:
            # One artifact for CPU, CUDA and TPU: cuDNN's fused attention (what "auto"
            # picks on a GPU) lowers for CUDA only; XLA's computes the same function.
            config.model.conformer.attention = "xla"
        check_stream_history(config, stream_history)
        if config.model.head == "aed" and fmt != "stablehlo":
            raise UserError(
                f"model.head=aed: the {fmt} export has no attention decoder yet; "
                "--format stablehlo exports its encoder and decoder step"
            )
        run, scores = _load_and_score(workdir, config, step, data_dir, eval_split)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    # Everything is written into a staging directory next to `output` and moved into place
    # complete: a full disk or a kill leaves the previous export (or none), never half one.
    return artifact_dir.write_and_publish(
        output,
        lambda stage: _write_artifact(
            stage,
            fmt,
            run,
            config,
            workdir,
            scores,
            calib,
            stream_history,
            onnx_python,
            calibration_method,
            calibration_percentile,
        ),
    )


def _write_artifact(
    output: str,
    fmt: str,
    run: loading.Run,
    config,
    workdir: str,
    scores: dict | None,
    calib,
    stream_history: int | None,
    onnx_python: str | None,
    calibration_method: str,
    calibration_percentile: float,
) -> dict:
    """Writes the artifact's files into the directory `output`; returns the manifest
    (`artifact_dir.publish` writes it, with the list of files)."""
    sample_rate = int(config.features.sample_rate)
    fns = inference_functions(
        run.spec.graphdef,
        run.params,
        run.model_vars,
        stream_history=stream_history,
        attention_decoder=fmt == "stablehlo",  # ONNX: not yet (the manifest says so)
    )
    if fmt == "onnx":
        arguments = build.model_arguments(config, run.tokenizer.vocab_size)
        functions = export_onnx(
            arguments,
            run.params,
            run.model_vars,
            sample_rate,
            output,
            onnx_python or staging.default_onnx_python(),
            stream_history,
        )
    else:
        functions = export_stablehlo(fns, sample_rate, output)
    if calib is not None:
        _write_int8(output, functions, calib, config, calibration_method, calibration_percentile)
    tokenizer_out = os.path.join(output, "tokenizer")
    shutil.copytree(run.tokenizer_dir, tokenizer_out, dirs_exist_ok=True)
    manifest = _manifest(fmt, functions, config, run, tokenizer_out, workdir, scores) | {
        "quantization": quantize.QUANTIZATION_JSON if calib is not None else None,
        "streaming": stream_section(fns, sample_rate),
        "attention_decoder": inference.attention_manifest(config.model.head, fmt == "stablehlo"),
    }
    return manifest


def stream_section(fns: dict[str, Callable], sample_rate: int) -> dict | None:
    """The manifest's "streaming": how a runtime drives the stream functions (None for a
    model that does not stream)."""
    if "stream_first" not in fns:
        return None
    info = fns["stream_first"].stream
    return dataclasses.asdict(info) | {
        "frame_seconds": info.frame_samples / sample_rate,
        "step_seconds": info.step_samples / sample_rate,
        "usage": (
            "stream_first on the first first_samples of every stream, then stream_step on "
            "each next step_samples, feeding each call's next.<name> outputs back as <name>; "
            "stream_flush ends the streams with their last 0..step_samples samples "
            "(zero-padded to step_samples, audio_len the real count); a stream shorter than "
            "first_samples is stream_flush_first alone. Keep the frames where valid is true: "
            "together they are the full model's output frames."
        ),
    }


def check_stream_history(config, stream_history: int | None) -> None:
    """`--stream_history` is the attention cache of a streaming encoder with unlimited left
    context, and only that: one clear error for every other combination.

    Raises:
      UserError: it is missing where needed, negative, or given where it means nothing.
    """
    enc = config.model[config.model.encoder] if config.model.encoder in config.model else {}
    streaming = bool(enc.get("causal", False)) and int(enc.get("chunk_size", 0)) > 0
    unlimited = streaming and int(enc.get("left_chunks", 0)) < 0
    if stream_history is None and unlimited:
        raise UserError(
            "this run's encoder streams with unlimited left context (left_chunks < 0): pass "
            "--stream_history N, the encoder frames its attention cache keeps (a multiple "
            "of chunk_size C streams exactly as left_chunks = N / C)"
        )
    if stream_history is not None and not unlimited:
        why = "left_chunks * chunk_size" if streaming else "it does not stream"
        raise UserError(
            f"--stream_history applies to streaming encoders with left_chunks < 0 only; "
            f"this run's cache is fixed ({why})"
        )
    if stream_history is not None and stream_history < 0:
        raise UserError(f"--stream_history must be >= 0, got {stream_history}")


def read_calibration(spec: str | None, n: int) -> tuple[list[np.ndarray], dict]:
    """ "DATA_DIR:SPLIT" -> (up to `n` utterances as float32 audio in [-1, 1], drawn with a
    fixed seed over the split; the set's description for quantization.json).

    Raises:
      UserError: no or a malformed spec, n < 1, a split that is not prepared.
    """
    if not spec or ":" not in spec:
        raise UserError(f"--int8 needs --calibration DATA_DIR:SPLIT, got {spec!r}")
    if n < 1:
        raise UserError(f"--calibration_utts must be >= 1, got {n}")
    data_dir, split = spec.rsplit(":", 1)
    try:
        index = records.read_split_index(data_dir, split)
        chosen = np.sort(np.random.default_rng(0).permutation(index.num_records)[:n])
        recs = reader.read_split_records(data_dir, split, chosen.tolist())
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"calibration split: {e}") from e
    audio = [reader.audio_float32(r) for r in recs]
    ids = [r["id"] for r in recs]
    described = {
        "data": os.path.abspath(data_dir),
        "split": split,
        "num_utts": len(recs),
        "seconds": round(sum(len(a) / r["sample_rate"] for a, r in zip(audio, recs)), 2),
        "id": quantize.calibration_id(ids),
    }
    return audio, described
