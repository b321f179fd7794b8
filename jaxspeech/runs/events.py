"""A run's logs that every job reads and writes: console lines from process 0, the lifecycle
events log (RUN/events.jsonl) and the data-order audit (RUN/batch_ids/).

JSON-lines files opened for appends survive a kill: a line cut short stays one unreadable
record, never spoiling the next."""

from __future__ import annotations

import json
import os
import time

import jax

from jaxspeech.common import files

EVENTS = "events.jsonl"


def log(msg: str) -> None:
    """A console line from process 0 (every process would repeat it)."""
    if jax.process_index() == 0:
        print(msg, flush=True)


# ---------------------------------------------------------------- lifecycle events
def open_for_append(path: str):
    """A JSON-lines file opened for line-buffered appends; a last line cut short by a kill
    is ended first, so it stays one unreadable record instead of spoiling the next one."""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        if cut:
            with open(path, "a", encoding="utf-8") as f:
                f.write("\n")
    return open(path, "a", encoding="utf-8", buffering=1)


def _read_json_lines(path: str) -> list[dict]:
    """Complete JSON lines of `path`; a record cut by a kill is not one."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class EventLog:
    """Appends {"event": name, "time": unix seconds, ...} lines to RUN/events.jsonl on
    process 0, flushed as written, so a killed run keeps every event it reached. A
    restarted run appends to the same file: its history reads top to bottom."""

    def __init__(self, workdir: str):
        self._f = None
        if jax.process_index() == 0:
            os.makedirs(workdir, exist_ok=True)
            self._f = open_for_append(os.path.join(workdir, EVENTS))

    def write(self, event: str, **fields) -> None:
        if self._f is not None:
            line = json.dumps({"event": event, "time": round(time.time(), 3)} | fields)
            files.append_line(self._f, line)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters) for logs and events."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300]


def record_failure(workdir: str, exc: BaseException, step: int | None = None) -> None:
    """A `failed` event for an invocation that ends by an exception (process 0), or a
    `stopped` one (reason "interrupted", at the resume `step`) for a Ctrl-C, which is the
    user's stop, not a failure. On a full disk it cannot be written: then the released
    lease tells `status` the run is dead."""
    if jax.process_index() != 0 or not os.path.isdir(workdir):
        return
    try:
        log = EventLog(workdir)
        storage = files.storage_error(exc)
        if isinstance(exc, KeyboardInterrupt):
            log.write("stopped", step=step, reason="interrupted")
        else:
            log.write("failed", error=f"storage: {storage}" if storage else one_line(exc))
        log.close()
    except OSError:
        pass


def read_events(workdir: str) -> list[dict]:
    """The events of RUN/events.jsonl in order; a line cut short by a kill is left out."""
    path = os.path.join(workdir, EVENTS)
    return _read_json_lines(path) if os.path.exists(path) else []


# ---------------------------------------------------------------- data-order audit
class BatchIdLog:
    """RUN/batch_ids/p<process>.jsonl: {"step": s, "ids": [...]} per step, the utterances
    of this process's rows (monitor.log_batch_ids). Lines are flushed as written, so a
    killed run keeps them; steps replayed after a restart are written again, and the last
    line of a step is the one that counted. An audit of data order across restarts."""

    def __init__(self, workdir: str):
        os.makedirs(os.path.join(workdir, "batch_ids"), exist_ok=True)
        path = os.path.join(workdir, "batch_ids", f"p{jax.process_index()}.jsonl")
        self._f = open_for_append(path)

    def write(self, step: int, ids: list[str]) -> None:
        files.append_line(self._f, json.dumps({"step": step, "ids": list(ids)}))


def read_batch_ids(workdir: str, process: int = 0) -> dict[int, list[str]]:
    """{step: ids} from a BatchIdLog; a step written twice (replayed) keeps its last line."""
    path = os.path.join(workdir, "batch_ids", f"p{process}.jsonl")
    return {row["step"]: row["ids"] for row in _read_json_lines(path)}
