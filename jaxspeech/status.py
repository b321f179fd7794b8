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

from jaxspeech import monitor

# The events that start or end an invocation, mapped to the state they leave the run in.
LIFECYCLE = {
    "started": "running",
    "resumed": "running",
    "preempted": "preempted",
    "stopped": "stopped",
    "finished": "finished",
}


def run_status(workdir: str) -> dict:
    """{"state": ..., "step": int | None, **the last lifecycle event's other fields}."""
    last = None
    for event in monitor.read_events(workdir):
        if event.get("event") in LIFECYCLE:
            last = event
    if last is None:
        return {"state": "none", "step": None}
    extra = {k: v for k, v in last.items() if k not in ("event", "time", "step")}
    return {"state": LIFECYCLE[last["event"]], "step": last.get("step")} | extra


def describe(status: dict) -> str:
    """`state=<state> step=<step> key=value ...`: one line, easy to grep."""
    return " ".join(f"{k}={v}" for k, v in status.items())


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: python -m jaxspeech.status RUN", file=sys.stderr)
        return 2
    status = run_status(argv[1])
    print(describe(status), flush=True)
    return 0 if status["state"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
