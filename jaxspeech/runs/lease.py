"""One writer per run directory: a lease file with its holder and a heartbeat.

A training job takes RUN/lease.json before it writes anything else in RUN, and an
evaluation watcher takes one on its output directory (RUN/eval/lease.json). The file
says who holds it:

    {"owner": "<random>", "kind": "train", "host": ..., "pid": ..., "started": t,
     "heartbeat": t, "timeout_s": s, "command": "..."}

and a thread of the holder rewrites `heartbeat` every `timeout_s / 10` seconds, so a
long compilation (which does not hold Python's lock) never makes a live holder look
stale. Another job that finds the file refuses with one line naming the holder, unless
the holder is gone:

- on the same host, its pid no longer exists (killed, crashed), or
- its heartbeat is older than `timeout_s` (a host that died, or a holder hung so long
  that it must be presumed dead; clocks of hosts sharing a file system are assumed to
  agree to well within the timeout).

A stale lease is taken over with a warning. Two jobs taking over the same stale lease
at once are serialized by a second exclusively created file (lease.json.takeover): one
wins, the other then finds a live holder and refuses. The holder releases the lease when
it ends (normally or by an exception it survives to report); a process killed outright
leaves it for the next job to take over. A holder whose lease was taken over (it was
presumed dead but was not) notices at its next heartbeat: `lost` is set, and the trainer
stops at its next step without writing more.

Multi-host jobs: process 0 takes the lease; the trainer broadcasts the outcome so every
process goes on or stops together.

A run directory on an object store keeps its lease there: an exclusive create is a PUT
with a precondition (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), a rewrite is
a PUT (atomic); the holder's pid is checked only on the same host, as for a shared disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

from jaxspeech.common import files, storage
from jaxspeech.common.errors import UserError

LEASE = "lease.json"
TAKEOVER_SUFFIX = ".takeover"
TAKEOVER_STALE_S = 30.0  # a takeover that took longer died midway


class LeaseHeld(UserError):
    """The lease is held by a live job."""


class LeaseLost(UserError):
    """Another job took over this job's lease (it presumed this one dead)."""


# ---------------------------------------------------------------- the file, anywhere
def _read(path: str) -> bytes:
    """Raises FileNotFoundError when there is no such file or object."""
    if not storage.is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    fs, key = storage.filesystem(path)
    try:
        return storage.retrying(path, lambda: fs.cat_file(key))
    except storage.StorageError as e:
        if isinstance(e.__cause__, FileNotFoundError):
            raise FileNotFoundError(path) from e
        raise


def _create(path: str, data: str) -> bool:
    """Creates `path` holding `data` unless it exists (then False)."""
    if not storage.is_remote(path):
        return files.create_exclusive(path, data)
    fs, key = storage.filesystem(path)
    try:
        storage.retrying(path, lambda: fs.pipe_file(key, data.encode(), mode="create"))
    except storage.StorageError as e:
        if isinstance(e.__cause__, FileExistsError):
            return False
        raise
    return True


def _write(path: str, data: str) -> None:
    if not storage.is_remote(path):
        return files.atomic_write(path, data)
    fs, key = storage.filesystem(path)
    storage.retrying(path, lambda: fs.pipe_file(key, data.encode()))


def _remove(path: str) -> None:
    """Removes `path`; no error when it is gone."""
    if not storage.is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    storage.remove(path)


def _age_s(path: str) -> float:
    """Seconds since `path` was last written."""
    if not storage.is_remote(path):
        return time.time() - os.path.getmtime(path)
    fs, key = storage.filesystem(path)
    modified = storage.retrying(path, lambda: fs.modified(key))
    return time.time() - modified.timestamp()


