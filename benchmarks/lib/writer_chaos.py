"""benchmarks/chaos.py's writer scenarios: two trainers started on one run directory, and
the disk filling up while a checkpoint is being written.

- `two_trainers`: a copy of the finished reference run is extended by 2 checkpoint
  intervals by two trainers started 1 s apart on the same directory (what a resubmitted
  job or a restarted host with its old process still alive does). Expected: the second
  refuses at once with one line naming the holder (exit 2), the first finishes; the
  events log has one start and each checkpoint once; no Orbax NOT_FOUND, no traceback.
- `disk_full`: the tiny run on a small tmpfs; when the trainer says it started writing
  checkpoint 2C (the `checkpoint_saved` event: Orbax is writing in the background),
  the driver fills the file system. Expected: exit 5 with one `error: storage:` line,
  the last committed checkpoint intact, `status` says failed; after the filler is
  removed the same command resumes from that checkpoint, removes the temporary save
  and finishes with parameters bitwise equal to the uninterrupted reference. Needs
  root (mount); elsewhere the row says it was skipped and why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

from benchmarks.lib.resume_check import verify
from benchmarks.lib.run_record import committed_steps
from benchmarks.lib.trainer_process import train_command, trainer_env
from jaxspeech.runs import events as events_lib
from jaxspeech.runs import lifecycle as status_lib

TMPFS_MB = 96  # the tiny run's files (compile cache, two checkpoints) fit with room left


def _start(cmd: list[str], log_path: str) -> tuple[subprocess.Popen, object]:
    log = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=trainer_env())
    return proc, log


def _log_facts(log_path: str) -> dict:
    """What a user sees in a trainer's console: its lines, tracebacks and last error."""
    lines = open(log_path, encoding="utf-8", errors="replace").read().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:")]
    return {
        "console_lines": len(lines),
        "tracebacks": sum(ln.startswith("Traceback") for ln in lines),
        "not_found": sum("NOT_FOUND" in ln for ln in lines),
        "error_line": errors[-1] if errors else None,
    }


def _leftovers(run: str) -> list[str]:
    d = os.path.join(run, "checkpoints")
    return sorted(n for n in os.listdir(d) if not n.isdigit()) if os.path.isdir(d) else []


def two_trainers(
    ref_dir: str, data: str, steps: int, every: int, extra: Sequence[str], workdir: str, say
) -> dict:
    run = os.path.join(workdir, "two_trainers")
    shutil.copytree(ref_dir, run)
    n_before = len(events_lib.read_events(run))
    cmd = train_command(run, data, steps + 2 * every, every, extra)
    procs = []
    for i in range(2):
        procs.append(_start(cmd, os.path.join(workdir, "logs", f"two_trainers_{i}.log")))
        time.sleep(1.0)
    codes = []
    for proc, log in procs:
        codes.append(proc.wait(timeout=900))
        log.close()
    new = events_lib.read_events(run)[n_before:]
    saved = [e["step"] for e in new if e["event"] == "checkpoint_saved"]
    facts = [_log_facts(os.path.join(workdir, "logs", f"two_trainers_{i}.log")) for i in (0, 1)]
    row = {
        "scenario": "two_trainers",
        "exit_codes": codes,
        "refusal": facts[1]["error_line"],
        "starts": sum(e["event"] in ("started",) for e in new),
        "duplicate_saves": len(saved) - len(set(saved)),
        "tracebacks": sum(f["tracebacks"] for f in facts),
        "not_found": sum(f["not_found"] for f in facts),
        "status": status_lib.describe(status_lib.run_status(run)),
    }
    row["ok"] = (
        codes == [0, 2]
        and row["starts"] == 1
        and not row["duplicate_saves"]
        and not row["tracebacks"]
        and not row["not_found"]
        and row["status"].startswith(f"state=finished step={steps + 2 * every}")
    )
    say(f"two trainers on one run: {json.dumps(row)}", flush=True)
    return row


