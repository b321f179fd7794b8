"""A native crash (SIGSEGV in a compiled library, an abort) as one line naming the step.

A process cannot report its own segmentation fault: Python runs no code of ours on one.
So `supervise`, called first thing by an entry point (`python -m jaxspeech.train`), runs
the same command as a child and waits for it; in the child it returns at once. The child
dumps its Python stacks on a fatal signal (`faulthandler`) into a crash log, and notes
what it is doing (`phase`: a few bytes overwritten in place, cheap enough for every
step). When the child dies of SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT, the parent
prints

    train: crashed with signal 11 (SIGSEGV) during installing assets: pitch statistics;
    details: RUN/crash-20261129-031500.log

(one line) and exits with 128 + the signal. Any other end is passed on as it was: the
child's exit code, or death by the same signal.

The parent stays small (the standard library, no JAX) and passes signals on: SIGTERM,
SIGHUP, SIGUSR1/2, and SIGINT / SIGQUIT unless they came from the terminal, which sends
them to the child as well (its process group). If the parent is killed (SIGKILL), the
kernel kills the child too (Linux `PR_SET_PDEATHSIG`). Elsewhere than Linux the command
runs unsupervised.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ENV = "JAXSPEECH_CRASH_DIR"  # set in the child: the directory of its phase and crash log
PHASE, LOG, RUN = "phase", "crash.log", "run"
PHASE_BYTES = 240  # the phase file's fixed size: one write replaces it whole
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED += (signal.SIGUSR1, signal.SIGUSR2)
SI_KERNEL = 0x80  # siginfo code of a signal the terminal (the kernel) sent
_state: dict = {}  # the child's open phase descriptor and crash log


def supervise(tool: str, module: str) -> None:
    """In the first lines of `module`'s `__main__` block: returns in the child (or when
    unsupervised); in the parent it runs the child to its end and exits as the child did.
    Only a process started as the command (`python -m module`, or its file) is
    supervised, not one that runs the module in-process (runpy in a test)."""
    if os.environ.get(ENV):
        _arm(os.environ[ENV])
        return
    if not sys.platform.startswith("linux") or not hasattr(signal, "sigtimedwait"):
        return
    if not started_as(module):
        return
    directory = tempfile.mkdtemp(prefix=f"jaxspeech-{tool}-")
    parent = os.getpid()
    # Blocked from now on (no KeyboardInterrupt here), taken by sigtimedwait in `_wait`;
    # the child unblocks them before exec.
    signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
    child = subprocess.Popen(
        [sys.executable, *sys.orig_argv[1:]],
        env=dict(os.environ, **{ENV: directory}),
        preexec_fn=lambda: _die_with(parent),
    )
    code = _wait(child)
    if code < 0 and -code in CRASH_SIGNALS:
        where = read_phase(directory)
        print(crash_line(tool, -code, where, _keep_log(directory)), file=sys.stderr, flush=True)
        sys.exit(128 - code)
    shutil.rmtree(directory, ignore_errors=True)
    if code < 0:  # killed: die of the same signal, as the unsupervised command would
        if -code != signal.SIGKILL:  # SIGKILL takes no handler and cannot be blocked
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)


def started_as(module: str) -> bool:
    """Whether this interpreter's command line runs `module` (`-m module`) or the file of
    the __main__ module."""
    argv = sys.orig_argv
    if "-m" in argv:
        return argv[argv.index("-m") + 1 : argv.index("-m") + 2] == [module]
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return bool(main) and any(
        a.endswith(".py") and os.path.abspath(a) == os.path.abspath(main) for a in argv[1:]
    )


def _die_with(parent: int) -> None:
    """In the child before exec: SIGKILL when the parent dies, even by SIGKILL; the
    parent's blocked signals unblocked."""
    import ctypes

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*FORWARDED, signal.SIGCHLD})
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _wait(child: subprocess.Popen) -> int:
    """Waits for the child, passing signals on (see the module docstring); its return
    code (-N: killed by signal N)."""
    signals = {*FORWARDED, signal.SIGCHLD}  # blocked: received only by sigtimedwait
    while child.poll() is None:
        info = signal.sigtimedwait(signals, 1.0)
        # Only the forwarded signals go on: SIGCHLD just wakes the loop, and after this
        # process is stopped and continued (Ctrl-Z then fg, a scheduler's suspend) CPython's
        # retried sigtimedwait can return an unfilled siginfo (a garbage signal number).
        if info is None or info.si_signo not in FORWARDED:
            continue
        from_terminal = info.si_code == SI_KERNEL
        if info.si_signo in (signal.SIGINT, signal.SIGQUIT) and from_terminal:
            continue  # the child is in the terminal's process group: it got it too
        try:
            os.kill(child.pid, info.si_signo)
        except ProcessLookupError:
            pass
    return child.returncode


