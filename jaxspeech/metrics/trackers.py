"""Experiment trackers (MLflow, Weights & Biases) as writers of the same metrics as
TensorBoard (`jaxspeech.metrics.writers.MetricWriter` hands them every scalar, image,
audio clip and text), on process 0 only.

A tracker never stops or slows training: each has a bounded queue drained by a thread of
its own. A full queue or a failed delivery drops the item, counted, with one warning line;
the count is reported when the run's invocation ends. A tracker that fails three times in
a row is left alone for a minute (items meanwhile dropped), so a dead server costs no
request per item.

RUN/trackers.json keeps, per tracker, its run's id and the last step delivered of every
metric and file: a resumed run continues the same tracker run, and sends nothing at a step
it already delivered (the steps a resume replays). It holds no endpoint or credential;
those come from the environment only (`jaxspeech.metrics.tracker_backends`).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping

from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.metrics.tracker_backends import PACKAGES, Backend, make_backend

TRACKERS = ("tensorboard", *PACKAGES)
STATE = "trackers.json"
QUEUE_SIZE = 1000  # items (one per scalars call or file): minutes of logging at most
CLOSE_TIMEOUT_S = 30.0  # how long the end of a run waits for a tracker to catch up
FAILURES_BEFORE_PAUSE, PAUSE_S = 3, 60.0
PARAM_CHARS = 500  # MLflow's limit on a param's value in older servers


# ---------------------------------------------------------------- config
def parse(text: str) -> list[str]:
    """ "tensorboard,mlflow" -> ["tensorboard", "mlflow"] (spaces and order ignored).

    Raises:
      ValueError: an unknown or empty name, or one named twice.
    """
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"monitor.trackers must be distinct names out of {', '.join(TRACKERS)} separated "
            f"by commas, got {text!r}"
        )
    return names


def mistakes(text: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """monitor.trackers' mistakes, one line each: a bad list, a tracker whose package is
    not installed, or one the environment gives no endpoint or credential."""
    try:
        names = parse(text)
    except ValueError as e:
        return [str(e)]
    out = []
    for name in names:
        package = PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            out.append(
                f"monitor.trackers has {name}, but the {package} package is not installed: "
                f"pip install 'jaxspeech[{name}]'"
            )
    if "mlflow" in names and not env.get("MLFLOW_TRACKING_URI"):
        out.append(
            "monitor.trackers has mlflow: set MLFLOW_TRACKING_URI to the tracking server "
            "(http://host:5000) or store (sqlite:///path/mlflow.db)"
        )
    wandb_mode = env.get("WANDB_MODE", "")
    logged_in = os.path.exists(os.path.expanduser("~/.netrc"))  # `wandb login` writes it
    if "wandb" in names and wandb_mode not in ("offline", "disabled"):
        if not (env.get("WANDB_API_KEY") or logged_in):
            out.append(
                "monitor.trackers has wandb: set WANDB_API_KEY (or run `wandb login`), "
                "or WANDB_MODE=offline to write the run's files for `wandb sync`"
            )
    return out


def flat_params(tree: Mapping, prefix: str = "") -> dict[str, str]:
    """A nested config as flat {"train.num_steps": "8"} strings (lists as JSON), each
    at most PARAM_CHARS characters (longer values end in "...")."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out |= flat_params(v, key + ".")
            continue
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        out[key] = text if len(text) <= PARAM_CHARS else text[: PARAM_CHARS - 3] + "..."
    return out


