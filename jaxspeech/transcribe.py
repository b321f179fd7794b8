"""Transcribe audio files of any length with a trained run:
`python -m jaxspeech.transcribe --workdir RUN a.wav b.flac ...`.

Each file (any format libsndfile reads, any rate and channel count) is decoded in
pieces cut at pauses, and in overlapping windows where speech runs on
(`jaxspeech.serving.longform`), with the run's config.decoding or the
command line's decoder and LM, and printed as its text followed by one line per word
with its start and end in seconds; `--json` prints one JSON object per file instead. A
file that cannot be read is reported, counted and skipped; the exit code is then 1.
Runs in one process, on all of its devices.
"""

from __future__ import annotations

import json
import sys

import jax
from absl import app, flags, logging

from jaxspeech import cli
from jaxspeech.config import build
from jaxspeech.errors import UserError
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.serving import transcribe as transcribe_lib


def print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result), flush=True)
    elif "error" in result:
        print(f"error: {result['path']}: {result['error']}", file=sys.stderr, flush=True)
    else:
        print(f"{result['path']}: {result['text']}")
        for w in result["words"]:
            print(f"  {w['start']:8.2f} {w['end']:8.2f}  {w['word']}")
        sys.stdout.flush()


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    paths = argv[1:]
    if not paths:
        cli.usage_error("give one or more audio files to transcribe")
    if FLAGS.overlap_s >= FLAGS.window_s:
        cli.usage_error(f"--overlap_s ({FLAGS.overlap_s}) must be less than --window_s")

    def job() -> None:
        if jax.process_count() > 1:
            raise UserError("transcribe runs in one process (use evaluate for multi-host jobs)")
        try:
            config = eval_run.run_eval_config(
                FLAGS.workdir, FLAGS.method, FLAGS.beam, None, cli.decoding_overrides()
            )
            with rules.axis_rules(build.rules_from_config(config)):
                run = loading.load_run(FLAGS.workdir, step=FLAGS.step, config=config)
                failed = transcribe_lib.transcribe_files(
                    paths,
                    run,
                    config,
                    window_s=FLAGS.window_s,
                    overlap_s=FLAGS.overlap_s,
                    batch=FLAGS.batch,
                    emit=lambda r: print_result(r, FLAGS.json),
                    min_pause_s=FLAGS.min_pause_s,
                )
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from e
        if failed:
            print(f"error: {failed} of {len(paths)} files could not be read", file=sys.stderr)
            sys.exit(1)

    cli.run_job(job)


if __name__ == "__main__":
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    cli.define_decoding_flags()
    flags.DEFINE_float("window_s", 20.0, "Seconds of audio per decoded window.", lower_bound=1.0)
    flags.DEFINE_float(
        "overlap_s", 2.0, "Seconds consecutive windows share (cut in the middle).", lower_bound=0
    )
    flags.DEFINE_float(
        "min_pause_s",
        0.25,
        "Cut the audio in the middle of pauses this long (0: overlapping windows only).",
        lower_bound=0,
    )
    flags.DEFINE_integer("batch", 8, "Pieces decoded at once.", lower_bound=1)
    flags.DEFINE_bool("json", False, "One JSON object per file instead of text.")
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
