"""Train: `python -m jaxspeech.train --config configs/demo.py --workdir RUN [--config.k=v]`.

Flags -> config -> `jaxspeech.tasks.train_and_evaluate` (the trainer with the run's
task). Rerunning the same command resumes from the latest checkpoint in RUN.

Config keys: every key of jaxspeech/config/defaults.py can be set with
`--config.KEY=VALUE` (e.g. `--config.train.num_steps=3000`); an unknown key or a bad
value is one error line. `--config_help` lists every key with its default and what it is
for; with `--config FILE`, next to that file's values.
"""

from __future__ import annotations

import sys

from jaxspeech.runs import crash

if __name__ == "__main__":  # before the heavy imports: the parent stays a small process
    crash.supervise("train", "jaxspeech.train")  # a native crash: one line naming the step

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxspeech.common import cli  # noqa: E402
from jaxspeech.config import keys  # noqa: E402
from jaxspeech.parallel import mesh as mesh_lib  # noqa: E402
from jaxspeech.tasks import train_and_evaluate  # noqa: E402


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    if flags.FLAGS.config_help:
        print("\n".join(keys.describe_keys(config)), flush=True)
        return
    if config is None or workdir is None:
        cli.usage_error("--config and --workdir are required")
    cli.run_job(lambda: _train(config, workdir))


def _train(config, workdir: str) -> None:
    if "interrupted_at_step" in train_and_evaluate(config, workdir):
        sys.exit(130)  # stopped by Ctrl-C after saving: a script must not go on as if done


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Config file (configs/*.py[:variant]); --config.KEY=VALUE overrides any key "
        "(--config_help lists them).",
    )
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints, logs, assets.")
    flags.DEFINE_bool(
        "config_help",
        False,
        "Print every config key with its default and comment (and --config's value where "
        "it differs), then exit without training.",
    )
    mesh_lib.define_flags()
    app.run(main, flags_parser=cli.parse_flags)
