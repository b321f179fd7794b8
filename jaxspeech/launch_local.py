r"""Launch N processes of one module on this machine as one `jax.distributed` job.

    python -m jaxspeech.launch_local --num_processes 2 [--devices_per_process 4] \
        [--module jaxspeech.train] [--port 0] [--grace_s 30] -- --config configs/demo.py ...

Each child runs `python -m MODULE ARGS --coordinator_address=127.0.0.1:PORT
--num_processes=N --process_id=i` on JAX_PLATFORMS=cpu with `devices_per_process`
simulated CPU devices: a real multi-host job (gloo collectives over 127.0.0.1) on one box,
for development, tests and preemption drills. Every line a child prints comes out here
prefixed with `[p<i>] `. SIGINT/SIGTERM are forwarded to every child (a second one kills
them). If a child fails, the others get --grace_s seconds to stop on their own (a dead
peer makes them fail once the heartbeat times out), then are killed; the exit code is the
first failure's (128+N for a child killed by signal N), or 0 when all succeed.

absl flags, as everywhere in the project; only the arguments before `--` are parsed as the
launcher's, everything after it reaches the children verbatim.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO

from absl import app, flags

_POLL_S = 0.05  # how often the supervisor looks at the children
_FORWARDED = (signal.SIGINT, signal.SIGTERM)


# ---------------------------------------------------------------- pure helpers
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (bind to port 0, read it, close).

    Another program may take it before the coordinator binds it; on a dev box that race
    is rare, and a failed bind makes process 0 fail loudly, never hang.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def child_command(
    module: str, args: Sequence[str], address: str, num_processes: int, process_id: int
) -> list[str]:
    """argv of child `process_id`: this interpreter running `module` with `args` and the
    three multi-host flags `jaxspeech.parallel.mesh.initialize` reads, appended after the
    module's flags (before a `--` in `args`, where absl would stop parsing)."""
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    multihost = [
        f"--coordinator_address={address}",
        f"--num_processes={num_processes}",
        f"--process_id={process_id}",
    ]
    return [sys.executable, "-m", module, *args[:end], *multihost, *args[end:]]


_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count(=\S*)?")


def child_env(base_env: Mapping[str, str], devices: int) -> dict[str, str]:
    """A child's environment: `base_env` on the CPU platform with `devices` simulated
    devices (an inherited device-count XLA flag is replaced, other XLA flags are kept)
    and unbuffered Python output, so lines reach the launcher as they are printed."""
    env = dict(base_env)
    others = _DEVICE_COUNT_FLAG.sub("", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*others, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def shell_code(returncode: int) -> int:
    """A Popen return code as a shell exit status: killed by signal N (-N) -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    """`3`, or `-9 (SIGKILL)` for a child killed by a signal."""
    if returncode >= 0:
        return str(returncode)
    try:
        return f"{returncode} ({signal.Signals(-returncode).name})"
    except ValueError:
        return str(returncode)


def launcher_exit_code(codes_in_exit_order: Sequence[int]) -> int:
    """The first non-zero child code (as a shell status), else 0."""
    return next((shell_code(c) for c in codes_in_exit_order if c != 0), 0)


# ---------------------------------------------------------------- processes
_print_lock = threading.Lock()


def say(line: str, stream: IO[str] | None = None) -> None:
    """Write one whole line (never interleaved with a child's line) and flush.

    If our output is gone (`... | head`), lines are dropped: the readers keep draining
    the children's pipes, so no child ever blocks on a full pipe.
    """
    stream = stream or sys.stdout
    with _print_lock:
        try:
            stream.write(line if line.endswith("\n") else line + "\n")
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass


def forward_output(index: int, pipe: IO[bytes]) -> None:
    """Copy one of a child's streams to our stdout, line by line, prefixed `[p<index>] `."""
    prefix = f"[p{index}] "
    with pipe:
        for raw in iter(pipe.readline, b""):
            say(prefix + raw.decode("utf-8", errors="replace").rstrip("\r\n"))


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the launcher dies, even by SIGKILL,
    so an abruptly killed launcher leaves no orphaned job behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_children(commands: Sequence[Sequence[str]], env: Mapping[str, str]) -> list:
    """Start every command (its own process group) and a reader thread per stream of each
    child; returns [(Popen, [Thread, Thread])]. All forks happen before any reader thread
    exists, which keeps `preexec_fn` safe.

    stdout and stderr are separate pipes: in one shared pipe a line that C++ code writes
    to stderr (Gloo's connection messages) can land in the middle of a Python print to
    stdout, and a prefixed line would then hold pieces of both."""
    linux = sys.platform.startswith("linux")
    procs = [
        subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Own process group: a terminal's Ctrl-C reaches only the launcher, which
            # forwards it once (not twice), and SIGKILL can take a child's workers along.
            process_group=0,
            preexec_fn=_die_with_parent if linux else None,
        )
        for cmd in commands
    ]
    threads = [
        [
            threading.Thread(target=forward_output, args=(i, pipe), daemon=True)
            for pipe in (p.stdout, p.stderr)
        ]
        for i, p in enumerate(procs)
    ]
    for t in (t for pair in threads for t in pair):
        t.start()
    return list(zip(procs, threads))


def _signal_running(procs: Sequence[subprocess.Popen], sig: int, group: bool = False) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig) if group else p.send_signal(sig)
            except ProcessLookupError:
                pass