# ---------------------------------------------------------------- RUN/trackers.json
def read_state(workdir: str) -> dict:
    """{tracker: {"run_id", "logged": {key: last step delivered}}}; {} for a new run."""
    path = os.path.join(workdir, STATE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable ({e}); remove it to start new tracker runs") from e


class _StateFile:
    """RUN/trackers.json, written whole by the trackers' threads (one lock: one writer).
    `readonly`: never written (a job beside the training job, which owns the file)."""

    def __init__(self, workdir: str, readonly: bool = False):
        self.path = os.path.join(workdir, STATE)
        self.state = read_state(workdir)
        self.lock = threading.Lock()
        self.readonly = readonly

    def of(self, name: str) -> dict:
        return self.state.setdefault(name, {"run_id": "", "logged": {}})

    def record(self, mine: dict, run_id: str = "", keys=(), step: int = 0) -> None:
        """Notes a tracker's run id or the `keys` delivered at `step`, and writes the file
        (under the lock: two trackers' threads share the state)."""
        with self.lock:
            if run_id:
                mine["run_id"] = run_id
            for k in keys:
                mine["logged"][k] = max(step, mine["logged"].get(k, -1))
            if not self.readonly:
                files.atomic_json(self.path, self.state)


# ---------------------------------------------------------------- one tracker
class TrackerQueue:
    """One tracker's bounded queue and the thread that delivers it. `put` never blocks."""

    def __init__(
        self,
        name: str,
        backend: Callable[[], Backend],
        state: _StateFile,
        run_name: str,
        params: Mapping[str, str],
        *,
        warn: Callable[[str], None] = print,
        maxsize: int = QUEUE_SIZE,
    ):
        self.name, self._backend_fn, self._state = name, backend, state
        self._run_name, self._params, self._warn = run_name, dict(params), warn
        self._mine = state.of(name)
        # The steps already delivered (this invocation's sends are added as they are queued).
        self._sent = dict(self._mine["logged"])
        self._queue: queue.Queue = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self.dropped = {"values": 0, "files": 0}
        self._first_error = ""
        self._warned = False
        self._backend: Backend | None = None
        self._held: dict[str, int] = {}  # last steps a continued tracker run holds
        self._failures, self._paused_until = 0, 0.0
        self._thread = threading.Thread(target=self._drain, name=f"tracker-{name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ caller's side
    def _new(self, key: str, step: int) -> bool:
        """Whether `key` at `step` was never sent (a replayed step after a resume was)."""
        if step <= self._sent.get(key, -1):
            return False
        self._sent[key] = step
        return True

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        fresh = {k: float(v) for k, v in values.items() if self._new(k, step)}
        if fresh:
            self._put(("metrics", step, fresh))

    def artifact(self, step: int, key: str, name: str, data: bytes) -> None:
        """The file `name` (bytes `data`), sent once per `key` and step."""
        if self._new(f"file:{key}", step):
            self._put(("artifact", step, (key, name, data)))

    def _put(self, item: tuple) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(item, f"its queue is full ({self._queue.maxsize} items)")

    # ------------------------------------------------------------ the thread
    def _drop(self, item: tuple, why: str) -> None:
        kind, _, payload = item
        with self._lock:
            if kind == "metrics":
                self.dropped["values"] += len(payload)
            else:
                self.dropped["files"] += 1
            self._first_error = self._first_error or why
            warn, self._warned = not self._warned, True
        if warn:
            self._warn(
                f"WARNING: tracker {self.name}: {why}; training goes on, what it could not "
                "take is counted and reported at the end (RUN/metrics.jsonl keeps it all)"
            )

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if time.monotonic() < self._paused_until:
                    self._drop(item, self._first_error or "paused")
                    continue
                try:
                    self._deliver(item)
                    self._failures = 0
                except Exception as e:  # noqa: BLE001 - any failure of a tracker is counted
                    self._failures += 1
                    if self._failures >= FAILURES_BEFORE_PAUSE:
                        self._paused_until = time.monotonic() + PAUSE_S
                    first = (str(e).strip().splitlines() or [""])[0][:200]
                    self._drop(item, f"{type(e).__name__}: {first}")
            finally:
                self._queue.task_done()

    def _deliver(self, item: tuple) -> None:
        if self._backend is None:  # opened here: a slow server never delays the start
            backend = self._backend_fn()
            continued = self._mine["run_id"] or None
            run_id = backend.open(continued, self._run_name, self._params)
            metrics = [k for k in self._mine["logged"] if not k.startswith("file:")]
            self._held = backend.last_steps(metrics) if continued else {}
            self._backend = backend
            self._state.record(self._mine, run_id=run_id)  # first: a kill resumes this run
        kind, step, payload = item
        if kind == "metrics":
            keys = payload
            # What the run already holds, delivered just before a kill could note it.
            fresh = {k: v for k, v in payload.items() if step > self._held.get(k, -1)}
            if fresh:
                self._backend.metrics(step, fresh)
        else:
            key, name, data = payload
            self._backend.artifact(name, data)
            keys = [f"file:{key}"]
        self._state.record(self._mine, keys=keys, step=step)

    def close(self, ok: bool, timeout: float = CLOSE_TIMEOUT_S) -> str:
        """Waits up to `timeout` s for the queue to drain, ends the tracker's run, and
        returns the line reporting drops ("" when all was delivered)."""
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():  # stuck on a slow server: what is left is dropped
            left = []
            while True:
                try:
                    left.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for item in left:
                if item is not None:
                    self._drop(item, f"not delivered within {timeout:.0f} s of the end")
        elif self._backend is not None:
            try:
                self._backend.close(ok)
            except Exception as e:  # noqa: BLE001 - the run's data is delivered already
                self._warn(f"WARNING: tracker {self.name}: could not end its run: {e}")
        return self.report()

    def report(self) -> str:
        values, count = self.dropped["values"], self.dropped["files"]
        if not values and not count:
            return ""
        return (
            f"tracker {self.name}: {values} metric values and {count} files not delivered "
            f"(first: {self._first_error}); RUN/metrics.jsonl, RUN/eval/ and TensorBoard "
            "have them"
        )


# ---------------------------------------------------------------- all of a run's trackers
class Trackers:
    """The trackers of monitor.trackers other than TensorBoard, fed the same values."""

    def __init__(self, queues: list[TrackerQueue]):
        self.queues = queues

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for q in self.queues:
            q.scalars(step, values)

    def artifact(self, step: int, key: str, name: str, data: bytes) -> None:
        for q in self.queues:
            q.artifact(step, key, name, data)

    def file(self, step: int, path: str, name: str) -> None:
        """The file at `path` as the artifact `name` (read now: later changes unseen)."""
        if self.queues:
            with open(path, "rb") as f:
                self.artifact(step, name, name, f.read())

    def close(self, ok: bool, timeout: float = CLOSE_TIMEOUT_S) -> list[str]:
        """Ends every tracker's run; returns the drop reports (empty: all delivered)."""
        return [line for q in self.queues if (line := q.close(ok, timeout))]

    def dropped(self) -> dict[str, dict[str, int]]:
        return {q.name: dict(q.dropped) for q in self.queues}


def open_trackers(
    text: str,
    workdir: str,
    config: Mapping,
    *,
    warn: Callable[[str], None] = print,
    backend: Callable[[str], Backend] | None = None,
) -> Trackers:
    """The trackers named in monitor.trackers `text` (TensorBoard is the MetricWriter's
    own) for the run in `workdir`, whose `config` is logged as flat params. `backend`
    (tests): name -> Backend, instead of the real ones.

    Raises:
      UserError: a mistake of `mistakes`.
    """
    found = mistakes(text) if backend is None else []
    if found:
        raise UserError("\n".join(found))
    state = _StateFile(workdir)
    params = flat_params(config)
    run_name = os.path.basename(os.path.abspath(workdir))
    make = backend or (lambda name: make_backend(name, workdir))
    queues = [
        TrackerQueue(n, lambda n=n: make(n), state, run_name, params, warn=warn)
        for n in parse(text)
        if n != "tensorboard"
    ]
    return Trackers(queues)


def send_to_runs(
    workdir: str,
    path: str,
    name: str,
    *,
    warn: Callable[[str], None] = print,
    backend: Callable[[str], Backend] | None = None,
) -> list[str]:
    """Sends the file `path` (an export's manifest) as `name` to the tracker runs the
    training run in the local `workdir` started (RUN/trackers.json; none: nothing to do).
    The file is not written: the training job owns it. A tracker the environment gives no
    endpoint is skipped with a warning. Returns the drop reports."""
    state = _StateFile(workdir, readonly=True)
    runs = [n for n, s in state.state.items() if n in PACKAGES and s.get("run_id")]
    make = backend or (lambda n: make_backend(n, workdir))
    queues = []
    for n in runs:
        found = mistakes(n) if backend is None else []
        if found:
            warn(f"WARNING: not sent to the run's {n} run: {found[0]}")
            continue
        name_of_run = os.path.basename(os.path.abspath(workdir))
        queues.append(TrackerQueue(n, lambda n=n: make(n), state, name_of_run, {}, warn=warn))
    if not queues:
        return []
    with open(path, "rb") as f:
        data = f.read()
    for q in queues:
        q._put(("artifact", 0, (name, name, data)))  # always: a new export replaces it
    return [line for q in queues if (line := q.close(True))]


# ---------------------------------------------------------------- files of pictures and sound
def png_bytes(img_hwc_uint8) -> bytes:
    """An (H, W, 3) uint8 image as PNG bytes."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(img_hwc_uint8).save(out, format="PNG")
    return out.getvalue()


def wav_bytes(wave, sample_rate: int) -> bytes:
    """An (S,) float waveform in [-1, 1] as 16-bit WAV bytes."""
    import soundfile as sf

    out = io.BytesIO()
    sf.write(out, wave, int(sample_rate), format="WAV", subtype="PCM_16")
    return out.getvalue()
