"""A synthesizer's deployment artifact (a run of config.task "tts"): `python -m
jaxspeech.export --workdir TTS_RUN --output DIR [--format stablehlo|onnx] [--max_frames N]`.

One function, `acoustic` (`jaxspeech.tts.acoustic`): phoneme ids, their lengths,
speaker ids and a per-row duration scale in; the recognizer front end's raw log-mel (the
run's feature statistics inside), its frame mask, the durations used and a truncation
flag out. Batch and phoneme length are symbolic; the frame axis is a static max_frames
(default `default_max_frames`, recorded in the manifest), because the length regulator's
output length depends on the predicted durations. Speech whose durations sum past it is
cut there: its mask is true to the end and `truncated` says so.

- stablehlo: `acoustic.stablehlo`, `jax.export`'s serialization in the run's dtype.
- onnx: `acoustic.onnx`, float32, converted by jax2onnx in the converter's environment
  (as the recognizer's, `make install-onnx`) and checked in onnxruntime against JAX.

Beside it `manifest.json`: "task" "tts", the phoneme and speaker tables (ids are row
numbers), sample rate, hop, mel bins, feature statistics, max_frames, the files, the
run's step, and how to vocode ("griffin_lim"'s parameters; "vocoder" null, or with
`--vocoder_workdir VOCODER_RUN` the neural vocoder's function
(`vocoder.inference.export_for_synthesizer`) written beside `acoustic` in the same
format and described there: its name in "functions", its run, its front end, which must
equal this run's features).
"""

from __future__ import annotations

import datetime
import inspect
import tempfile

import jax
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.audio import features, griffin_lim
from jaxspeech.common import storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build, defaults
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading
from jaxspeech.serving import artifact_dir, staging
from jaxspeech.tts import acoustic as tts_acoustic
from jaxspeech.tts import loading as tts_loading
from jaxspeech.vocoder import inference as vocoder_inference

FORMAT_VERSION = 1  # readers check it; fields are only ever added within a version
FRAME_ROUND = 64  # default max_frames is a multiple of it, as the evaluation's batches
CONVERTER = "jaxspeech.tts.acoustic"  # run in the converter's environment


