"""A run's state from its events log (RUN/events.jsonl): started, running, preempted,
stopped, finished, and what it last reported."""

from __future__ import annotations

from jaxspeech.runs import events

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
    for event in events.read_events(workdir):
        if event.get("event") in LIFECYCLE:
            last = event
    if last is None:
        return {"state": "none", "step": None}
    extra = {k: v for k, v in last.items() if k not in ("event", "time", "step")}
    return {"state": LIFECYCLE[last["event"]], "step": last.get("step")} | extra


def describe(status: dict) -> str:
    """`state=<state> step=<step> key=value ...`: one line, easy to grep."""
    return " ".join(f"{k}={v}" for k, v in status.items())