def _fill(mount: str) -> int:
    """Writes zeros to MOUNT/filler until the file system is full; returns the bytes."""
    written, block = 0, b"\0" * 2**20
    with open(os.path.join(mount, "filler"), "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(block)
            except OSError:
                return written


def _wait_for_save(run: str, step: int, proc: subprocess.Popen) -> bool:
    while proc.poll() is None:
        for e in events_lib.read_events(run):
            if e["event"] == "checkpoint_saved" and e["step"] >= step:
                return True
        time.sleep(0.01)
    return False


def disk_full(
    ref_dir: str, data: str, steps: int, every: int, extra: Sequence[str], workdir: str, say
) -> dict:
    row = {"scenario": "disk_full"}
    if os.geteuid() != 0:
        return row | {"skipped": "needs root to mount a small tmpfs", "ok": None}
    mount = os.path.join(workdir, "tmpfs")
    os.makedirs(mount, exist_ok=True)
    opts = f"size={TMPFS_MB}m"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", mount], capture_output=True)
    if proc.returncode:
        return row | {"skipped": f"mount failed: {proc.stderr.decode().strip()}", "ok": None}
    try:
        return row | _disk_full_on(mount, ref_dir, data, steps, every, extra, workdir, say)
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def _disk_full_on(mount, ref_dir, data, steps, every, extra, workdir, say: Callable) -> dict:
    run = os.path.join(mount, "run")
    cmd = train_command(run, data, steps, every, extra)
    log_path = os.path.join(workdir, "logs", "disk_full.log")
    proc, log = _start(cmd, log_path)
    hit = _wait_for_save(run, 2 * every, proc)
    filled = _fill(mount) if hit else 0
    code = proc.wait(timeout=900)
    log.close()
    facts = _log_facts(log_path)
    state = status_lib.run_status(run)
    out = {
        "fill_at_save_of_step": 2 * every if hit else None,
        "filled_mb": round(filled / 2**20, 1),
        "exit_code": code,
        "error_line": facts["error_line"],
        "failed_in": "precheck" if "needs about" in (facts["error_line"] or "") else "writer",
        "console_lines": facts["console_lines"],
        "tracebacks": facts["tracebacks"],
        "committed_after": committed_steps(run),
        "leftovers_after": _leftovers(run),
        "status_after": status_lib.describe(state),
    }
    os.remove(os.path.join(mount, "filler"))
    proc, log = _start(cmd, os.path.join(workdir, "logs", "disk_full_resume.log"))
    out["resume_exit_code"] = proc.wait(timeout=900)
    log.close()
    resumed = [e for e in events_lib.read_events(run) if e["event"] == "resumed"]
    out["resumed_from"] = resumed[-1]["step"] if resumed else None
    out["leftovers_after_resume"] = _leftovers(run)
    checks = verify(ref_dir, run, steps)
    out["params_bitwise_equal"] = checks["params_bitwise_equal"]
    out["data_order_equal"] = checks["data_order_equal"]
    out["ok"] = (
        code == 5
        and (facts["error_line"] or "").startswith("error: storage: no space left on device")
        and state["state"] == "failed"
        and out["resumed_from"] == (out["committed_after"] or [None])[-1]
        and out["resume_exit_code"] == 0
        and not out["leftovers_after_resume"]
        and out["params_bitwise_equal"]
        and out["data_order_equal"]
    )
    say(f"disk full during a save: {json.dumps(out)}", flush=True)
    return out


def print_writer_rows(rows: list[dict], say=print) -> None:
    say("| writer scenario | outcome | exit codes | console | after | ok |")
    say("|---|---|---|---|---|---|")
    for r in rows:
        if r.get("skipped"):
            say(f"| {r['scenario']} | skipped: {r['skipped']} | - | - | - | - |")
        elif r["scenario"] == "two_trainers":
            say(
                f"| two trainers, one run | {r['refusal']} | {r['exit_codes']} | "
                f"{r['tracebacks']} tracebacks, {r['not_found']} NOT_FOUND | "
                f"{r['starts']} start, {r['duplicate_saves']} duplicate saves; "
                f"{r['status']} | {r['ok']} |"
            )
        else:
            say(
                f"| disk full at the save of step {r['fill_at_save_of_step']} "
                f"({r['failed_in']}) | {r['error_line']} | {r['exit_code']}, then "
                f"{r['resume_exit_code']} | {r['console_lines']} lines, {r['tracebacks']} "
                f"tracebacks | committed {r['committed_after']}, {r['status_after']}; resumed "
                f"from {r['resumed_from']}, leftovers {r['leftovers_after_resume'] or 'none'}, "
                f"params equal {r['params_bitwise_equal']} | {r['ok']} |"
            )
