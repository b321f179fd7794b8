"""A neural vocoder's deployment artifact (a run of config.task "vocoder"): `python -m
jaxspeech.export --workdir VOCODER_RUN --output DIR [--format stablehlo|onnx]`, and the
same function beside a synthesizer's (`--workdir TTS_RUN --vocoder_workdir VOCODER_RUN`,
`tts.artifact.export_tts_run`).

One function, `vocoder` (`jaxspeech.vocoder.generator`): the run's generator (HiFi-GAN's or
Vocos's, config.vocoder.generator),
raw log-mel (b, t, M) and its frame mask in, the waveform (b, t * hop) and its sample mask
out; b and t symbolic (convolutions only: any length, no static frame axis).

- stablehlo: `vocoder.stablehlo`, `jax.export`'s serialization in the run's dtype.
- onnx: `vocoder.onnx`, float32, converted by jax2onnx in the converter's environment
  (`make install-onnx`) and checked in onnxruntime against JAX.

Beside it `manifest.json`: "task" "vocoder", sample rate, hop, mel bins, the input's units,
the front-end settings a synthesizer's features must match (`vocoder.loading.
FRONT_END_MATCH`), the generator's kind ("hifigan" or "vocos") and arguments, the files, the
function's inputs and outputs, the run's step and parameter fingerprint. A synthesizer's
export names the vocoder in its own manifest's "vocoder" (`vocoder_section`) and refuses
another front end in one line.
"""

from __future__ import annotations

import datetime
import tempfile
from collections.abc import Callable

import jax
import numpy as np
from flax import nnx

from jaxspeech.common import storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import build, defaults
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading
from jaxspeech.serving import artifact_dir, onnx_convert, staging
from jaxspeech.vocoder import generator as vocoder_generator
from jaxspeech.vocoder import loading as vocoder_loading
from jaxspeech.vocoder.loading import VocoderRun

FORMAT_VERSION = 1  # readers check it; fields are only ever added within a version
ARCHITECTURES = {  # the manifest's words for config.vocoder.generator
    "hifigan": "HiFi-GAN generator (jaxspeech.vocoder.hifigan.HiFiGANGenerator)",
    "vocos": "Vocos generator: ConvNeXt, magnitude and phase, inverse STFT "
    "(jaxspeech.vocoder.vocos.VocosGenerator)",
}
NAME = vocoder_generator.NAME
CONVERTER = "jaxspeech.vocoder.generator"
UNITS = (
    "natural log of mel power + log_floor: the recognizer's front end "
    "(jaxspeech.audio.features.log_mel), raw, not normalized - the synthesizer's exported "
    "log_mel as it is; the generator was trained on these, so nothing is normalized inside"
)


def export_vocoder_run(
    workdir: str,
    output: str,
    *,
    fmt: str = "stablehlo",
    step: int | None = None,
    onnx_python: str | None = None,
) -> dict:
    """Export the vocoder RUN's generator (checkpoint `step`, default the latest) to
    `output`, replaced whole; returns the manifest. `onnx_python`: the converter's
    interpreter (fmt "onnx").

    Raises:
      UserError: not a vocoder's run, no checkpoint, an unknown format, an output
        directory holding other files, a missing ONNX converter environment.
    """
    staging.check_format(fmt)
    artifact_dir.check_output(output)
    run = load_run(workdir, step)
    return artifact_dir.write_and_publish(  # moved into place complete
        output,
        lambda stage: _manifest(fmt, export_functions(run, fmt, stage, onnx_python), run, workdir),
    )


def load_run(workdir: str, step: int | None = None) -> VocoderRun:
    """RUN's checkpoint `step` (default: the latest) on one device: the export traces
    one program.

    Raises:
      UserError: not a vocoder's run, no such checkpoint, another model's checkpoint.
    """
    try:
        config = loading.load_run_config(workdir)
        if defaults.lookup(config, "task") != "vocoder":
            raise UserError(f"{workdir} is not a vocoder's run (config.task is not vocoder)")
        with rules.axis_rules(build.rules_from_config(config)):
            one = staging.one_device_mesh(config)
            return vocoder_loading.load_vocoder_run(workdir, step=step, mesh=one)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e


def export_functions(run: VocoderRun, fmt: str, output: str, onnx_python: str | None) -> dict:
    """Write the vocoder function in `fmt` into `output`; returns the manifest's
    "functions" entry."""
    if fmt == "onnx":
        return export_onnx(run, output, onnx_python)
    return export_stablehlo(run, output)


def generator_function(run: VocoderRun, dtype: str | None = None) -> tuple[Callable, dict, dict]:
    """The exported function over the run's generator (in `dtype`, default the run's)
    -> (function, generator arguments as JSON, float parameters on the host)."""
    kind = vocoder_loading.generator_kind(run.config)
    arguments = vocoder_generator.json_arguments(vocoder_loading.generator_arguments(run.config))
    params = jax.device_get(run.params["generator"])
    if dtype is not None:
        arguments["dtype"] = dtype
        params = jax.tree.map(lambda x: np.asarray(x, dtype), params)
    abstract = vocoder_generator.abstract_generator(arguments, kind)
    fn = vocoder_generator.vocoder_function(nnx.split(abstract, nnx.Param)[0], params)
    return fn, arguments, params


