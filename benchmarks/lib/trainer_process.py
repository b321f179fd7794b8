"""Running `python -m jaxspeech.train` under a driver that may signal it.

The trainer runs as a subprocess whose merged stdout/stderr is read line by line in a
thread that stamps each line's arrival time, while the driver polls the run's
RUN/events.jsonl; a run's disruption (SIGKILL or SIGTERM) fires on the progress line or
`checkpoint_saved` event its trigger names. Used by benchmarks/chaos.py.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from benchmarks.lib import ROOT
from benchmarks.lib.disruptions import fires
from benchmarks.lib.run_record import (
    EventFollower,
    apply_event,
    apply_progress,
    committed_steps,
    new_run_record,
    parse_progress,
)

RUN_TIMEOUT_S = 900.0  # one trainer process; tiny takes about a minute

# The trainer's XLA flags: none (full optimization), as users run it. The suite's chaos
# test sets the tests' quick-compile flags (tests/e2e/cli.py): the equality it checks
# is between runs of one setting, and compiling at full optimization cost it ~1 minute.
XLA_FLAGS = ""
POLL_S = 0.01  # how often the driver reads RUN/events.jsonl while a run is alive


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


def trainer_env() -> dict:
    """The trainer's environment: one CPU device, as users run it, `XLA_FLAGS`, and
    unbuffered output."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=XLA_FLAGS, PYTHONUNBUFFERED="1")


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
        env=trainer_env(),
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


def check_run(run: dict, cmd: list[str], log_path: str, expect_ok: bool) -> None:
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
