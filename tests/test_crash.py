"""A native crash as one line naming the step (jaxspeech/runs/crash.py): a real command
supervised as `python -m jaxspeech.train` is, crashing with SIGSEGV in a named phase; exit
codes and signals passed on, through a stop and a continue."""

import os
import signal
import subprocess
import sys
import time

from jaxspeech.runs import crash

# A command that supervises itself as train.py does, notes its run directory and a phase,
# then crashes (a real SIGSEGV in the interpreter), exits with a code, or waits for SIGINT.
SCRIPT = """
import faulthandler, signal, sys, time
from jaxspeech.runs import crash
crash.supervise("demo", "command")
run, how = sys.argv[1], sys.argv[2]
faulthandler.enable()  # as absl's app.run does after parsing the flags: on stderr
crash.note_run(run)
crash.phase("installing assets: pitch statistics")
if how == "crash":
    faulthandler._sigsegv()
if how == "sigint":
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))
    print("waiting", flush=True)
    while not got:
        time.sleep(0.01)
    print("child got SIGINT", flush=True)
    sys.exit(7)
sys.exit(3)
"""


def _start(tmp_path, how):
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_segfault_is_one_line_naming_the_phase_with_the_stacks_in_the_run(tmp_path):
    proc = _start(tmp_path, "crash")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGSEGV, (out, err)
    (line,) = err.splitlines()  # nothing else: the stacks went to the log
    prefix = (
        "demo: crashed with signal 11 (SIGSEGV) during installing assets: pitch statistics; "
        f"details: {tmp_path}{os.sep}crash-"
    )
    assert line.startswith(prefix) and line.endswith(".log"), line
    log = open(line.split("details: ")[1]).read()
    assert "Segmentation fault" in log and "command.py" in log, log


def test_exit_codes_and_signals_pass_through(tmp_path):
    assert crash.crash_line("train", 6, "step 3", "x.log") == (
        "train: crashed with signal 6 (SIGABRT) during step 3; details: x.log"
    )
    proc = _start(tmp_path, "exit")
    assert proc.communicate(timeout=120) == ("", "") and proc.returncode == 3
    # Stopped and continued (Ctrl-Z then fg; a scheduler's suspend), the supervisor goes on
    # waiting; a SIGINT sent to the command's pid (not by the terminal) reaches the child.
    proc = _start(tmp_path, "sigint")
    assert proc.stdout.readline() == "waiting\n"
    for sig in (signal.SIGSTOP, signal.SIGCONT):
        proc.send_signal(sig)
        time.sleep(0.5)  # the stop is seen by the supervisor's wait before the next signal
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (out, err, proc.returncode) == ("child got SIGINT\n", "", 7)
    # Nothing is left in the run directory on a normal end.
    assert not [p for p in os.listdir(tmp_path) if p.startswith("crash-")]
