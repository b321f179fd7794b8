"""`python -m jaxspeech.launch_local`: pure helpers, and real 2-process jobs on 127.0.0.1."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from jaxspeech import launch_local

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = "tests.parallel.dist_worker"


# ---------------------------------------------------------------- pure helpers
def test_child_env_replaces_device_count_and_keeps_other_xla_flags():
    base = {
        "XLA_FLAGS": "--xla_cpu_a=1 --xla_force_host_platform_device_count=8 --xla_b",
        "JAX_PLATFORMS": "cuda",
        "HOME": "/home/x",
    }
    env = launch_local.child_env(base, 2)
    assert env["XLA_FLAGS"].split() == [
        "--xla_cpu_a=1",
        "--xla_b",
        "--xla_force_host_platform_device_count=2",
    ]
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["HOME"] == "/home/x"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert base["XLA_FLAGS"].endswith("=8 --xla_b")  # the input is not modified


def test_child_env_without_xla_flags():
    env = launch_local.child_env({}, 4)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    assert env["JAX_PLATFORMS"] == "cpu"


def test_child_command_appends_multihost_flags():
    cmd = launch_local.child_command("m.n", ["--config", "c.py"], "127.0.0.1:1234", 3, 2)
    assert cmd == [
        sys.executable,
        "-m",
        "m.n",
        "--config",
        "c.py",
        "--coordinator_address=127.0.0.1:1234",
        "--num_processes=3",
        "--process_id=2",
    ]


def test_child_command_puts_multihost_flags_before_a_double_dash():
    cmd = launch_local.child_command("m", ["--a=1", "--", "pos"], "h:1", 2, 0)
    assert cmd[3:] == [
        "--a=1",
        "--coordinator_address=h:1",
        "--num_processes=2",
        "--process_id=0",
        "--",
        "pos",
    ]


def test_exit_codes():
    assert launch_local.shell_code(3) == 3
    assert launch_local.shell_code(-signal.SIGKILL) == 137
    assert launch_local.launcher_exit_code([0, 0]) == 0
    assert launch_local.launcher_exit_code([0, 3, -9]) == 3
    assert launch_local.launcher_exit_code([-15, 3]) == 143
    assert launch_local.describe(-9) == "-9 (SIGKILL)"


def test_free_port_is_bindable():
    port = launch_local.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


# ---------------------------------------------------------------- real processes
def launcher_argv(*flags_, worker_args=()):
    return [sys.executable, "-m", "jaxspeech.launch_local", *flags_, "--", *worker_args]


def run_launcher(*flags_, worker_args=(), timeout=120):
    return subprocess.run(
        launcher_argv(*flags_, worker_args=worker_args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_whole_prefixed_lines(stdout):
    """Every line is a child's line with its prefix or a launcher line: none interleaved."""
    for line in stdout.splitlines():
        assert re.match(r"(\[p[01]\] |launch_local: )", line), line


def worker_pids(stdout):
    return [int(p) for p in re.findall(r"^\[p\d\] worker \d pid=(\d+)$", stdout, re.M)]


def assert_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    "flags_",
    [
        ["--num_processes=0"],
        [],  # --num_processes is required
        ["--num_processes=2", "stray"],
        ["--num_processes=2", "--config=x.py"],  # a module flag before `--`
    ],
)
def test_bad_usage_is_one_line_and_exit_2(flags_):
    proc = run_launcher(*flags_, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch_local: "), proc.stderr


def test_two_processes_allgather():
    proc = run_launcher(
        "--num_processes=2",
        "--devices_per_process=2",
        f"--module={WORKER}",
        worker_args=["--mode=ok"],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for i in range(2):
        assert f"[p{i}] worker {i} sum=1 processes=2 devices=2/4" in proc.stdout, proc.stdout
        assert f"launch_local: process {i} exited with code 0" in proc.stdout
    assert_whole_prefixed_lines(proc.stdout)
    assert proc.stderr == ""


def test_a_failing_child_ends_the_job_with_its_code():
    # Process 1 exits 3 after joining; process 0 then waits for it forever (heartbeat 100 s)
    # until the launcher kills it when the 2 s grace period is over.
    proc = run_launcher(
        "--num_processes=2",
        "--devices_per_process=2",
        f"--module={WORKER}",
        "--grace_s=2",
        worker_args=["--mode=fail"],
        timeout=60,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "launch_local: process 1 exited with code 3; waiting up to 2 s" in proc.stdout
    assert "launch_local: grace period over, killing processes [0]" in proc.stdout
    assert "launch_local: process 0 exited with code -9 (SIGKILL)" in proc.stdout
    pids = worker_pids(proc.stdout)
    assert len(pids) == 2, proc.stdout
    assert_gone(pids)


class LineReader:
    """Collects a running launcher's stdout lines in a thread; `wait_for` polls them."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, pipe):
        for line in pipe:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern, count, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(bool(re.search(pattern, ln)) for ln in self.lines) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"no {count} lines matching {pattern!r}:\n" + "\n".join(self.lines))

    def text(self):
        self._thread.join(timeout=10)
        return "\n".join(self.lines)


@pytest.mark.parametrize("mode", ["trap", "preempt", "sleep"])
def test_sigterm_reaches_every_child(tmp_path, mode):
    # trap: the children save (write a file) and exit 0, so the job succeeds.
    # preempt: JAX's preemption notifier catches it and both processes agree on the step
    # to stop at, as in a preemption drill of train.py.
    # sleep: no handler, SIGTERM kills them, and the job fails with 143.
    argv = launcher_argv(
        "--num_processes=2",
        "--devices_per_process=2",
        f"--module={WORKER}",
        worker_args=[f"--mode={mode}", f"--out_dir={tmp_path}"],
    )
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        reader = LineReader(proc)
        ready = r"^\[p\d\] worker \d pid=" if mode == "sleep" else r"^\[p\d\] worker \d ready$"
        reader.wait_for(ready, 2, timeout=60)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()  # the children follow (SIGTERM on the launcher's death)
            proc.wait()
    out = reader.text()
    assert "launch_local: got SIGTERM, forwarding it to the children" in out
    if mode == "trap":
        assert code == 0, out
        assert sorted(os.listdir(tmp_path)) == ["p0.term", "p1.term"]
        for i in range(2):
            assert f"launch_local: process {i} exited with code 0" in out
    elif mode == "preempt":
        assert code == 0, out
        steps = [(tmp_path / f"p{i}.step").read_text() for i in range(2)]
        assert steps[0] == steps[1], steps  # one agreed step on every process
    else:
        assert code == 128 + signal.SIGTERM, out
        for i in range(2):
            assert f"launch_local: process {i} exited with code -15 (SIGTERM)" in out
    assert_gone(worker_pids(out))
