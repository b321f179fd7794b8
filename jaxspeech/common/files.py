"""How jaxspeech writes files: whole or not at all, and storage failures as one line.

Every file a job writes for others to read (run assets, the config, evaluation results,
export artifacts, prepared splits, LM files, progress files) goes through `atomic_write`
or `atomic_open`: the bytes go to a temporary name in the same directory, are flushed and
fsync'ed, and the temporary file is renamed over the target. A reader (or a restart after
a kill or a full disk) sees the old file or the new one, never a torn one. JSON-lines logs
that are appended to (events, metrics) write each line with one `write` call
(`append_line`), so a kill cuts at most the last line, which readers skip.

`create_exclusive` makes a file only if none exists (the run lease, `jaxspeech.runs.lease`):
the content is written under a temporary name first and linked into place, so the file is
never seen empty. Object stores (a later path layer) provide the same operations through
conditional writes.

`storage_error(exc)` recognises a storage failure (disk full, quota, read-only or missing
directory, I/O error) in an exception and its causes, including the errors tensorstore
raises under Orbax, so entry points report it as one line with exit code 5.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

from jaxspeech.common.errors import UserError

TEMP_MARK = ".tmp-"  # temporary names: ".<name>.tmp-<random>" next to the target

# errno values that mean "the storage cannot take this write" (not a bug in the caller).
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "input/output error",
    errno.EFBIG: "file too large",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a path component is not a directory",
    errno.EISDIR: "is a directory",
    errno.ENOENT: "no such file or directory",
}
# tensorstore (Orbax's array writer) reports OS errors inside ValueError messages:
# '... Failed writing: "/path/file": ... No space left on device [os_error_code='28']'.
_TS_ERRNO = re.compile(r"os_error_code='(\d+)'")
_TS_PATH = re.compile(r'(?:writing|reading|file)[:]? "([^"]+)"')
# An OSError re-raised as text by a framework (Beam's worker errors, thread pools):
# "[Errno 28] No space left on device: '/path'".
_OS_TEXT = re.compile(r"\[Errno (\d+)\] ([^:'\n]+)(?:: '([^']+)')?")


def temp_path(path: str) -> str:
    """A fresh temporary name in `path`'s directory (same file system: rename works)."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{TEMP_MARK}{uuid.uuid4().hex[:8]}")


def _fsync_dir(directory: str) -> None:
    """Makes a rename in `directory` durable (best effort: not every platform allows it)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """A file opened for writing under a temporary name; renamed over `path` when the block
    ends without an exception, removed otherwise. mode: "w" (text) or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode 'w' or 'wb', got {mode!r}")
    tmp = temp_path(path)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(path))


def atomic_write(path: str, data: bytes | str) -> None:
    """Writes `data` to `path` whole (see `atomic_open`)."""
    with atomic_open(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)


def atomic_json(path: str, value: Any, indent: int | None = 1) -> None:
    """`value` as JSON in `path`, written whole."""
    atomic_write(path, json.dumps(value, indent=indent) + "\n")


def create_exclusive(path: str, data: str) -> bool:
    """Creates `path` holding `data` if no file of that name exists; False if one does.

    The content is written and fsync'ed under a temporary name and hard-linked to `path`
    (link fails when the target exists), so the file appears complete or not at all."""
    tmp = temp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)
    _fsync_dir(os.path.dirname(path))
    return True


def append_line(f: IO[str], line: str) -> None:
    """One JSON-lines record appended with a single write (line buffered files flush it
    whole), so a kill cannot interleave or split two records."""
    f.write(line.rstrip("\n") + "\n")
    f.flush()


def remove_temporaries(directory: str) -> list[str]:
    """Deletes the temporary files a killed writer left in `directory` (not recursive);
    returns their names."""
    out = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(directory):
            if name.startswith(".") and TEMP_MARK in name:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, name))
                    out.append(name)
    return out


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def storage_error(exc: BaseException) -> str | None:
    """'<what> at <path>' when `exc` (or an exception it was raised from) is a storage
    failure: an OSError with one of STORAGE_ERRNOS, or tensorstore's report of one;
    None otherwise."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            where = e.filename or ""
            what, _, detail = (e.strerror or STORAGE_ERRNOS[e.errno]).partition(": ")
            what = what[:1].lower() + what[1:] + (f" at {where}" if where else "")
            return what + (f": {detail}" if detail else "")
        text = _OS_TEXT.search(str(e))
        if text and int(text.group(1)) in STORAGE_ERRNOS:
            what = text.group(2).strip()
            what = what[:1].lower() + what[1:]
            return what + (f" at {text.group(3)}" if text.group(3) else "")
        found = _TS_ERRNO.search(str(e))
        if found and int(found.group(1)) in STORAGE_ERRNOS:
            path = _TS_PATH.findall(str(e))
            what = STORAGE_ERRNOS[int(found.group(1))]
            return what + (f" at {path[-1]}" if path else "")
    return None


# ---------------------------------------------------------------- whole directories
def staging_dir(final: str) -> str:
    """Creates and returns a fresh hidden directory next to `final` (same file system), to
    be filled and then moved into place with `replace_dir`."""
    final = os.path.abspath(final)
    head, tail = os.path.split(final)
    os.makedirs(head, exist_ok=True)
    path = os.path.join(head, f".{tail}.staging-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


def replace_dir(staging: str, final: str) -> None:
    """Moves the complete directory `staging` to `final`, replacing (never merging with)
    what was there: a reader sees the old directory or the new one (for a moment, when one
    existed, neither)."""
    if os.path.exists(final):
        old = f"{staging}.old"
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old)
    else:
        os.rename(staging, final)
    _fsync_dir(os.path.dirname(os.path.abspath(final)))


# ---------------------------------------------------------------- paths that data names
def escape_reason(root: str, name: object) -> str | None:
    """Why the path `name`, read from a file of the directory `root` (a split's index.json,
    a tokenizer's config, a run's metadata), would reach outside `root`; None when it
    stays inside.

    A dataset or run directory may come from elsewhere, so the paths its files name are
    data, not the user's choice: only relative paths without `..` are accepted, and their
    real path (symlinks resolved, in `root` too) must lie under `root`'s real path.
    """
    if not isinstance(name, str) or not name or "\0" in name:
        return "not a file name"
    if os.path.isabs(name) or name.startswith("\\") or os.path.splitdrive(name)[0]:
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a path through '..'"
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(os.path.join(real_root, name))]) != (
        real_root
    ):
        return "a symbolic link that leads out of it"
    return None


def inside(root: str, name: object, source: str) -> str:
    """`root`/`name` for a path `name` that the file `source` (in `root` or its parent)
    names, once it is known to stay inside `root` (`escape_reason`).

    Raises:
      UserError: one line naming `source` and the entry.
    """
    reason = escape_reason(root, name)
    if reason is not None:
        raise UserError(
            f"{source} names {name!r}, {reason}: a dataset or run directory may name only "
            f"files inside {root}"
        )
    return os.path.join(root, name)