def read_lease(path: str) -> dict | None:
    """The lease at `path`, {} when the file exists but cannot be read as one (a foreign
    or damaged file), None when there is none."""
    try:
        value = json.loads(_read(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def pid_alive(pid: int) -> bool:
    """Whether a process with `pid` exists on this host and has not exited (a zombie, an
    exited process its parent has not reaped, e.g. in a container whose first process
    reaps none, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]  # the field after (comm)
        return state not in (b"Z", b"X")
    except (OSError, IndexError):  # no /proc (macOS): existing is all we know
        return True


def holder_state(lease: dict, now: float | None = None) -> tuple[bool, str]:
    """(alive, why) for the holder of `lease`: see the module docstring."""
    now = time.time() if now is None else now
    if not lease:
        return False, "the lease file is unreadable"
    age = now - float(lease.get("heartbeat", 0.0))
    timeout = float(lease.get("timeout_s", 0.0))
    if lease.get("host") == socket.gethostname() and not pid_alive(int(lease.get("pid", -1))):
        return False, f"its process {lease.get('pid')} no longer exists"
    if age > timeout:
        return False, f"its heartbeat is {age:.0f}s old (timeout {timeout:g}s)"
    return True, f"heartbeat {max(age, 0.0):.0f}s ago"


def describe_holder(lease: dict) -> str:
    """'train job pid 123 on host h, started 2026-...Z' for messages."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(lease.get("started", 0))))
    return (
        f"{lease.get('kind', '?')} job pid {lease.get('pid', '?')} on host "
        f"{lease.get('host', '?')}, started {started}"
    )


class Lease:
    """A held lease: `heartbeat()` is called by a thread until `release()`."""

    def __init__(self, path: str, kind: str, timeout_s: float, warn: Callable[[str], None]):
        if timeout_s <= 0:
            raise ValueError(f"lease timeout must be > 0 seconds, got {timeout_s}")
        self.path, self.timeout_s, self.warn = path, float(timeout_s), warn
        now = time.time()
        self.record = {
            "owner": uuid.uuid4().hex,
            "kind": kind,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": now,
            "heartbeat": now,
            "timeout_s": self.timeout_s,
            "command": " ".join(sys.argv)[:500],
        }
        self.lost: str | None = None  # why, once another job took the lease over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ taking
    def acquire(self) -> None:
        """Takes the lease (creating or taking over a stale one) or raises LeaseHeld."""
        for _ in range(20):  # each pass either succeeds, refuses, or saw the file change
            if _create(self.path, json.dumps(self.record)):
                return self._start()
            held = read_lease(self.path)
            if held is None:  # released between our create and read
                continue
            alive, why = holder_state(held)
            if alive:
                raise LeaseHeld(
                    f"{os.path.dirname(self.path) or '.'} is in use by a {describe_holder(held)} "
                    f"({why}; lease {self.path}); wait for it to end or stop it first"
                )
            if self._take_over(held, why):
                return self._start()
            time.sleep(0.05)
        raise LeaseHeld(f"could not take the lease {self.path}: it keeps changing hands")

    def _take_over(self, stale: dict, why: str) -> bool:
        """Replaces the `stale` lease with ours under the takeover lock; False when another
        job holds the lock (or the lease changed meanwhile)."""
        lock = self.path + TAKEOVER_SUFFIX
        if not _create(lock, self.record["owner"]):
            with contextlib.suppress(OSError):
                if _age_s(lock) > TAKEOVER_STALE_S:
                    _remove(lock)
            return False
        try:
            current = read_lease(self.path)
            if current is None or current.get("owner") != stale.get("owner"):
                return False
            self.record["heartbeat"] = time.time()
            _write(self.path, json.dumps(self.record))
        finally:
            _remove(lock)
        self.warn(
            f"WARNING: taking over the lease of {os.path.dirname(self.path) or '.'} from a "
            f"{describe_holder(stale)}: {why}"
        )
        return True

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ holding
    def heartbeat(self) -> None:
        """Rewrites the heartbeat, or notes that the lease was taken over."""
        current = read_lease(self.path)
        if current is None or current.get("owner") != self.record["owner"]:
            holder = describe_holder(current) if current else "nobody (the file is gone)"
            self.lost = f"the lease {self.path} is now held by {holder}"
            self._stop.set()
            return
        self.record["heartbeat"] = time.time()
        _write(self.path, json.dumps(self.record))

    def _beat(self) -> None:
        interval, failing = max(self.timeout_s / 10, 0.05), False
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
                failing = False
            # A full disk, a store out of reach: keep trying; a stale heartbeat is the risk.
            except (OSError, storage.StorageError) as e:
                if not failing:  # once per streak of failures
                    self.warn(f"WARNING: cannot renew the lease {self.path}: {e}")
                failing = True

    def check(self, step: int | None = None) -> None:
        """Raises UserError once the lease was taken over (called between steps). `step`:
        the job's progress, written with the next heartbeat (what `status` reports of a
        running job)."""
        if step is not None:
            self.record["step"] = int(step)
        if self.lost:
            raise LeaseLost(f"this job no longer holds its run directory: {self.lost}")

    def release(self) -> None:
        """Stops the heartbeat and removes the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        current = read_lease(self.path)
        if current and current.get("owner") == self.record["owner"]:
            _remove(self.path)


@contextlib.contextmanager
def hold(directory: str, kind: str, timeout_s: float, warn: Callable[[str], None] = print):
    """Holds the lease of `directory` for the block (created if missing); see the module
    docstring. Raises UserError when `directory` is not a directory, LeaseHeld when a live
    job holds it."""
    if storage.is_remote(directory):
        storage.check_bucket(directory)  # a prefix needs no creating
    elif os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory} is a file, not a directory")
    else:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the directory {directory}: {e.strerror}") from e
    lease = Lease(storage.join(directory, LEASE), kind, timeout_s, warn)
    lease.acquire()
    try:
        yield lease
    finally:
        lease.release()


def lease_state(directory: str) -> dict:
    """For `status`: {} when no lease exists, else {"holder": ..., "alive": bool, "why"},
    and "step" when the holder reported its progress (`Lease.check`)."""
    held = read_lease(storage.join(directory, LEASE))
    if held is None:
        return {}
    alive, why = holder_state(held)
    out = {"holder": f"{held.get('host', '?')}:{held.get('pid', '?')}", "alive": alive, "why": why}
    return out | ({"step": held["step"]} if isinstance(held.get("step"), int) else {})


@contextlib.contextmanager
def hold_for_job(directory: str, kind: str, timeout_s: float, warn: Callable[[str], None] = print):
    """`hold` for a multi-process job: process 0 holds the lease and every process learns
    whether it could (a collective), so all go on or all stop with the same error. Yields
    the Lease on process 0, None on the others."""
    import jax  # the lease itself needs no JAX (tests race it in bare processes)
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        with hold(directory, kind, timeout_s, warn) as held:
            yield held
        return
    with contextlib.ExitStack() as stack:
        error, held = None, None
        if jax.process_index() == 0:
            try:
                held = stack.enter_context(hold(directory, kind, timeout_s, warn))
            except UserError as e:
                error = e
        ok = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
        if not ok:
            raise error or UserError(f"process 0 could not take the lease of {directory}")
        yield held
