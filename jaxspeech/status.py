"""Where a training run stands, from its lifecycle events (RUN/events.jsonl).

    python -m jaxspeech.status --workdir RUN
    python -m jaxspeech.status RUN          (the same; the launchers call it so)

Prints one line, `state=<state> step=<step>` and the event's other fields, and exits 0
when the run has finished, 1 otherwise, 2 for a bad command line. Launchers
(launch_tpu.sh, launch/slurm.sbatch, launch/tpu_worker.sh) ask it whether to start the
command again after a preemption: a run that is not finished resumes from its checkpoint.

The states are `jaxspeech.runs.lifecycle`'s: `finished` (reached train.num_steps),
`preempted` (saved a checkpoint at a signal and exited), `stopped` (train.run_steps ended
this invocation), `running` (a live job holds the run's lease, RUN/lease.json), `dead`
(it said it started, but no live job holds the lease: killed, or its host lost; `why`
says which), `failed` (an exception ended it: `error` says which, e.g. `storage: no space
left on device at ...`), and `none` (no events: never started, or not a run directory).
`committed` is the latest checkpoint the events log saw commit: where a restart resumes.
A RUN that does not exist is `none` too (exit 1: the launchers
then start the run), and one line on stderr says that it does not exist.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from jaxspeech.common import cli, storage
from jaxspeech.runs import lifecycle as status_lib


def define_flags(fv: flags.FlagValues) -> None:
    """The flags of this command (on a fresh set: `main` may run many times in-process)."""
    flags.DEFINE_string(
        "workdir",
        None,
        "Run directory written by jaxspeech.train (or give it as RUN).",
        flag_values=fv,
    )


def workdir_of(argv: list[str]) -> str:
    """The run directory from a parsed command line: `--workdir RUN` or one positional RUN,
    never both; anything else is a usage error (exit 2)."""
    fv = flags.FlagValues()
    define_flags(fv)
    rest = cli.parse_flags(argv, fv, doc=__doc__)[1:]
    if fv.workdir is not None and rest:
        cli.usage_error(f"give the run once, as --workdir RUN or RUN, not both (got {rest})")
    if fv.workdir is None and len(rest) != 1:
        got = f"got {len(rest)} arguments: {rest}" if rest else "no run given"
        cli.usage_error(f"usage: python -m jaxspeech.status --workdir RUN ({got})")
    workdir = fv.workdir if fv.workdir is not None else rest[0]
    if not workdir:
        cli.usage_error("--workdir is empty")
    return workdir


def main(argv: list[str]) -> int:
    """argv[0] is the program. Returns the exit code: 0 finished, 1 not (or no such run)."""
    workdir = workdir_of(argv)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        cli.usage_error(f"{workdir} is not a directory")
    status = status_lib.run_status(workdir)
    print(status_lib.describe(status), flush=True)
    if not storage.exists(workdir):
        print(f"status: {workdir} does not exist (no run there yet)", file=sys.stderr)
    return 0 if status["state"] == "finished" else 1


if __name__ == "__main__":
    with cli.interrupt_as_one_line():
        sys.exit(main(sys.argv))
