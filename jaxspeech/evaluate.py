"""Decode and score a model: `python -m jaxspeech.evaluate --workdir RUN --data DIR
--split dev,test [--watch]`.

Prints one JSON line per split {"split", "num_utts", "wer", "cer", "wer_ci95", "word_sub",
...} and writes it to RUN/eval/<split>-step<N>.json, with every utterance's reference,
hypothesis and errors in RUN/eval/<split>-step<N>-utts.jsonl. `--watch` follows a training
run instead (`jaxspeech.evaluation.watcher`). The run's own tokenizer (RUN/assets/tokenizer)
and normalization statistics (inside the checkpoint) are used, so DIR may be
any corpus prepared with `python -m data_prep.prepare`.

A synthesizer's run (config.task "tts") is evaluated by synthesizing each split's
sentences for their speakers (`jaxspeech.tts.evaluation`): MCD-DTW, wide-band PESQ,
F0 RMSE, and with `--asr_workdir ASR_RUN` that recognizer's CER / WER on the synthesized
and on the real speech (intelligibility: an automatic stand-in for MOS); one JSON line per
split, written to RUN/eval/<split>-step<N>-synthesis.json with -synthesis-utts.jsonl, and
samples in RUN/eval/samples/ and TensorBoard. `--max_utterances N`: each split's first N.
`--vocoder_workdir VOCODER_RUN`: a trained HiFi-GAN (config.task "vocoder") on the same
front end vocodes the synthesized speech beside Griffin-Lim; every measure is taken for both.
DNSMOS (SIG / BAK / OVRL / P.808, `jaxspeech.metrics.mos`) of each vocoder's speech and of
the recordings: on each split's first `--mos_utterances N` (default 32; 0: none).

Flags -> the run's task's evaluation in the registry (`jaxspeech.tasks`):
`jaxspeech.evaluation.run.evaluate_splits` (or `jaxspeech.evaluation.watcher.watch`) for a
recognizer, `jaxspeech.tts.evaluation.evaluate_tts_splits` for a synthesizer; a vocoder's
run is refused in one line (its training evaluates it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from absl import app, flags, logging

from jaxspeech import tasks
from jaxspeech.common import cli, storage
from jaxspeech.evaluation import watcher
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.parallel import mesh as mesh_lib

FLAGS = flags.FLAGS


def print_result(result: dict) -> None:
    """Examples and the worst utterances to stderr, the scores as one JSON line to stdout."""
    for ex in result.pop("examples", []):
        print(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}", file=sys.stderr)
    for w in result.get("worst", []):
        print(
            f"  worst {w['word_errors']}/{w['words']} {w['id']}\n    ref: {w['ref']}\n"
            f"    hyp: {w['hyp']}",
            file=sys.stderr,
        )
    result.pop("utterances", None)  # in RUN/eval/<split>-step<N>-utts.jsonl
    print(json.dumps(result), flush=True)


def evaluate_synthesizer(evaluate_tts_splits: Callable, splits: list[str] | None) -> None:
    """The evaluation of a synthesizer's run (`jaxspeech.tts.evaluation.evaluate_tts_splits`);
    the recognizer-only flags are refused, the decoding flags go to --asr_workdir's run."""
    if FLAGS.watch:
        cli.usage_error(
            f"--watch follows a recognizer's training; {FLAGS.workdir} is a synthesizer's "
            "run: evaluate its checkpoints one at a time (--step)"
        )
    if FLAGS.max_corrupt_fraction is not None:
        cli.usage_error(
            "--max_corrupt_fraction is for recognizer runs (a synthesizer's evaluation skips "
            "and counts unreadable records)"
        )
    decoding = cli.decoding_overrides()
    chosen = FLAGS.method or FLAGS.beam is not None or any(v is not None for v in decoding.values())
    if chosen and not FLAGS.asr_workdir:
        cli.usage_error(
            "the decoding flags choose how --asr_workdir's recognizer decodes: give --asr_workdir"
        )
    for result in evaluate_tts_splits(
        FLAGS.workdir,
        FLAGS.data,
        splits,
        FLAGS.step,
        asr_workdir=FLAGS.asr_workdir,
        method=FLAGS.method,
        beam=FLAGS.beam,
        decoding=decoding,
        max_utterances=FLAGS.max_utterances,
        vocoder_workdir=FLAGS.vocoder_workdir,
        mos_utterances=FLAGS.mos_utterances,
    ):
        print_result(result)