def export_stablehlo(run: VocoderRun, output: str) -> dict:
    """Write vocoder.stablehlo (the run's dtype; parameters inside as constants); returns
    the manifest's "functions"."""
    fn, _, _ = generator_function(run)
    specs = vocoder_generator.argument_specs(int(run.cfg.num_mel_bins))
    inputs, outputs = vocoder_generator.INPUTS, vocoder_generator.OUTPUTS
    return {NAME: staging.write_stablehlo(fn, specs, NAME, inputs, outputs, output)}


def check_inputs(n_mels: int, b: int, t: int, seed: int = 0) -> dict:
    """Concrete inputs: `b` rows of `t` log-mel frames around the front end's range
    (speech -14..5 nats), ragged masks (the last row full), junk past each row's end."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(max(1, t // 2), t, b).astype(np.int32)
    log_mel = rng.normal(-5.0, 3.0, (b, t, n_mels)).astype(np.float32)
    mask = np.arange(t)[None] < lengths[:, None]
    log_mel[~mask] = 100.0  # ignored: the generator zeroes masked frames first
    return {"log_mel": log_mel, "frame_mask": mask}


def export_onnx(run: VocoderRun, output: str, onnx_python: str | None) -> dict:
    """Write vocoder.onnx (float32, converted in the converter's environment) and check it
    in onnxruntime against the float32 JAX function (`staging.check_onnx_function`);
    returns the manifest's "functions".

    Raises:
      UserError: the converter's environment is missing.
      RuntimeError: the conversion failed, or the ONNX function differs from JAX's.
    """
    fn, arguments, params = generator_function(run, staging.ONNX_DTYPE)
    python = onnx_python or staging.default_onnx_python()
    with tempfile.TemporaryDirectory(dir=output, prefix=".stage-") as where:
        described = {
            "arguments": arguments,
            "generator": vocoder_loading.generator_kind(run.config),
        }
        onnx_convert.stage_arrays(where, described, {"params": params})
        report = staging.run_converter(where, output, python, module=CONVERTER)
    feeds = check_inputs(int(run.cfg.num_mel_bins), 2, 7)
    return {NAME: staging.check_onnx_function(output, report, fn, feeds)}


def front_end_section(run: VocoderRun) -> dict:
    """The front-end settings a synthesizer's features must equal (their values)."""
    return {k: getattr(run.cfg, k) for k in vocoder_loading.FRONT_END_MATCH}


def run_section(run: VocoderRun, workdir: str) -> dict:
    return {
        "workdir": storage.absolute(workdir),
        "step": run.step,
        "params_fingerprint": ckpt_lib.fingerprint(run.params),  # as the checkpoint's
        "generator_fingerprint": ckpt_lib.fingerprint(run.params["generator"]),
    }


def vocoder_section(run: VocoderRun, workdir: str) -> dict:
    """A synthesizer manifest's "vocoder": how its `acoustic` outputs feed `vocoder`."""
    return {
        "function": NAME,
        "kind": vocoder_loading.generator_kind(run.config),
        "call": f"{NAME}(log_mel, frame_mask) on acoustic's outputs as they are -> "
        "(audio (b, max_frames * hop_length), sample_mask); rows cut at max_frames "
        "(truncated) are vocoded to the cut",
        "hop_length": int(run.cfg.hop_length),
        "sample_rate": int(run.cfg.sample_rate),
        "front_end": front_end_section(run),
        "run": run_section(run, workdir),
    }


def _manifest(fmt: str, functions: dict, run: VocoderRun, workdir: str) -> dict:
    """The manifest but its "files"."""
    cfg = run.cfg
    return {
        "format_version": FORMAT_VERSION,
        "task": "vocoder",
        "format": fmt,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "functions": functions,
        "audio": {"sample_rate": int(cfg.sample_rate), "dtype": "float32", "range": "[-1, 1]"},
        "hop_length": int(cfg.hop_length),
        "n_mels": int(cfg.num_mel_bins),
        "input": {
            "units": UNITS,
            "frame_mask": "frames where it is false are ignored, whatever they hold",
        },
        "output": "audio (b, t * hop_length) float32, 0 where sample_mask (frame_mask "
        "repeated hop_length times) is false; of an utterance of S samples the front end "
        "gives 1 + S // hop_length frames, so the first S samples align with it",
        "front_end": front_end_section(run)
        | {
            "must_match": "a synthesizer's config.features must equal these: the generator "
            "inverts exactly these features (an export with --vocoder_workdir refuses others)"
        },
        "features": run.config.features.to_dict(),
        "generator": {
            "kind": vocoder_loading.generator_kind(run.config),
            "architecture": ARCHITECTURES[vocoder_loading.generator_kind(run.config)],
            "arguments": vocoder_generator.json_arguments(
                vocoder_loading.generator_arguments(run.config)
            ),
            "parameters": vocoder_loading.num_params(run.params["generator"]),
        },
        "run": run_section(run, workdir) | {"config": run.config.to_dict()},
    }
