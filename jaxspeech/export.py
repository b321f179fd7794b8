"""Export a run for serving: `python -m jaxspeech.export --workdir RUN --format
stablehlo|onnx --output DIR [--int8 --calibration DATA_DIR:SPLIT]`.

Flags -> the run's task's export in the registry (`jaxspeech.tasks`): a recognizer's
`jaxspeech.serving.recognizer_export.export_run` (the artifacts and the manifest are
described there); a synthesizer's run (config.task "tts") -> `jaxspeech.tts.artifact`
(`--max_frames`, `--vocoder_workdir`; the recognizer's data, scoring, int8 and streaming
flags are refused), a vocoder's ("vocoder") -> `jaxspeech.vocoder.artifact`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from absl import app, flags, logging

from jaxspeech import tasks
from jaxspeech.common import cli, storage
from jaxspeech.metrics import trackers
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.serving import quantize, staging
from jaxspeech.serving import recognizer_export as export_lib

FLAGS = flags.FLAGS
# The recognizer's options, which mean nothing to a synthesizer's export.
ASR_ONLY = ("data", "eval_split", "int8", "calibration", "calibration_utts")
ASR_ONLY += ("calibration_method", "calibration_percentile", "stream_history")


def tts_job(export_tts_run: Callable) -> None:
    """A synthesizer's export (`jaxspeech.tts.artifact.export_tts_run`)."""
    manifest = export_tts_run(
        FLAGS.workdir,
        FLAGS.output,
        fmt=FLAGS.format,
        step=FLAGS.step,
        max_frames=FLAGS.max_frames,
        onnx_python=FLAGS.onnx_python,
        vocoder_workdir=FLAGS.vocoder_workdir,
    )
    step, frames = manifest["run"]["step"], manifest["max_frames"]
    print(
        f"exported step {step} of synthesizer {FLAGS.workdir} to {FLAGS.output}: "
        f"{', '.join(manifest['files'])} (max_frames {frames})",
        file=sys.stderr,
    )
    summary = {"output": os.path.abspath(FLAGS.output), "step": step, "task": "tts"}
    print(json.dumps(summary | {"functions": list(manifest["functions"]), "max_frames": frames}))


def vocoder_job(export_vocoder_run: Callable) -> None:
    """A vocoder's export (`jaxspeech.vocoder.artifact.export_vocoder_run`)."""
    manifest = export_vocoder_run(
        FLAGS.workdir,
        FLAGS.output,
        fmt=FLAGS.format,
        step=FLAGS.step,
        onnx_python=FLAGS.onnx_python,
    )
    step = manifest["run"]["step"]
    print(
        f"exported step {step} of vocoder {FLAGS.workdir} to {FLAGS.output}: "
        f"{', '.join(manifest['files'])}",
        file=sys.stderr,
    )
    summary = {"output": os.path.abspath(FLAGS.output), "step": step, "task": "vocoder"}
    print(json.dumps(summary | {"functions": list(manifest["functions"])}))


