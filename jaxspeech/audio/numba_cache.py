"""Numba's on-disk cache (librosa compiles its `cache=True` functions into it), made safe
for processes that compile side by side.

Numba writes each cached function as an index (`*.nbi`: signature -> data file) and data
files (`*.nbc`; a gufunc has a second pair, `guf-*`, for its wrapper, which calls the
kernel by a symbol name numbered in the order the process compiled things). Each file is
replaced whole, but nothing orders the read-index / compile / write-index+data sequence of
two processes: two processes that compile at the same moment (`make demo`'s three
`data_prep.prepare` workers importing librosa) can leave an index naming another
signature's data file, or a wrapper calling a kernel symbol the cached kernel does not
have; every later process that loads it crashes with SIGSEGV (numba issues #4807, #10128).

Two measures, installed when the `jaxspeech` package is imported (`install`), before
numba is:

- `NUMBA_CACHE_DIR` is set, unless the user set it, to a per-user directory keyed by the
  Python, numba and librosa versions and the CPU (`default_cache_dir`), not the
  installation's `__pycache__`: a cache left corrupt by an older version of this package
  is not read, and an upgrade starts a clean one.
- Every section numba runs under its process-wide compiler lock (look up the cache,
  compile on a miss, write the cache) also holds an exclusive `flock` on
  `<cache dir>/.compile.lock`, through numba's event API: across processes, one looks up
  and writes at a time, so the second process finds the first one's complete entry and
  loads it instead of compiling its own. Calls of compiled code take no lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.metadata
import os
import platform
import sys
import tempfile
import threading

LOCK_NAME = ".compile.lock"
_installed = False


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _cpu() -> str:
    """The machine and a short hash of the CPU model and feature flags (Linux), so a home
    directory shared by different hosts keeps one cache per kind of CPU."""
    text = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read(200_000).splitlines()
        text = "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def cache_key() -> str:
    """`py3.11-numba0.68.1-librosa0.11.0-x86_64-1a2b3c4d`: what a cached function depends on."""
    py = f"py{sys.version_info[0]}.{sys.version_info[1]}"
    return f"{py}-numba{_version('numba')}-librosa{_version('librosa')}-{_cpu()}"


def default_cache_dir() -> str:
    """$XDG_CACHE_HOME (or ~/.cache)/jaxspeech/numba/<cache_key>; a temporary directory
    of the user's when that cannot be created (a read-only home)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "jaxspeech", "numba", cache_key())
    try:
        os.makedirs(path, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return os.path.join(tempfile.gettempdir(), f"jaxspeech-numba-{os.getuid()}", cache_key())


class CompileLock:
    """A numba event listener for "numba:compiler_lock": the outermost hold of numba's
    compiler lock in a thread also holds an exclusive flock on `path`. Each thread opens
    its own descriptor, so another thread of this process waits for the flock as another
    process would (its numba lock acquisition comes after ours: no lock-order cycle)."""

    def __init__(self, path: str):
        self.path = path
        self._local = threading.local()

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.fd = None
            try:
                import fcntl

                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except (ImportError, OSError):
                return  # no lock file (a read-only cache, no flock): numba as it was
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by close() in on_end
            self._local.fd = fd

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth == 0 and self._local.fd is not None:
            os.close(self._local.fd)  # closing the descriptor releases its flock
            self._local.fd = None


def _install_listener() -> None:
    """Registers `CompileLock` with numba (imported by now) for its cache directory."""
    from numba.core import config, event

    class _Listener(event.Listener):
        def __init__(self, lock: CompileLock):
            self.lock = lock

        def on_start(self, e) -> None:
            self.lock.on_start(e)

        def on_end(self, e) -> None:
            self.lock.on_end(e)

    cache_dir = config.CACHE_DIR or os.environ.get("NUMBA_CACHE_DIR") or default_cache_dir()
    lock = CompileLock(os.path.join(cache_dir, LOCK_NAME))
    event.register("numba:compiler_lock", _Listener(lock))


class _AfterNumbaImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `numba` is first imported, it wraps the loader that does
    find it so the listener is installed right after numba's own import, before any module
    that imports numba defines (and compiles) a function."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "numba":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("numba")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _install_listener()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Sets NUMBA_CACHE_DIR (unless set) and the cross-process compile lock; once."""
    global _installed
    if _installed:
        return
    _installed = True
    if not os.environ.get("NUMBA_CACHE_DIR"):
        os.environ["NUMBA_CACHE_DIR"] = default_cache_dir()
    if "numba" in sys.modules:  # imported before jaxspeech: its config has the old value
        _install_listener()
    else:
        sys.meta_path.insert(0, _AfterNumbaImport())
