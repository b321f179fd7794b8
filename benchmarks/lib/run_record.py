"""What a trainer run said and when, and what a disruption cost.

A run's record holds the arrival time of each step's console progress line and the
lifecycle events the trainer appends to RUN/events.jsonl (`jaxspeech.runs.events.read_events`:
where the run started, saves, commits, resumes, preemption, corrupt checkpoints); from
the records of a killed run and its restart come the steps and seconds lost. Used by
benchmarks/chaos.py.
"""

from __future__ import annotations

import os
import re

import numpy as np

from jaxspeech.runs import events

# The console's progress line of a step ("[###...]  25% 4/16 | ..."): the only thing the
# driver reads from the console (when each step finished). Lifecycle facts (where a run
# started, saves, commits, resumes, preemption, corrupt checkpoints) come from
# RUN/events.jsonl (`jaxspeech.runs.events.read_events`).
_PROGRESS = re.compile(r"\]\s+\d+% (\d+)/(\d+) \|")
_CORRUPT_STEP = re.compile(r"checkpoint (\d+) is corrupt")


def parse_progress(line: str) -> tuple[int, int] | None:
    """(step, num_steps) of a console progress line, or None for any other line."""
    if m := _PROGRESS.search(line.strip()):
        return int(m.group(1)), int(m.group(2))
    return None


def new_run_record(t_start: float) -> dict:
    """A run's record before it says anything."""
    return {
        "start_t": t_start,
        "start_step": None,  # `started` event
        "training_t": None,  # its time
        "resumed_step": None,  # `resumed` event
        "restore_s": None,
        "step_t": {},  # console progress lines: arrival time of each step's first line
        "saves": [],  # `checkpoint_saved` events: [step, seconds after start]
        "committed_reported": [],  # `checkpoint_committed` events
        "last_step": None,
        "preempted": None,  # `preempted` event
        "finished": None,  # `finished` event
        "corrupt": [],  # `checkpoint_corrupt` events: the step set aside
        "trigger": None,
        "signal": None,
        "signal_t": None,
        "first_step_t": None,
    }


def corrupt_step(event: dict) -> int | None:
    """The step a `checkpoint_corrupt` event set aside (its `step`, else the step its
    message names)."""
    if event.get("step") is not None:
        return int(event["step"])
    m = _CORRUPT_STEP.search(event.get("message", ""))
    return int(m.group(1)) if m else None


def apply_event(run: dict, event: dict) -> None:
    """Record one lifecycle event of RUN/events.jsonl in a run's record."""
    kind, t = event["event"], event["time"]
    if kind == "started":
        run["start_step"], run["training_t"] = event["step"], t
    elif kind == "resumed":
        run["resumed_step"], run["restore_s"] = event["step"], event["seconds"]
    elif kind == "checkpoint_saved":
        run["saves"].append([event["step"], round(t - run["start_t"], 3)])
    elif kind == "checkpoint_committed":
        run["committed_reported"].append(event["step"])
    elif kind == "checkpoint_corrupt":
        run["corrupt"].append(corrupt_step(event))
    elif kind == "preempted":
        run["preempted"] = event["step"]
        run["last_step"] = max(run["last_step"] or 0, event["step"])
    elif kind == "finished":
        run["finished"] = event["step"]


def apply_progress(run: dict, step: int, t: float) -> None:
    """Record a console progress line of `step` that arrived at `t`."""
    run["step_t"].setdefault(step, t)
    run["first_step_t"] = run["first_step_t"] or t
    run["last_step"] = max(run["last_step"] or 0, step)


class EventFollower:
    """The events a run appends to RUN/events.jsonl: `poll()` returns those written since
    the last call (the file holds every earlier run's events too)."""

    def __init__(self, workdir: str):

        self._read = events.read_events
        self.workdir = workdir
        self.seen = len(self._read(workdir))

    def poll(self) -> list[dict]:
        """The events written since the last call (or since this follower was made)."""
        events = self._read(self.workdir)
        new, self.seen = events[self.seen :], len(events)
        return new


def first_reached(run: dict, step: int) -> float | None:
    """When a run first had the state of `step`: its progress line of `step`, or, for
    the step it started from, its `started` event."""
    if step == run.get("start_step") and run.get("training_t") is not None:
        return run["training_t"]
    return run["step_t"].get(step)


def seconds_lost(run: dict, resumed: int) -> float:
    """Signal time - the moment the killed run first had the state the next run resumed
    from; 0 when the resumed step is the last one the run completed."""
    if resumed >= run["last_step"] or run.get("signal_t") is None:
        return 0.0
    t = first_reached(run, resumed)
    if t is None:  # e.g. resumed from a step before this run's start: all of it
        t = run["start_t"]
    return max(0.0, run["signal_t"] - t)


def committed_steps(workdir: str) -> list[int]:
    """Committed checkpoint steps in RUN/checkpoints (Orbax's temporary directories of
    saves in flight are not steps)."""
    d = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(d):
        return []
    return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def summarize(events: list[dict]) -> dict:
    """max_steps_lost, max_seconds_lost, mean_restore_s, resumed_latest_committed and the
    SIGTERM checks of a list of event records."""
    restores = [e["restore_s"] for e in events if e.get("restore_s") is not None]
    terms = [e for e in events if e["kind"] == "sigterm_step"]
    return {
        "max_steps_lost": max((e["steps_lost"] for e in events), default=0),
        "max_seconds_lost": max((e["seconds_lost"] for e in events), default=0.0),
        "mean_restore_s": float(np.mean(restores)) if restores else None,
        "resumed_latest_committed": all(e["resumed"] == e["committed"] for e in events),
        "sigterm_clean": all(e["exit_code"] == 0 and e["steps_lost"] == 0 for e in terms),
        "kills_during_save": sum(e["kind"] == "sigkill_save" for e in events),
    }
