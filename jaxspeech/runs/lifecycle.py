"""A run's state from its events log (RUN/events.jsonl) and its lease (RUN/lease.json):
started, running, dead, failed, preempted, stopped, finished, and what it last reported."""

from __future__ import annotations

from jaxspeech.runs import events, lease, remote

# The events that start or end an invocation, mapped to the state they leave the run in.
LIFECYCLE = {
    "started": "running",
    "resumed": "running",
    "preempted": "preempted",
    "stopped": "stopped",
    "finished": "finished",
    "failed": "failed",
}


def run_status(workdir: str) -> dict:
    """{"state": ..., "step": int | None, **the last lifecycle event's other fields}.
    `step` of a running (or dead) run is the last step its job reported in its lease.

    A run whose last lifecycle event says it is running is `running` only while a live job
    holds its lease; otherwise it is `dead` (killed, or its host lost, before it could say
    so), with `why`. `committed` is the latest checkpoint the events log saw commit: where
    a restart resumes."""
    last, committed, drops = None, None, None
    for event in events.read_events(remote.read_copy(workdir)):
        if event.get("event") in LIFECYCLE:
            last = event
            drops = None if event["event"] == "started" else drops
        elif event.get("event") == "checkpoint_committed":
            committed = event.get("step")
        elif event.get("event") == "tracker_drops":  # the last invocation's, at its end
            drops = event.get("trackers", {})
    if last is None:
        return {"state": "none", "step": None}
    extra = {k: v for k, v in last.items() if k not in ("event", "time", "step")}
    out = {"state": LIFECYCLE[last["event"]], "step": last.get("step")}
    if out["state"] == "running":
        held = lease.lease_state(workdir)
        # The `started` event holds the step it started from; a live job's progress is
        # in its lease (renewed with every heartbeat).
        if held.get("step") is not None and held["step"] >= (out["step"] or 0):
            out["step"] = held["step"]
        if not held:
            out |= {"state": "dead", "why": "no job holds the run's lease and none said it ended"}
        elif not held["alive"]:
            out |= {"state": "dead", "why": f"lease holder {held['holder']}: {held['why']}"}
        else:
            out["holder"] = held["holder"]
    if committed is not None:
        out["committed"] = committed
    if drops:  # what MLflow / W&B missed (monitor.trackers)
        out["tracker_drops"] = ", ".join(
            f"{name} {d.get('values', 0)} values {d.get('files', 0)} files"
            for name, d in drops.items()
        )
    return out | extra


def describe(status: dict) -> str:
    """`state=<state> step=<step> key=value ...`: one line, easy to grep (values with
    spaces are quoted)."""
    return " ".join(
        f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in status.items()
    )
