"""Where a training run stands, from its lifecycle events (RUN/events.jsonl).

    python -m jaxspeech.status RUN

Prints one line, `state=<state> step=<step>` and the event's other fields, and exits 0
when the run has finished, 1 otherwise. Launchers (launch_tpu.sh, launch/slurm.sbatch)
ask it whether to start the command again after a preemption: a run that is not
finished resumes from its checkpoint.

States (the last lifecycle event): `finished` (reached train.num_steps), `preempted`
(saved a checkpoint at a signal and exited), `stopped` (train.run_steps ended this
invocation), `running` (started or resumed, and no end since: still running, or killed
before it could say), `none` (no events: never started, or not a run directory).
"""

from __future__ import annotations

import sys

from jaxspeech.runs import status as status_lib


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: python -m jaxspeech.status RUN", file=sys.stderr)
        return 2
    status = status_lib.run_status(argv[1])
    print(status_lib.describe(status), flush=True)
    return 0 if status["state"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