def supervise(
    procs: Sequence[subprocess.Popen], grace_s: float, pending_signals: list[int]
) -> list[int]:
    """Wait for every child; returns the indices of the children in the order they exited.

    Signals the handler appended to `pending_signals`: the first is forwarded to every
    running child, a later one SIGKILLs them. After the first non-zero exit the others
    get `grace_s` seconds, then are SIGKILLed with their process groups.
    """
    order: list[int] = []
    forwarded = False
    deadline = None
    while len(order) < len(procs):
        while pending_signals:
            sig = pending_signals.pop(0)
            name = signal.Signals(sig).name
            if not forwarded:
                say(f"launch_local: got {name}, forwarding it to the children")
                _signal_running(procs, sig)
                forwarded = True
            else:
                say(f"launch_local: got {name} while stopping, killing the children")
                _signal_running(procs, signal.SIGKILL, group=True)
                deadline = float("inf")  # all killed: no grace period to announce
        for i, p in enumerate(procs):
            if i not in order and p.poll() is not None:
                order.append(i)
                if p.returncode != 0 and deadline is None and len(order) < len(procs):
                    deadline = time.monotonic() + grace_s
                    say(
                        f"launch_local: process {i} exited with code {describe(p.returncode)}; "
                        f"waiting up to {grace_s:g} s for the others"
                    )
        if deadline is not None and time.monotonic() >= deadline and len(order) < len(procs):
            left = [i for i in range(len(procs)) if i not in order]
            say(f"launch_local: grace period over, killing processes {left}")
            _signal_running(procs, signal.SIGKILL, group=True)
            deadline = float("inf")  # kill once; the loop then collects them
        time.sleep(_POLL_S)
    return order


# ---------------------------------------------------------------- main
def run_job(
    module: str,
    args: Sequence[str],
    num_processes: int,
    devices_per_process: int,
    port: int,
    grace_s: float,
) -> int:
    """Start the job, forward signals and output, wait; returns the launcher's exit code."""
    address = f"127.0.0.1:{port or free_port()}"
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda sig, _frame: pending.append(sig)) for s in _FORWARDED}
    try:
        say(
            f"launch_local: {num_processes} x `python -m {module}` with {devices_per_process} "
            f"CPU devices each, coordinator {address}"
        )
        env = child_env(os.environ, devices_per_process)
        commands = [
            child_command(module, args, address, num_processes, i) for i in range(num_processes)
        ]
        children = start_children(commands, env)
        procs = [p for p, _ in children]
        order = supervise(procs, grace_s, pending)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for _, pair in children:
        for thread in pair:  # a grandchild still holding a pipe must not keep us waiting
            thread.join(timeout=5)
    for i, p in enumerate(procs):
        say(f"launch_local: process {i} exited with code {describe(p.returncode)}")
    return launcher_exit_code([procs[i].returncode for i in order])


def define_flags() -> None:
    """The launcher's flags, defined only when it runs as a program: `--num_processes`
    also names one of the children's multi-host flags (`jaxspeech.parallel.mesh.
    define_flags`), and one process importing both modules must not define it twice."""
    flags.DEFINE_integer("num_processes", None, "Processes to start (>= 1).", lower_bound=1)
    flags.DEFINE_integer(
        "devices_per_process",
        4,
        "Simulated CPU devices in each process (4: the project's multi-host test layout).",
        lower_bound=1,
    )
    flags.DEFINE_string(
        "module", "jaxspeech.train", "Python module every child runs with `python -m`."
    )
    flags.DEFINE_integer(
        "port",
        0,
        "Coordinator port on 127.0.0.1; 0 picks a free one.",
        lower_bound=0,
        upper_bound=65535,
    )
    flags.DEFINE_float(
        "grace_s",
        30.0,
        "After a child fails, seconds the others get to stop on their own before SIGKILL "
        "(they fail by themselves once the JAX heartbeat notices the dead peer).",
        lower_bound=0.0,
    )


def main(argv: Sequence[str]) -> int:
    f = flags.FLAGS
    return run_job(
        module=f.module,
        args=argv[1:],
        num_processes=f.num_processes,
        devices_per_process=f.devices_per_process,
        port=f.port,
        grace_s=f.grace_s,
    )


USAGE = (
    "usage: python -m jaxspeech.launch_local --num_processes N [--devices_per_process D] "
    "[--module M] [--port P] [--grace_s S] -- [ARGS for the module...]"
)


def parse_flags(argv: list[str]) -> list[str]:
    """absl parses the launcher's flags (everything before the first `--`); what follows
    `--` goes to the children verbatim. A usage mistake is one line on stderr, exit 2;
    `--help` before `--` is the launcher's (`jaxspeech.common.cli.exit_if_help`), exit 0."""
    split = argv.index("--") if "--" in argv else len(argv)
    if set(argv[1:split]) & {"-h", "--help", "-?", "--helpshort", "--helpfull"}:
        from jaxspeech.common import cli  # only for help: the launcher itself needs no JAX

        cli.exit_if_help(argv[:split])
    try:
        stray = flags.FLAGS(argv[:split])[1:]
        if stray:
            raise flags.Error(f"unexpected argument {stray[0]!r} before `--`")
    except flags.Error as e:
        say(f"launch_local: {e}; the module's own flags go after `--`. {USAGE}", sys.stderr)
        sys.exit(2)
    return [argv[0], *argv[split + 1 :]]


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("num_processes")
    app.run(main, flags_parser=parse_flags)
