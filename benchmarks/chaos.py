"""Chaos: train through random SIGKILLs and SIGTERMs, then prove the resume was exact.

`python benchmarks/chaos.py [--quick] [--steps S] [--disruptions D] [--seed K]
[--data SHARDS] [--workdir DIR] [--out PATH]` prints a table of disruptions and a
summary, and writes `benchmarks/results/chaos.json`.

What runs: `python -m jaxspeech.train --config configs/demo.py:tiny` with
`train.num_steps=S`, `train.checkpoint_every=C` (4), `train.log_every=1` (a progress line
per step), `monitor.log_batch_ids=True` (RUN/batch_ids/p0.jsonl: the utterances of every
step), `monitor.samples_every=0` and `train.eval_at_end=False`, on one CPU device
(JAX_PLATFORMS=cpu, XLA_FLAGS=""), as users run it. Without --data a tiny corpus is
synthesized and prepared first, as tests/e2e/conftest.py does (0.06 h, char tokenizer).

1. Reference: the command once, uninterrupted, in DIR/reference; its wall time is timed
   (process start to exit).
2. Chaos: the same command in DIR/chaos, as subprocesses whose merged stdout/stderr is read
   line by line in a thread that stamps each line's arrival time, while the driver reads
   the lifecycle events the trainer appends to DIR/chaos/events.jsonl
   (`jaxspeech.monitor.read_events`, polled every POLL_S). The console gives only the
   progress line of each step (when it finished); where a run started, its saves,
   commits, resume, preemption and corrupt-checkpoint fallbacks come from the events.
   D disruptions, their kinds drawn from --seed (with D >= 3 at least one of each; always
   at least one kill during a save):
   - `sigkill_step`: SIGKILL once the progress line of a random step k has arrived;
   - `sigkill_save`: SIGKILL as soon as the `checkpoint_saved` event of step N appears,
     i.e. while Orbax is still writing step N asynchronously;
   - `sigterm_step`: SIGTERM once step k's progress line has arrived (the trainer finishes
     the step in flight, saves, writes a `preempted` event and exits 0).
   After each disruption the same command is started again; after the D-th it runs to the
   end (its `finished` event). The trigger of run i is drawn (from the same seeded
   generator) once the run says where it starts (its `started` event, step A): k
   uniformly from the i-th of D equal slices of steps 1..S-1, moved to start after A, so
   the disruptions spread over the whole run and every run makes progress past the step
   it resumed from (a kill before the first step would only repeat the compilation).
   `sigkill_save` waits for the first save of the schedule (a multiple of C) from the
   slice's start on; with none left before S it falls back to `sigkill_step`.
   With --damaged_records N (default 3; 0: off) both runs train on a copy of the corpus
   whose largest train shard has 64 bytes inverted at N places spread over it (what a bad
   disk or an interrupted copy leaves; `damage_corpus`), with
   `data.max_corrupt_fraction=0.2`: the unreadable records are skipped and counted.
3. Verify: the final parameters (and feature statistics) of both runs, read with
   `jaxspeech.state.load_run`, equal bit for bit (every leaf: dtype, shape,
   `np.array_equal` and the raw bytes), and `jaxspeech.monitor.read_batch_ids` gives the
   same utterance ids for every step 1..S (the same data order: nothing skipped or
   repeated across restarts); a step trained twice (before a kill and after it) must have
   read the same utterances both times. With damage: both runs skipped the same records
   (RUN/data_faults/p0.jsonl) at the same steps (`records_skipped` events), and a
   disruption came after a skip (the resumed run met the damage again, or resumed past it).

Recorded per disruption: kind, trigger_step (the step whose progress line or
`checkpoint_saved` event made the driver signal; for `sigkill_save` the step being saved),
last_step (the last step the run printed as completed, lines read to EOF, so it includes a
step that finished between the signal being sent and the process dying), committed (the
latest committed checkpoint in RUN/checkpoints once the process was gone: what a restart
finds; `committed_reported` is the latest `checkpoint_committed` event by then, which can
miss a commit Orbax finished just before a SIGKILL), resumed (the step the next run
restored: its `started` event, confirmed by its `resumed` event), steps_lost = last_step -
resumed, seconds_lost = time the signal was sent - time the killed run first had the
state of step `resumed` (its progress line of that step, or, when that is the step the
run itself started from, the time of its `started` event; 0 when nothing was lost),
restore_s (the `seconds` of the restart's `resumed` event: reading and verifying the
checkpoint), corrupt (checkpoints the restart set aside: `checkpoint_corrupt` events),
restart_to_step_s (restart process start to its first progress line: imports, restore,
compilation), exit code (-9 for SIGKILL; SIGTERM must give 0 and lose 0 steps).

Summary: max_steps_lost, max_seconds_lost, mean_restore_s, resumed_latest_committed (every
restart restored exactly the latest committed checkpoint), params_bitwise_equal,
data_order_equal, goodput = reference wall / total wall of all chaos runs (first start to
last exit: what the disruptions cost in all, restarts' start-up and compilation included).

What bounds steps_lost: a SIGTERM loses nothing. A SIGKILL loses the steps since the last
COMMITTED save. Saves are asynchronous and a save waits for the previous one to commit
before it starts, so when the kill lands the latest committed step is the latest started
save M or M - C: a kill during save N loses at most C (plus any step finished before the signal
landed), a kill at step k loses k - M (< C) or, if M is still being written, k - M + C.
With tiny's 0.1 s steps and a commit of 0.3-0.5 s, a kill 1-4 steps after a save often
finds it uncommitted. So steps_lost <= 2C, and the exact check is resumed == committed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
KINDS = ("sigkill_step", "sigkill_save", "sigterm_step")
CHECKPOINT_EVERY = 4
QUICK = {"steps": 16, "disruptions": 3}
FULL = {"steps": 40, "disruptions": 8}
RUN_TIMEOUT_S = 900.0  # one trainer process; tiny takes about a minute

POLL_S = 0.01  # how often the driver reads RUN/events.jsonl while a run is alive

# The console's progress line of a step ("[###...]  25% 4/16 | ..."): the only thing the
# driver reads from the console (when each step finished). Lifecycle facts (where a run
# started, saves, commits, resumes, preemption, corrupt checkpoints) come from
# RUN/events.jsonl (`jaxspeech.monitor.read_events`).
_PROGRESS = re.compile(r"\]\s+\d+% (\d+)/(\d+) \|")
_CORRUPT_STEP = re.compile(r"checkpoint (\d+) is corrupt")


# ------------------------------------------------------------------------------------
# Pure helpers (tested in tests/test_chaos_bench.py).
# ------------------------------------------------------------------------------------
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


def fires(trigger: tuple[str, int] | list | None, *, progress=None, saved=None) -> bool:
    """Whether a progress line of step `progress`, or a `checkpoint_saved` event of step
    `saved`, is the moment of this run's disruption."""
    if not trigger:
        return False
    kind, step = trigger
    if kind == "sigkill_save":
        return saved is not None and saved == step
    return progress is not None and progress == step