def evaluate_recognizer(evaluate_splits: Callable, splits: list[str] | None) -> None:
    """The evaluation of a recognizer's run (`jaxspeech.evaluation.run.evaluate_splits`, or
    `watcher.watch` with --watch); the synthesizer-only flags are refused."""
    tts_only = (FLAGS.max_utterances, FLAGS.mos_utterances)
    if FLAGS.asr_workdir or FLAGS.vocoder_workdir or any(v is not None for v in tts_only):
        cli.usage_error(
            "--asr_workdir, --vocoder_workdir, --max_utterances and --mos_utterances are "
            f"for a synthesizer's run (config.task=tts); {FLAGS.workdir} is not one"
        )
    if FLAGS.watch and FLAGS.step is not None:
        cli.usage_error("--step and --watch exclude each other (--watch scores every step)")
    if FLAGS.watch and storage.is_remote(FLAGS.workdir):
        cli.usage_error(
            "--watch needs a local run directory (it polls the run's files); evaluate a "
            "run on an object store without --watch, one step at a time"
        )
    overrides = (FLAGS.method, FLAGS.beam, FLAGS.max_corrupt_fraction, cli.decoding_overrides())
    if FLAGS.watch:
        watcher.watch(
            FLAGS.workdir, FLAGS.data, splits, *overrides,
            timeout_s=FLAGS.watch_timeout, poll_s=FLAGS.watch_poll_s,
        )  # fmt: skip
        return
    for result in evaluate_splits(FLAGS.workdir, FLAGS.data, splits, FLAGS.step, *overrides):
        print_result(result)


# The run's task -> how this command runs its evaluation (`tasks.TaskEntry.evaluate`).
EVALUATIONS = {"asr": evaluate_recognizer, "tts": evaluate_synthesizer}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")

    def job() -> None:
        splits = parse_splits(FLAGS.split) if FLAGS.split else None
        entry = tasks.of_run(FLAGS.workdir, default="asr")
        refused = entry.refusal("evaluate", FLAGS.workdir)
        if refused:
            cli.usage_error(refused)
        EVALUATIONS[entry.name](entry.function("evaluate"), splits)

    cli.run_job(job)


if __name__ == "__main__":
    mesh_lib.define_flags()
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string(
        "split", None, "Splits to score, comma-separated (default: the run's data.eval_split)."
    )
    flags.DEFINE_bool(
        "watch",
        False,
        "Follow the run: evaluate every newly committed checkpoint once per split, keep "
        "progress in RUN/eval/watch.json, exit when the run's final checkpoint is scored.",
    )
    flags.DEFINE_float(
        "watch_timeout",
        0.0,
        "With --watch: stop after this many seconds without a new "
        "checkpoint (0 = wait until the run finishes).",
        lower_bound=0.0,
    )
    flags.DEFINE_float(
        "watch_poll_s",
        30.0,
        "With --watch: seconds between looks for new checkpoints.",
        lower_bound=0.0,
    )
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest; not with --watch).")
    cli.define_decoding_flags()
    flags.DEFINE_float(
        "max_corrupt_fraction",
        None,
        "Unreadable records of the split allowed, as a fraction; they are skipped and "
        "counted (default: the run's data.max_corrupt_fraction).",
    )
    flags.DEFINE_string(
        "asr_workdir",
        None,
        "A synthesizer's run only: a recognizer run (jaxspeech.train) that transcribes the "
        "synthesized and the real speech; its CER / WER and their ratio measure "
        "intelligibility (the decoding flags apply to it).",
    )
    flags.DEFINE_string(
        "vocoder_workdir",
        None,
        "A synthesizer's run only: a vocoder run (configs/vocoder.py) on the same front end "
        "that vocodes the synthesized speech beside Griffin-Lim; both are scored.",
    )
    flags.DEFINE_integer(
        "max_utterances",
        None,
        "A synthesizer's run only: evaluate each split's first N records (default: all).",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "mos_utterances",
        None,
        "A synthesizer's run only: DNSMOS (about 2-3 s of CPU per utterance and system) on "
        "each split's first N utterances (default: 32; 0: none).",
        lower_bound=0,
    )
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
