"""A worker for the multi-process tests: `python -m jaxspeech.launch_local --num_processes 2
--devices_per_process 2 --module tests.parallel.dist_worker -- --mode ok`.

Modes:
  ok:    join the job, check process/device counts, all-gather the process indices
         across processes and print `worker <i> sum=<sum> processes=<n> devices=<local>/<global>`.
  fail:  join the job; process 1 exits with code 3 at once, the others wait in an
         all-gather that can never complete (a dead peer) until the heartbeat or the
         launcher ends them.
  sleep: sleep --sleep_s seconds without joining the job (no handlers: signals kill it).
  trap:  join the job, install a SIGTERM handler that writes `<out_dir>/p<i>.term` and
         exits 0, print `worker <i> ready`, sleep.
  preempt: join the job and run "steps" (an all-gather each) until JAX's preemption
         notifier (it catches SIGTERM) and `reached_preemption_sync_point` agree on a
         step, as train.py's checkpoint-and-exit does; write `<out_dir>/p<i>.step` with
         that step and exit 0. Prints `worker <i> ready` after a few steps.
Every mode first prints `worker <i> pid=<pid>`.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import jax
import numpy as np
from absl import app, flags
from jax.experimental import multihost_utils

from jaxspeech.parallel import mesh

_MODE = flags.DEFINE_enum("mode", "ok", ["ok", "fail", "sleep", "trap", "preempt"], "What to do.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "trap/preempt: where to write p<i>.*.")
_SLEEP_S = flags.DEFINE_float(
    "sleep_s", 120.0, "sleep/trap/preempt: how long to wait for a signal."
)


def run_until_preempted() -> int:
    """Steps until every process agrees on a preemption step; records it in out_dir."""
    deadline = time.monotonic() + _SLEEP_S.value
    step = 0
    while time.monotonic() < deadline:
        multihost_utils.process_allgather(np.array([step], np.int32))
        if multihost_utils.reached_preemption_sync_point(step):
            path = os.path.join(_OUT_DIR.value, f"p{jax.process_index()}.step")
            with open(path, "w") as f:
                f.write(f"{step}\n")
            print(f"worker {jax.process_index()} preempted at step {step}", flush=True)
            return 0
        if step == 3:
            print(f"worker {jax.process_index()} ready", flush=True)
        step += 1
        time.sleep(0.05)
    return 1  # no signal came


def main(argv):
    del argv
    index = flags.FLAGS.process_id
    print(f"worker {index} pid={os.getpid()}", flush=True)
    if _MODE.value == "sleep":
        time.sleep(_SLEEP_S.value)
        return 0
    how = mesh.initialize()
    if how != "flags":
        raise SystemExit(f"expected a flag-configured multi-process job, got {how!r}")
    if _MODE.value == "fail" and index == 1:
        print(f"worker {index} failing on purpose", flush=True)
        os._exit(3)  # noqa: SLF001 - like a crash: no atexit shutdown barrier with the peer
    gathered = multihost_utils.process_allgather(np.array([jax.process_index()], np.int32))
    print(
        f"worker {jax.process_index()} sum={int(np.sum(gathered))} "
        f"processes={jax.process_count()} "
        f"devices={jax.local_device_count()}/{jax.device_count()}",
        flush=True,
    )
    if _MODE.value == "preempt":
        return run_until_preempted()
    if _MODE.value == "trap":

        def on_term(signum, frame):
            del signum, frame
            path = os.path.join(_OUT_DIR.value, f"p{jax.process_index()}.term")
            with open(path, "w") as f:
                f.write("SIGTERM\n")
            print(f"worker {jax.process_index()} got SIGTERM", flush=True)
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
        print(f"worker {jax.process_index()} ready", flush=True)
        time.sleep(_SLEEP_S.value)
        return 1  # no signal came
    return 0


if __name__ == "__main__":
    mesh.define_flags()
    app.run(main)