def recognizer_job(export_run: Callable) -> None:
    """A recognizer's export (`jaxspeech.serving.recognizer_export.export_run`)."""
    manifest = export_run(
        FLAGS.workdir,
        FLAGS.output,
        fmt=FLAGS.format,
        step=FLAGS.step,
        data_dir=FLAGS.data,
        eval_split=FLAGS.eval_split,
        onnx_python=FLAGS.onnx_python,
        int8=FLAGS.int8,
        calibration=FLAGS.calibration,
        calibration_utts=FLAGS.calibration_utts,
        calibration_method=FLAGS.calibration_method,
        calibration_percentile=FLAGS.calibration_percentile,
        stream_history=FLAGS.stream_history,
    )
    files = ", ".join(
        ", ".join(f[k] for k in ("file", "int8_file") if k in f)
        for f in manifest["functions"].values()
    )
    scores = manifest["eval"]
    print(
        f"exported step {manifest['run']['step']} of {FLAGS.workdir} to {FLAGS.output}: "
        f"{files}, {export_lib.MANIFEST}"
        + (
            f"; {scores['split']} WER {scores['wer']:.2%} CER {scores['cer']:.2%}" if scores else ""
        ),
        file=sys.stderr,
    )
    if not storage.is_remote(FLAGS.workdir) and not storage.is_remote(FLAGS.output):
        # The run's MLflow / W&B runs (monitor.trackers) get the manifest.
        where = os.path.join(FLAGS.output, export_lib.MANIFEST)
        warn = lambda line: print(line, file=sys.stderr)  # noqa: E731
        for line in trackers.send_to_runs(FLAGS.workdir, where, "export/manifest.json", warn=warn):
            warn(f"WARNING: {line}")
    summary = {"output": os.path.abspath(FLAGS.output), "step": manifest["run"]["step"]}
    print(json.dumps(summary | {"functions": list(manifest["functions"]), "eval": scores}))


# The run's task -> (the flags its export refuses, why, how this command runs the export).
EXPORTS = {
    "asr": (
        ("max_frames", "vocoder_workdir"),
        "synthesizer export only; {workdir} is not a synthesizer's run (config.task=tts)",
        recognizer_job,
    ),
    "tts": (
        ASR_ONLY,
        "recognizer export only; {workdir} is a synthesizer's run (config.task=tts)",
        tts_job,
    ),
    "vocoder": (
        (*ASR_ONLY, "max_frames", "vocoder_workdir"),
        "not for a vocoder's export; {workdir} is a vocoder's run (config.task=vocoder)",
        vocoder_job,
    ),
}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    entry = tasks.of_run(FLAGS.workdir, default="asr")  # no run: export_run reports it
    refused, why, job = EXPORTS[entry.name]
    given = [f"--{n}" for n in refused if FLAGS[n].present]
    if given:
        cli.usage_error(f"{', '.join(given)}: {why.format(workdir=FLAGS.workdir)}")
    cli.run_job(lambda: job(entry.function("export")))


if __name__ == "__main__":
    mesh_lib.define_flags()
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("output", None, "Directory for the artifact.", required=True)
    flags.DEFINE_string("format", "stablehlo", f"One of {staging.FORMATS}.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string(
        "eval_split",
        None,
        "Split scored into the manifest (default: the run's data.eval_split; '' skips).",
    )
    flags.DEFINE_string(
        "onnx_python",
        None,
        "Python of the ONNX converter's environment (default: $JAXSPEECH_ONNX_PYTHON, else "
        "the checkout's .venv-onnx from `make install-onnx`).",
    )
    flags.DEFINE_bool("int8", False, "Also write int8 QDQ versions (ONNX) + quantization.json.")
    flags.DEFINE_string("calibration", None, "int8 calibration utterances: DATA_DIR:SPLIT.")
    flags.DEFINE_integer("calibration_utts", 64, "Number of calibration utterances.")
    flags.DEFINE_string("calibration_method", "minmax", f"One of {quantize.METHODS}.")
    flags.DEFINE_float(
        "calibration_percentile",
        quantize.DEFAULT_PERCENTILE,
        "Percentile of |activation| kept by the percentile method.",
    )
    flags.DEFINE_integer(
        "stream_history",
        None,
        "Streaming encoders with unlimited left context (left_chunks < 0): encoder frames "
        "of attention cache in the exported stream functions.",
    )
    flags.DEFINE_integer(
        "max_frames",
        None,
        "Synthesizer runs: frames of the exported log-mel (default: twice the longest "
        "training utterance's); longer speech is cut there and flagged.",
    )
    flags.DEFINE_string(
        "vocoder_workdir",
        None,
        "Synthesizer runs: a vocoder run (configs/vocoder.py) on the same front end, whose "
        "generator is exported beside the acoustic model and named in the manifest.",
    )
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