def default_max_frames(config) -> int:
    """Twice the frames of the longest training utterance (the last of
    data.bucket_boundaries: longer ones are skipped in training), for slow speech and
    duration_scale up to ~2, rounded up to a multiple of 64: the evaluation's rule."""
    seconds = max(config.data.bucket_boundaries)
    rate, hop = int(config.features.sample_rate), int(config.features.hop_length)
    frames = int(features.num_frames(int(np.ceil(seconds * rate)), hop))
    return FRAME_ROUND * -(-2 * frames // FRAME_ROUND)


def export_tts_run(
    workdir: str,
    output: str,
    *,
    fmt: str = "stablehlo",
    step: int | None = None,
    max_frames: int | None = None,
    onnx_python: str | None = None,
    vocoder_workdir: str | None = None,
) -> dict:
    """Export the synthesizer RUN's checkpoint (latest unless `step`) to `output`, replaced
    whole; returns the manifest. `max_frames`: the frame axis (default
    `default_max_frames`); `onnx_python`: the converter's interpreter (fmt "onnx");
    `vocoder_workdir`: a vocoder run whose generator (latest checkpoint) is exported beside
    (`vocoder.inference.export_for_synthesizer`), named in the manifest's "vocoder".

    Raises:
      UserError: not a run, no checkpoint, an unknown format, max_frames < 1, an output
        directory holding other files, a missing ONNX converter environment, a vocoder
        trained on another front end (before any checkpoint is read).
    """
    staging.check_format(fmt)
    if max_frames is not None and max_frames < 1:
        raise UserError(f"--max_frames must be >= 1, got {max_frames}")
    artifact_dir.check_output(output)
    if vocoder_workdir is not None:
        config = load_config(workdir)
        vocoder_inference.check_vocoder_run(vocoder_workdir, build.feature_config(config), workdir)
    run = load_run(workdir, step)
    frames = max_frames or default_max_frames(run.config)

    def write(stage: str) -> dict:
        if fmt == "onnx":
            described = export_onnx(run, frames, stage, onnx_python)
        else:
            described = export_stablehlo(run, frames, stage)
        vocoder = None
        if vocoder_workdir is not None:
            more, vocoder = vocoder_inference.export_for_synthesizer(
                vocoder_workdir, fmt, stage, onnx_python
            )
            described |= more
        manifest = _manifest(fmt, described, run, workdir, frames, max_frames is None)
        manifest["vocoder"] = vocoder
        return manifest

    return artifact_dir.write_and_publish(output, write)  # moved into place complete


def load_config(workdir: str) -> ConfigDict:
    """RUN's config, once it is known to be a synthesizer's.

    Raises:
      UserError: not a run, or not a synthesizer's.
    """
    try:
        config = loading.load_run_config(workdir)
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    if defaults.lookup(config, "task") != "tts":
        raise UserError(f"{workdir} is not a synthesizer's run (config.task is not tts)")
    return config


def load_run(workdir: str, step: int | None = None) -> tts_loading.TtsRun:
    """RUN's checkpoint `step` (default: the latest) on one device: the export traces
    one program.

    Raises:
      UserError: not a synthesizer's run, no such checkpoint, another model's checkpoint.
    """
    config = load_config(workdir)
    try:
        with rules.axis_rules(build.rules_from_config(config)):
            one = staging.one_device_mesh(config)
            return tts_loading.load_tts_run(workdir, step=step, mesh=one, config=config)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e


def export_stablehlo(run: tts_loading.TtsRun, max_frames: int, output: str) -> dict:
    """Write acoustic.stablehlo (the run's dtype; parameters inside as constants); returns
    the manifest's "functions"."""
    fn = tts_acoustic.acoustic_function(
        run.spec.graphdef,
        jax.device_get(run.params),
        jax.device_get(run.model_vars),
        max_frames,
        float(run.config.features.log_floor),
    )
    specs = tts_acoustic.argument_specs()
    name, inputs, outputs = tts_acoustic.NAME, tts_acoustic.INPUTS, tts_acoustic.OUTPUTS
    return {name: staging.write_stablehlo(fn, specs, name, inputs, outputs, output)}


def check_inputs(num_phonemes: int, num_speakers: int, b: int, n: int, seed: int = 0) -> dict:
    """Concrete inputs: `b` rows of `n` random phonemes (ids >= 1) with ragged lengths (the
    last row full), speakers in turn, duration scales around 1."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(max(1, n // 2), n, b).astype(np.int32)
    return {
        "phonemes": rng.integers(1, num_phonemes, (b, n)).astype(np.int32),
        "phoneme_len": lengths,
        "speaker": (np.arange(b) % num_speakers).astype(np.int32),
        "duration_scale": np.linspace(0.8, 1.25, b).astype(np.float32),
    }


def export_onnx(
    run: tts_loading.TtsRun, max_frames: int, output: str, onnx_python: str | None
) -> dict:
    """Write acoustic.onnx (float32, converted in the converter's environment) and check it
    in onnxruntime against the float32 JAX function (`staging.check_onnx_function`);
    returns the manifest's "functions".

    Raises:
      UserError: the converter's environment is missing.
      RuntimeError: the conversion failed, or the ONNX function differs from JAX's.
    """
    config, assets = run.config, run.assets
    arguments = tts_loading.model_arguments(config, assets.table.size, len(assets.speakers))
    arguments["dtype"] = staging.ONNX_DTYPE
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), jax.device_get(run.params))
    extra = {"max_frames": max_frames, "log_floor": float(config.features.log_floor)}
    with tempfile.TemporaryDirectory(dir=output, prefix=".stage-") as where:
        tts_acoustic.stage(arguments, params, jax.device_get(run.model_vars), extra, where)
        python = onnx_python or staging.default_onnx_python()
        report = staging.run_converter(where, output, python, module=CONVERTER)
    # What the ONNX file must equal: the float32 model the converter built.
    graphdef = nnx.graphdef(tts_acoustic.abstract_model(arguments))
    stats = jax.device_get(run.model_vars)
    fn = tts_acoustic.acoustic_function(graphdef, params, stats, **extra)
    feeds = check_inputs(assets.table.size, len(assets.speakers), 2, 7)
    return {tts_acoustic.NAME: staging.check_onnx_function(output, report, fn, feeds)}


def vocoding_section(config) -> dict:
    """The manifest's "griffin_lim": what `jaxspeech.audio.griffin_lim.griffin_lim` runs on
    the valid frames of one row, so that a runtime without jaxspeech can do the same."""
    defaults = inspect.signature(griffin_lim.griffin_lim).parameters
    f = config.features
    return {
        "call": "jaxspeech.audio.griffin_lim.griffin_lim_batch(log_mel, frame_mask, "
        "LogMelConfig(**the features' LogMelConfig fields))",
        "mel_to_power": "max(exp(log_mel) - log_floor, 0)",
        "mel_to_linear": "librosa.util.nnls(slaney mel filterbank (htk=False, norm='slaney'),"
        " mel power), then sqrt: a magnitude spectrogram",
        "n_fft": int(f.n_fft),
        "win_length": int(f.win_length),
        "hop_length": int(f.hop_length),
        "window": "hann (periodic)",
        "center": True,
        "pad_mode": "constant",
        "n_iter": defaults["n_iter"].default,
        "momentum": defaults["momentum"].default,
        "init": "random",
        "seed": defaults["seed"].default,
        "samples_per_frame": int(f.hop_length),
    }


def _manifest(
    fmt: str, functions: dict, run: tts_loading.TtsRun, workdir: str, max_frames: int, auto: bool
) -> dict:
    """The manifest but its "files"."""
    config, assets = run.config, run.assets
    f = config.features
    speakers = sorted(assets.speakers, key=assets.speakers.get)
    return {
        "format_version": FORMAT_VERSION,
        "task": "tts",
        "format": fmt,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "functions": functions,
        "max_frames": max_frames,
        "max_frames_source": "default: twice the longest training utterance's frames"
        if auto
        else "--max_frames",
        "truncation": "rows whose durations sum past max_frames are cut there: frame_mask "
        "is all true and truncated is true (sum(durations) > max_frames)",
        "out_of_range": "clamped, never NaN (jaxspeech.tts.acoustic): a speaker id outside "
        "the table speaks as the nearest valid one, a phoneme id outside it as <unk>, "
        "phoneme_len is clipped to [0, n], a duration_scale not finite and > 0 is 1",
        "phonemes": {"table": list(assets.table.tokens), "pad_id": 0, "unk_id": 1},
        "speakers": {"table": speakers},
        "audio": {"sample_rate": int(f.sample_rate), "dtype": "float32", "range": "[-1, 1]"},
        "hop_length": int(f.hop_length),
        "n_mels": int(f.num_mel_bins),
        "features": f.to_dict()
        | {
            "units": "natural log of mel power + log_floor (the recognizer's front end); "
            "frames past frame_mask hold log(log_floor)",
            "normalization": "undone inside: log_mel = model output * std + mean",
            "mean": np.asarray(assets.mean, np.float64).tolist(),
            "std": np.asarray(assets.std, np.float64).tolist(),
        },
        "pitch": {"log_f0_mean": assets.pitch_mean, "log_f0_std": assets.pitch_std},
        "vocoder": None,
        "griffin_lim": vocoding_section(config),
        "run": {
            "workdir": storage.absolute(workdir),
            "step": run.step,
            "params_fingerprint": ckpt_lib.fingerprint(run.params),
            "config": config.to_dict(),
        },
    }