def crash_line(tool: str, signum: int, phase: str, log: str) -> str:
    """`train: crashed with signal 11 (SIGSEGV) during <phase>; details: <log>`."""
    name = signal.Signals(signum).name
    return f"{tool}: crashed with signal {signum} ({name}) during {phase}; details: {log}"


def read_phase(directory: str) -> str:
    try:
        with open(os.path.join(directory, PHASE), "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "start-up"


def _keep_log(directory: str) -> str:
    """The crash log's final path: moved into the run directory when the child named one
    (`note_run`), else left where it is."""
    log = os.path.join(directory, LOG)
    try:
        with open(os.path.join(directory, RUN), encoding="utf-8") as f:
            run = f.read().strip()
        target = os.path.join(run, time.strftime("crash-%Y%m%d-%H%M%S.log"))
        shutil.move(log, target)
        shutil.rmtree(directory, ignore_errors=True)
        return target
    except OSError:
        return log


# ---------------------------------------------------------------- Ctrl-C while importing
def command_name() -> str | None:
    """The command's short name: `evaluate` for `python -m jaxspeech.evaluate`, `prepare`
    for data_prep.prepare; None when this interpreter was not started as one of them."""
    argv = sys.orig_argv
    if "-m" not in argv or argv.index("-m") + 1 >= len(argv):
        return None
    module = argv[argv.index("-m") + 1]
    if not module.startswith(("jaxspeech.", "data_prep.")):
        return None
    return module.rpartition(".")[2]


def _interrupt_hook(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        print(f"{command_name()}: interrupted", file=sys.stderr, flush=True)
    else:
        sys.__excepthook__(exc_type, exc, tb)


def one_line_interrupts() -> None:
    """In a process started as one of the commands: a Ctrl-C that nothing else handles
    (while the command imports its libraries, parses flags) prints one line, not a
    traceback; Python then exits as killed by SIGINT (status 130 in a shell). Called when
    the `jaxspeech` package is imported, the first thing such a process does."""
    if command_name() is not None and sys.excepthook is sys.__excepthook__:
        sys.excepthook = _interrupt_hook


# ---------------------------------------------------------------- in the child
def _arm(directory: str) -> None:
    """Stacks of every thread to the crash log on a fatal signal; the phase file open."""
    try:
        _state["log"] = open(os.path.join(directory, LOG), "w")  # noqa: SIM115 (kept open)
        faulthandler.enable(file=_state["log"], all_threads=True)
        _state["fd"] = os.open(os.path.join(directory, PHASE), os.O_WRONLY | os.O_CREAT, 0o600)
        _state["dir"] = directory
    except OSError:
        _state.clear()  # no crash report, but the command runs


def phase(text: str) -> None:
    """What the process is doing now, for the crash line; nothing when unsupervised."""
    fd = _state.get("fd")
    if fd is not None:
        data = text.encode("utf-8", "replace")[:PHASE_BYTES]
        os.pwrite(fd, data.ljust(PHASE_BYTES), 0)


def note_run(workdir: str) -> None:
    """The run directory the crash log goes to if the process crashes. Also points
    faulthandler back at the crash log: absl's `app.run` enables it on stderr after
    parsing the flags, which would print the stacks on the console."""
    directory = _state.get("dir")
    if directory is not None:
        faulthandler.enable(file=_state["log"], all_threads=True)
        with open(os.path.join(directory, RUN), "w", encoding="utf-8") as f:
            f.write(os.path.abspath(workdir))
