"""Transcribe audio files of any length with a trained run:
`python -m jaxspeech.transcribe --workdir RUN a.wav b.flac ...`.

Each file (any format libsndfile reads, any rate and channel count) is decoded in
pieces cut at pauses, and in overlapping windows where speech runs on
(`jaxspeech.serving.longform`), with the run's config.decoding or the
command line's decoder and LM, and printed as its text followed by one line per word
with its start and end in seconds; `--json` prints one JSON object per file instead. A
file that cannot be read, or that holds NaN or infinite samples, is reported, counted and
skipped; the exit code is then 1. A file below the model's sample rate is upsampled, with
a note on stderr (it lacks the high band the model was trained with).
Silence and steady noise are not transcribed: pieces quieter than `--silence_db`, or whose
level varies by less than `--noise_spread_db` (no speech: "no speech detected"), are not
decoded, and words
in silence or longer than `--max_word_s` are dropped (`longform.SpeechGate`), counted in
the result (and noted on stderr). A file longer than a minute gets a progress line on
stderr (`--noprogress`: none). Runs in one process, on all of its devices. RUN is a
recognizer's: a synthesizer's or a vocoder's is refused in one line (`jaxspeech.tasks`).
"""

from __future__ import annotations

import json
import sys

import jax
from absl import app, flags, logging

from jaxspeech import tasks
from jaxspeech.common import cli
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.serving import longform


def print_result(result: dict, as_json: bool, rate: int) -> None:
    """`result` on stdout (text or JSON), errors and notes on stderr; `rate`: the
    model's sample rate."""
    note = rate_note(result, rate)
    if note:
        print(f"note: {result['path']}: {note}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(result), flush=True)
    elif "error" in result:
        print(f"error: {result['path']}: {result['error']}", file=sys.stderr, flush=True)
    else:
        print(f"{result['path']}: {result['text']}")
        for w in result["words"]:
            print(f"  {w['start']:8.2f} {w['end']:8.2f}  {w['word']}")
        sys.stdout.flush()
        note = gate_note(result)
        if note:  # on stderr: the text on stdout stays one line per word for scripts
            print(f"note: {result['path']}: {note}", file=sys.stderr, flush=True)


def rate_note(result: dict, rate: int) -> str:
    """A file recorded below the model's `rate` Hz, in words ('' otherwise): upsampled, it
    has nothing above half its own rate (8 kHz telephone audio: nothing above 4 kHz),
    which the model heard in training, so expect more errors."""
    file_rate = result.get("file_rate", rate)
    if file_rate >= rate:
        return ""
    return (
        f"{file_rate} Hz audio upsampled to the model's {rate} Hz: it has no sound above "
        f"{file_rate // 2} Hz, so expect more errors than on {rate} Hz recordings"
    )


def gate_note(result: dict) -> str:
    """What the speech gate left out of `result`, in words ('' if nothing)."""
    parts = []
    if result.get("skipped_noise_s") and not result["words"]:
        parts.append(
            f"no speech detected: {result['skipped_noise_s']:.1f} s of steady noise not decoded "
            f"(its speech-band level varies by under --noise_spread_db)"
        )
    elif result.get("skipped_noise_s"):
        parts.append(f"{result['skipped_noise_s']:.1f} s of steady noise not decoded")
    if result["skipped_silence_s"]:
        parts.append(f"{result['skipped_silence_s']:.1f} s of silence not decoded")
    dropped = [d["reason"] for d in result["dropped_words"]]
    if dropped:
        why = ", ".join(f"{dropped.count(r)} {r}" for r in sorted(set(dropped)))
        parts.append(f"{len(dropped)} word{'s' * (len(dropped) > 1)} dropped ({why})")
    return "; ".join(parts)


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    paths = argv[1:]
    if not paths:
        cli.usage_error("give one or more audio files to transcribe")
    if FLAGS.overlap_s >= FLAGS.window_s:
        cli.usage_error(f"--overlap_s ({FLAGS.overlap_s}) must be less than --window_s")
    if not FLAGS.max_word_s > 0:  # NaN too
        cli.usage_error(f"--max_word_s ({FLAGS.max_word_s}) must be more than 0")
    if not FLAGS.silence_db <= 0:  # no audio is louder than 0 dBFS: it would all be silence
        cli.usage_error(f"--silence_db ({FLAGS.silence_db}) must be at most 0 (-inf: off)")
    gate = longform.SpeechGate(
        floor_db=FLAGS.silence_db,
        max_word_s=FLAGS.max_word_s,
        noise_spread_db=FLAGS.noise_spread_db,
    )

    def job() -> None:
        if jax.process_count() > 1:
            raise UserError("transcribe runs in one process (use evaluate for multi-host jobs)")
        # The run's task's transcription (a recognizer's); a synthesizer's or a vocoder's
        # run is one line (no run: run_eval_config reports it).
        entry = tasks.of_run(FLAGS.workdir, default="asr")
        refused = entry.refusal("transcribe", FLAGS.workdir)
        if refused:
            raise UserError(refused)
        transcribe_files = entry.function("transcribe")
        try:
            config = eval_run.run_eval_config(
                FLAGS.workdir, FLAGS.method, FLAGS.beam, None, cli.decoding_overrides()
            )
            with rules.axis_rules(build.rules_from_config(config)):
                run = loading.load_run(FLAGS.workdir, step=FLAGS.step, config=config)
                failed = transcribe_files(
                    paths,
                    run,
                    config,
                    window_s=FLAGS.window_s,
                    overlap_s=FLAGS.overlap_s,
                    batch=FLAGS.batch,
                    emit=lambda r: print_result(r, FLAGS.json, int(config.features.sample_rate)),
                    min_pause_s=FLAGS.min_pause_s,
                    gate=gate,
                    progress=sys.stderr if FLAGS.progress else None,
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
    flags.DEFINE_bool(
        "progress",
        True,
        "A progress line on stderr for files over a minute: audio seconds done of the "
        "total, percent, speed (redrawn on a terminal; plain lines every 10% or 10 s "
        "otherwise).",
    )
    flags.DEFINE_float(
        "silence_db",
        -50.0,
        "Speech gate: 10 ms frames quieter than this (RMS, dBFS) are silence; pieces with "
        "under 0.1 s louder are not decoded, words mostly in silence are dropped (-inf: off; "
        "--max_word_s still applies).",
    )
    flags.DEFINE_float(
        "noise_spread_db",
        8.0,
        "Speech gate: pieces whose 250-4000 Hz level in 20 ms frames varies by less than "
        "this (95th - 10th percentile, dB) are steady noise, not decoded (0: off).",
        lower_bound=0,
    )
    flags.DEFINE_float(
        "max_word_s", 3.0, "Words longer than this are dropped (counted in the result)."
    )
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