class EventFollower:
    """The events a run appends to RUN/events.jsonl: `poll()` returns those written since
    the last call (the file holds every earlier run's events too)."""

    def __init__(self, workdir: str):
        from jaxspeech import monitor

        self._read = monitor.read_events
        self.workdir = workdir
        self.seen = len(self._read(workdir))

    def poll(self) -> list[dict]:
        events = self._read(self.workdir)
        new, self.seen = events[self.seen :], len(events)
        return new


def plan_kinds(disruptions: int, seed: int) -> list[str]:
    """The kinds of the D disruptions, in order: at least one `sigkill_save`; with
    D >= 3 at least one of each kind; the rest drawn uniformly; shuffled by `seed`."""
    rng = random.Random(seed)
    if disruptions <= 0:
        return []
    base = list(KINDS) if disruptions >= 3 else ["sigkill_save"]
    kinds = base + [rng.choice(KINDS) for _ in range(disruptions - len(base))]
    rng.shuffle(kinds)
    return kinds


def window(index: int, total: int, start: int, steps: int) -> tuple[int, int] | None:
    """Steps lo..hi where disruption `index` of `total` may strike a run that starts at
    `start`: the index-th of `total` equal slices of 1..S-1, moved past `start` (at
    least one step past it, never S); None when no step is left before S."""
    lo = max(start + 1, index * (steps - 1) // total + 1)
    hi = min(steps - 1, max(lo, (index + 1) * (steps - 1) // total))
    return (lo, hi) if lo <= hi else None


def choose_trigger(
    kind: str,
    start: int,
    steps: int,
    every: int,
    index: int,
    total: int,
    rng: random.Random,
) -> tuple[str, int] | None:
    """(kind, step) of disruption `index` of `total` for a run that starts at `start`;
    None when no step is left before S.

    The step is drawn uniformly from `window(...)`, so disruptions spread over the whole
    run and each run gets past the step it resumed from. `sigkill_save` takes the first
    save of the schedule (a multiple of C) from the window's start on, and falls back to
    `sigkill_step` when none is left before step S."""
    span = window(index, total, start, steps)
    if span is None:
        return None
    k = rng.randint(*span)
    if kind == "sigkill_save":
        saves = [n for n in range(span[0], steps) if every and n % every == 0]
        return (kind, saves[0]) if saves else ("sigkill_step", k)
    return kind, k


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


# ------------------------------------------------------------------------------------
# Running the trainer.
# ------------------------------------------------------------------------------------
def train_command(
    workdir: str, data: str, steps: int, every: int, extra: Sequence[str] = ()
) -> list[str]:
    """The trainer's command line; `extra`: more `--config.` overrides (the tests share
    one compilation cache between runs and skip the FLOP count)."""
    return [
        sys.executable,
        "-u",
        "-m",
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        workdir,
        f"--config.data.dir={data}",
        f"--config.train.num_steps={steps}",
        f"--config.train.checkpoint_every={every}",
        "--config.train.log_every=1",
        "--config.monitor.log_batch_ids=True",
        "--config.monitor.samples_every=0",
        "--config.train.eval_at_end=False",
        *extra,
    ]


def _env() -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", PYTHONUNBUFFERED="1")


def run_trainer(
    cmd: list[str],
    log_path: str,
    choose: Callable[[int], tuple[str, int] | None] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> dict:
    """Run the trainer once; `choose(start_step)` -> (kind, step) | None picks this
    run's disruption once the run says where it starts. Returns the run's record."""
    workdir = cmd[cmd.index("--workdir") + 1]
    events = EventFollower(workdir)  # from the end of the previous runs' events
    t_start = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    lines: queue.Queue = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put((time.time(), line))
        lines.put((time.time(), None))

    threading.Thread(target=reader, daemon=True).start()
    run = new_run_record(t_start)
    try:
        _follow(proc, lines, events, run, log_path, choose, t_start, timeout_s, cmd)
    finally:
        if proc.poll() is None:  # the driver failed or was interrupted: no orphan trainer
            proc.kill()
            proc.wait()
    run["end_t"] = time.time()
    run["wall_s"] = run["end_t"] - t_start
    # What a restart will find: Orbax's committed steps on disk (a SIGKILL can land
    # between a save's commit and the trainer's `checkpoint_committed` event) ...
    run["committed_after"] = committed_steps(workdir)
    # ... and the temporary directory of a save the process did not live to commit.
    ckpts = os.path.join(workdir, "checkpoints")
    run["uncommitted_after"] = (
        sorted(n for n in os.listdir(ckpts) if "tmp" in n) if os.path.isdir(ckpts) else []
    )
    return run


def _follow(proc, lines, events, run, log_path, choose, t_start, timeout_s, cmd) -> None:
    """Read the run's console lines and lifecycle events as they arrive, fire its
    disruption, wait for its exit."""
    trigger = None
    with open(log_path, "w", encoding="utf-8") as log:

        def send(sig) -> None:
            run["signal_t"] = time.time()
            proc.send_signal(sig)
            run["signal"] = sig.name
            log.write(f"{run['signal_t'] - t_start:8.3f} [chaos] sent {sig.name}\n")

        while True:
            left = t_start + timeout_s - time.time()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise RuntimeError(
                    f"trainer ran past {timeout_s:.0f} s; killed. Command:\n{' '.join(cmd)}\n"
                    f"log: {log_path}"
                )
            try:
                t, line = lines.get(timeout=min(left, POLL_S))
            except queue.Empty:
                t, line = None, ""  # no console line: only the events file is read
            # Events first: every event written before this line was printed is on disk.
            for ev in events.poll():
                log.write(f"{ev['time'] - t_start:8.3f} [event] {json.dumps(ev)}\n")
                apply_event(run, ev)
                if ev["event"] == "started" and choose is not None:
                    trigger = choose(ev["step"])
                    run["trigger"] = list(trigger) if trigger else None
                saved = ev["step"] if ev["event"] == "checkpoint_saved" else None
                if run["signal"] is None and fires(trigger, saved=saved):
                    send(signal.SIGKILL)
            if line is None:  # end of output: the process is gone
                break
            if not line:
                continue
            log.write(f"{t - t_start:8.3f} {line}")
            progress = parse_progress(line)
            if progress is not None:
                apply_progress(run, progress[0], t)
                if run["signal"] is None and fires(trigger, progress=progress[0]):
                    send(signal.SIGTERM if trigger[0] == "sigterm_step" else signal.SIGKILL)
        run["exit_code"] = proc.wait(timeout=max(t_start + timeout_s - time.time(), 1))
        for ev in events.poll():  # anything written after its last console line
            log.write(f"{ev['time'] - t_start:8.3f} [event] {json.dumps(ev)}\n")
            apply_event(run, ev)


def _check_run(run: dict, cmd: list[str], log_path: str, expect_ok: bool) -> None:
    """A run that was not SIGKILLed must exit 0: anything else is a trainer failure."""
    if run["signal"] == "SIGKILL":
        return
    if run["exit_code"] != 0 or (expect_ok and run["last_step"] is None):
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-6000:]
        raise RuntimeError(
            f"trainer exited with {run['exit_code']} (signal sent: {run['signal']}).\n"
            f"Command: {' '.join(cmd)}\nLog ({log_path}):\n{tail}"
        )


def make_corpus(root: str) -> str:
    """Synthesize and prepare the tiny corpus of tests/e2e/conftest.py under `root`."""
    raw, shards = os.path.join(root, "raw"), os.path.join(root, "shards")

    def module(*args):
        proc = subprocess.run(
            [sys.executable, "-m", *args], cwd=ROOT, env=_env(), capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")

    module("data_prep.demo.synth", "--output", raw, "--hours", "0.06", "--seed", "1")
    for split in ("train", "dev", "test"):
        module(
            "data_prep.prepare",
            "--format",
            "manifest",
            "--input",
            os.path.join(raw, split, "manifest.jsonl"),
            "--output",
            shards,
            "--split",
            split,
            "--tokenizer",
            "char",
            "--direct_running_mode=in_memory",
            "--direct_num_workers=1",
        )
    return shards


def damage_corpus(data: str, dest: str, places: int) -> str:
    """A copy of the prepared corpus `data` at `dest` whose largest train shard has 64
    bytes inverted at `places` points spread evenly over its first 90% (its index and
    footer at the end stay readable). Returns `dest`."""
    shutil.copytree(data, dest)
    split = os.path.join(dest, "train")
    shards = [os.path.join(split, n) for n in os.listdir(split) if n.endswith(".array_record")]
    path = max(shards, key=os.path.getsize)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for k in range(places):
            at = int(0.9 * size * (k + 1) / (places + 1))
            f.seek(at)
            chunk = f.read(64)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))
    return dest


def skipped_by_step(workdir: str) -> dict[int, int]:
    """{step: unreadable records skipped} from a run's `records_skipped` events (a step
    replayed after a kill: its last event)."""
    from jaxspeech.monitor import read_events

    return {e["step"]: e["count"] for e in read_events(workdir) if e["event"] == "records_skipped"}


def faulty_records(workdir: str) -> list[tuple[str, int]]:
    """(shard file name, record index) of every record RUN/data_faults/p0.jsonl reports."""
    path = os.path.join(workdir, "data_faults", "p0.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a SIGKILL
                continue
    return sorted({(os.path.basename(r["shard"]), r["index"]) for r in rows})


# ------------------------------------------------------------------------------------
# Verification (in this process).
# ------------------------------------------------------------------------------------
def final_model(workdir: str) -> tuple[int, dict]:
    """(step, {"params", "model_vars"} as numpy) of a run's latest checkpoint."""
    import jax

    from jaxspeech import state as state_lib
    from jaxspeech.parallel import mesh as mesh_lib

    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    run = state_lib.load_run(workdir, mesh=mesh)
    model = {"params": run.params, "model_vars": run.model_vars}
    return run.step, jax.tree.map(np.asarray, model)


def trees_bitwise_equal(a, b) -> tuple[bool, list[str]]:
    """Whether two trees of arrays have the same paths, shapes, dtypes and bits; the
    paths that differ."""
    import jax

    fa = dict(jax.tree_util.tree_flatten_with_path(a)[0])
    fb = dict(jax.tree_util.tree_flatten_with_path(b)[0])
    bad = [jax.tree_util.keystr(k) for k in fa.keys() ^ fb.keys()]
    for k in fa.keys() & fb.keys():
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        # Raw bits: np.array_equal alone would call -0.0 and 0.0 equal and NaN unequal.
        same = x.dtype == y.dtype and x.shape == y.shape
        if not (same and np.array_equal(x, y, equal_nan=True) and x.tobytes() == y.tobytes()):
            bad.append(jax.tree_util.keystr(k))
    return not bad, sorted(bad)


def batch_id_lines(workdir: str) -> dict[int, list[list[str]]]:
    """Every complete line of RUN/batch_ids/p0.jsonl, grouped by step: a step replayed
    after a kill has several."""
    out: dict[int, list[list[str]]] = {}
    with open(os.path.join(workdir, "batch_ids", "p0.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                row = json.loads(line)
                out.setdefault(row["step"], []).append(row["ids"])
    return out


def verify(reference: str, chaos: str, steps: int) -> dict:
    from absl import logging as absl_logging

    from jaxspeech.monitor import read_batch_ids

    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # read-only managers warn about it
    try:
        step_a, a = final_model(reference)
        step_b, b = final_model(chaos)
    finally:
        absl_logging.set_verbosity(verbosity)
    params_ok, params_bad = trees_bitwise_equal(a["params"], b["params"])
    vars_ok, vars_bad = trees_bitwise_equal(a["model_vars"], b["model_vars"])
    ids_a, ids_b = read_batch_ids(reference), read_batch_ids(chaos)
    order_bad = [s for s in range(1, steps + 1) if s not in ids_a or ids_a.get(s) != ids_b.get(s)]
    # A step replayed after a kill must have read the same utterances both times.
    replays = {s: v for s, v in batch_id_lines(chaos).items() if len(v) > 1}
    return {
        "final_step_reference": step_a,
        "final_step_chaos": step_b,
        "params_bitwise_equal": bool(params_ok and step_a == step_b == steps),
        "params_differ": params_bad,
        "model_vars_bitwise_equal": bool(vars_ok),
        "model_vars_differ": vars_bad,
        "data_order_equal": not order_bad,
        "data_order_differs_at": order_bad,
        "replayed_steps": sorted(replays),
        "replays_identical": all(all(x == v[0] for x in v) for v in replays.values()),
        "utterances_per_run": sum(len(ids_a.get(s, [])) for s in range(1, steps + 1)),
    }


# ------------------------------------------------------------------------------------
# The driver.
# ------------------------------------------------------------------------------------
def run_chaos(
    *,
    steps: int,
    disruptions: int,
    seed: int = 0,
    every: int = CHECKPOINT_EVERY,
    data: str | None = None,
    workdir: str | None = None,
    out: str | None = None,
    quick: bool = False,
    verbose: bool = True,
    extra_args: Sequence[str] = (),
    damaged_records: int = 3,
) -> dict:
    """Reference run, chaos runs, verification; returns (and writes to `out`) the result."""
    say = print if verbose else (lambda *a, **k: None)
    t_bench = time.time()
    load_start = os.getloadavg()
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="jaxspeech-chaos-"))
    ref_dir, chaos_dir = os.path.join(workdir, "reference"), os.path.join(workdir, "chaos")
    for d in (ref_dir, chaos_dir):
        if os.path.exists(d):
            raise SystemExit(f"{d} exists: use a new --workdir (runs there would resume)")
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    if data is None:
        say(f"synthesizing and preparing the tiny corpus in {workdir}/corpus ...", flush=True)
        t0 = time.time()
        data = make_corpus(os.path.join(workdir, "corpus"))
        say(f"corpus ready in {time.time() - t0:.0f} s", flush=True)
    data = os.path.abspath(data)
    if damaged_records:
        data = damage_corpus(data, os.path.join(workdir, "damaged"), damaged_records)
        extra_args = [*extra_args, "--config.data.max_corrupt_fraction=0.2"]
        say(f"training on {data}: {damaged_records} places of a train shard damaged", flush=True)

    # ---------------------------------------------------------- reference
    say(f"reference: {steps} steps, checkpoint every {every}, uninterrupted", flush=True)
    ref_cmd = train_command(ref_dir, data, steps, every, extra_args)
    ref_log = os.path.join(logs, "reference.log")
    ref = run_trainer(ref_cmd, ref_log)
    _check_run(ref, ref_cmd, ref_log, expect_ok=True)
    if ref["last_step"] != steps or ref["finished"] != steps:
        raise RuntimeError(
            f"reference stopped at step {ref['last_step']} (finished: {ref['finished']}); "
            f"log: {ref_log}"
        )
    say(f"reference: {ref['wall_s']:.1f} s", flush=True)

    # ---------------------------------------------------------- chaos
    kinds = plan_kinds(disruptions, seed)
    rng = random.Random(seed + 1)
    cmd = train_command(chaos_dir, data, steps, every, extra_args)
    runs: list[dict] = []
    events: list[dict] = []
    t_chaos = time.time()
    while True:
        i = len(runs)
        pending = kinds[i] if i < len(kinds) else None

        def choose(start, pending=pending, i=i):
            if pending is None:
                return None
            return choose_trigger(pending, start, steps, every, i, len(kinds), rng)

        log_path = os.path.join(logs, f"chaos_{i}.log")
        run = run_trainer(cmd, log_path, choose)
        run["log"] = os.path.relpath(log_path, workdir)
        _check_run(run, cmd, log_path, expect_ok=True)
        runs.append(run)
        if run["corrupt"]:
            say(f"run {i}: quarantined corrupt checkpoint(s) {run['corrupt']}", flush=True)
        if events:  # this run is the restart of the previous disruption
            prev, event = runs[-2], events[-1]
            if run["start_step"] != event["committed"]:
                say(
                    f"WARNING: run {i} started at step {run['start_step']}, but the latest "
                    f"committed checkpoint was {event['committed']}",
                    flush=True,
                )
            if run["start_step"] and run["resumed_step"] != run["start_step"]:
                say(
                    f"WARNING: run {i} started at step {run['start_step']}, but its `resumed` "
                    f"event says step {run['resumed_step']}",
                    flush=True,
                )
            event["resumed"] = run["start_step"]
            event["corrupt"] = run["corrupt"]  # checkpoints the restart set aside
            event["steps_lost"] = (prev["last_step"] or 0) - run["start_step"]
            event["seconds_lost"] = round(seconds_lost(prev, run["start_step"]), 3)
            event["restore_s"] = run["restore_s"]
            event["restart_to_step_s"] = (
                round(run["first_step_t"] - run["start_t"], 2) if run["first_step_t"] else None
            )
            say(
                f"  -> restart resumed from step {event['resumed']} "
                f"(lost {event['steps_lost']} steps, {event['seconds_lost']:.1f} s; "
                f"restore {event['restore_s']} s)",
                flush=True,
            )
        if run["signal"] is None:
            if run["trigger"] is not None:
                raise RuntimeError(f"run {i} ended before its trigger {run['trigger']}")
            if run["finished"] != steps:  # its `finished` event
                raise RuntimeError(
                    f"run {i} ended at step {run['last_step']} without finishing; log: {log_path}"
                )
            break
        kind, trigger_step = run["trigger"]
        committed = run["committed_after"]
        events.append(
            {
                "run": i,
                "kind": kind,
                "planned_kind": pending,
                "signal": run["signal"],
                "start_step": run["start_step"],
                "trigger_step": trigger_step,
                "last_step": run["last_step"],
                "committed": committed[-1] if committed else 0,
                # The latest commit the trainer's events reported by then (it can miss one
                # that Orbax finished just before the kill).
                "committed_reported": max(
                    (c for r in runs for c in r["committed_reported"]), default=0
                ),
                "uncommitted": run["uncommitted_after"],
                "preempted": run["preempted"],
                "exit_code": run["exit_code"],
                "signal_at_s": round(run["signal_t"] - run["start_t"], 3),
            }
        )
        say(
            f"run {i}: {kind} at step {trigger_step} ({run['signal']} "
            f"{run['signal_t'] - run['start_t']:.1f} s after start), last step "
            f"{run['last_step']}, exit {run['exit_code']}, committed {committed}",
            flush=True,
        )
        if len(runs) > len(kinds) + 2:
            raise RuntimeError("more runs than planned disruptions: the driver is looping")
    chaos_wall = runs[-1]["end_t"] - t_chaos

    # ---------------------------------------------------------- verify
    checks = verify(ref_dir, chaos_dir, steps)
    summary = summarize(events)
    skips = skipped_by_step(ref_dir)
    checks |= {
        "damaged_places": damaged_records,
        "skipped_records": sum(skips.values()),
        "skipped_at_steps": sorted(skips),
        "skips_equal": skips == skipped_by_step(chaos_dir)
        and faulty_records(ref_dir) == faulty_records(chaos_dir),
        "faulty_records": faulty_records(ref_dir),
        "disrupted_after_a_skip": bool(skips)
        and any(e["trigger_step"] > min(skips) for e in events),
    }
    import jax

    result = {
        "benchmark": "chaos",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "config": "configs/demo.py:tiny",
        "steps": steps,
        "checkpoint_every": every,
        "seed": seed,
        "disruptions": len(events),
        "planned_kinds": kinds,
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "load_avg_at_start": [round(x, 2) for x in load_start],
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "reference_wall_s": round(ref["wall_s"], 2),
        "chaos_wall_s": round(chaos_wall, 2),
        "chaos_runs": len(runs),
        "goodput": round(ref["wall_s"] / chaos_wall, 4),
        "events": events,
        **summary,
        **checks,
        "runs": [
            {
                "start_step": r["start_step"],
                "last_step": r["last_step"],
                "trigger": r["trigger"],
                "signal": r["signal"],
                "exit_code": r["exit_code"],
                "wall_s": round(r["wall_s"], 2),
                "restore_s": r["restore_s"],
                "saves": r["saves"],
                "committed_reported": r["committed_reported"],
                "committed_after": r["committed_after"],
                "corrupt": r["corrupt"],
                "log": r.get("log", "logs/reference.log"),
            }
            for r in [ref, *runs]
        ],
        "workdir": workdir,
        "command": "python " + " ".join(cmd[1:]).replace("-u ", "", 1),
    }
    result["wall_s"] = round(time.time() - t_bench, 1)
    print_report(result, say)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        say(f"wrote {out}")
    return result


def print_report(r: dict, say=print) -> None:
    say()
    say(
        f"{r['steps']} steps of configs/demo.py:tiny, checkpoint every {r['checkpoint_every']}, "
        f"seed {r['seed']}, {r['disruptions']} disruptions; {r['cpu_count']} cores, "
        f"jax {r['jax']}"
    )
    say(
        "| # | kind | trigger step | last step | committed | save in flight | resumed "
        "| steps lost | seconds lost | restore s | restart to 1st step s | exit |"
    )
    say("|" + "---|" * 12)
    for n, e in enumerate(r["events"], 1):
        rs = "-" if e.get("restore_s") is None else f"{e['restore_s']:.1f}"
        rt = "-" if e.get("restart_to_step_s") is None else f"{e['restart_to_step_s']:.1f}"
        flight = ", ".join(d.split(".")[0] for d in e.get("uncommitted", [])) or "-"
        say(
            f"| {n} | {e['kind']} | {e['trigger_step']} | {e['last_step']} | {e['committed']} "
            f"| {flight} | {e.get('resumed', '-')} | {e.get('steps_lost', '-')} "
            f"| {e.get('seconds_lost', 0.0):.2f} | {rs} | {rt} | {e['exit_code']} |"
        )
    mr = "-" if r["mean_restore_s"] is None else f"{r['mean_restore_s']:.2f}"
    say(
        f"max steps lost {r['max_steps_lost']} (checkpoint every {r['checkpoint_every']}), "
        f"max seconds lost {r['max_seconds_lost']:.2f}, mean restore {mr} s; "
        f"kills during a save: {r['kills_during_save']}"
    )
    say(
        f"reference {r['reference_wall_s']:.1f} s, chaos {r['chaos_wall_s']:.1f} s in "
        f"{r['chaos_runs']} runs: goodput {r['goodput']:.1%}"
    )
    say(
        f"every restart restored the latest committed checkpoint: "
        f"{r['resumed_latest_committed']}; SIGTERM exits 0 losing 0 steps: {r['sigterm_clean']}"
    )
    say(
        f"final parameters bitwise equal: {r['params_bitwise_equal']} (step "
        f"{r['final_step_reference']} vs {r['final_step_chaos']}"
        + (f"; differ: {r['params_differ']}" if r["params_differ"] else "")
        + f"); feature statistics equal: {r['model_vars_bitwise_equal']}; data order equal "
        f"for steps 1..{r['steps']}: {r['data_order_equal']}"
        + (f" (differs at {r['data_order_differs_at']})" if r["data_order_differs_at"] else "")
        + f"; the {len(r['replayed_steps'])} steps replayed after kills read the same "
        f"utterances again: {r['replays_identical']}"
    )
    if r.get("damaged_places"):
        say(
            f"damaged corpus: {r['skipped_records']} unreadable records skipped at steps "
            f"{r['skipped_at_steps']} ({len(r['faulty_records'])} distinct); the same in "
            f"both runs: {r['skips_equal']}; a disruption after a skip: "
            f"{r['disrupted_after_a_skip']}"
        )
    say(f"total {r['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['steps']} steps, {QUICK['disruptions']} disruptions (one of each kind)",
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--disruptions", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=CHECKPOINT_EVERY, help="checkpoint every N")
    ap.add_argument("--data", default=None, help="prepared shards (default: synthesize)")
    ap.add_argument("--workdir", default=None, help="runs, logs, corpus (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep a default temp workdir")
    ap.add_argument("--out", default=os.path.join(RESULTS, "chaos.json"))
    ap.add_argument(
        "--damaged_records",
        type=int,
        default=3,
        help="places damaged in a train shard of a copy of the corpus (0: train on it as is)",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    steps = args.steps or plan["steps"]
    disruptions = plan["disruptions"] if args.disruptions is None else args.disruptions
    if steps < 2 * args.every + 2:
        ap.error(f"--steps {steps} leaves no room: use at least {2 * args.every + 2}")
    temp = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="jaxspeech-chaos-")
    try:
        return run_chaos(
            steps=steps,
            disruptions=disruptions,
            seed=args.seed,
            every=args.every,
            data=args.data,
            workdir=workdir,
            out=args.out,
            quick=args.quick,
            damaged_records=args.damaged_records,
        )
    finally:
        if temp and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)  # jaxspeech, when run as `python benchmarks/chaos.py`
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the driver only reads checkpoints
    main()
