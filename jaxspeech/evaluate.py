"""Decode and score a model: `python -m jaxspeech.evaluate --workdir RUN --data DIR
--split dev,test [--watch]`.

Prints one JSON line per split {"split", "num_utts", "wer", "cer", "wer_ci95", "word_sub",
...} and writes it to RUN/eval/<split>-step<N>.json, with every utterance's reference,
hypothesis and errors in RUN/eval/<split>-step<N>-utts.jsonl. `--watch` follows a training
run instead (`jaxspeech.evaluation.watcher`). The run's own tokenizer (RUN/assets/tokenizer)
and normalization statistics (inside the checkpoint) are used, so DIR may be
any corpus prepared with `python -m data_prep.prepare`.

Flags -> `jaxspeech.evaluation.run.evaluate_splits` (or `jaxspeech.evaluation.watcher.watch`).
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging

from jaxspeech import cli, storage
from jaxspeech.evaluation import run as eval_run
from jaxspeech.evaluation import scoring, watcher
from jaxspeech.parallel import mesh as mesh_lib

FLAGS = flags.FLAGS


def print_result(result: dict) -> None:
    """Examples and the worst utterances to stderr, the scores as one JSON line to stdout."""
    for ex in result.pop("examples"):
        print(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}", file=sys.stderr)
    for w in result.get("worst", []):
        print(
            f"  worst {w['word_errors']}/{w['words']} {w['id']}\n    ref: {w['ref']}\n"
            f"    hyp: {w['hyp']}",
            file=sys.stderr,
        )
    result.pop("utterances", None)  # in RUN/eval/<split>-step<N>-utts.jsonl
    print(json.dumps(result), flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")

    def job() -> None:
        if FLAGS.watch and FLAGS.step is not None:
            cli.usage_error("--step and --watch exclude each other (--watch scores every step)")
        if FLAGS.watch and storage.is_remote(FLAGS.workdir):
            cli.usage_error(
                "--watch needs a local run directory (it polls the run's files); evaluate a "
                "run on an object store without --watch, one step at a time"
            )
        splits = scoring.parse_splits(FLAGS.split) if FLAGS.split else None
        overrides = (FLAGS.method, FLAGS.beam, FLAGS.max_corrupt_fraction, cli.decoding_overrides())
        if FLAGS.watch:
            watcher.watch(
                FLAGS.workdir, FLAGS.data, splits, *overrides,
                timeout_s=FLAGS.watch_timeout, poll_s=FLAGS.watch_poll_s,
            )  # fmt: skip
            return
        for result in eval_run.evaluate_splits(
            FLAGS.workdir, FLAGS.data, splits, FLAGS.step, *overrides
        ):
            print_result(result)

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
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
