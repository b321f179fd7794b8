"""Test fixtures built once per test session for every pytest-xdist worker."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def built_once(tmp_path_factory, name: str, build: Callable[[Path], str]) -> tuple[Path, str]:
    """`build(directory)` run once per test session, whichever worker gets there first;
    returns (directory, the text `build` returned). The directory is shared by every
    pytest-xdist worker of the session (the base temporary directory's parent under
    xdist): the others wait on a file lock and reuse it, instead of building it again
    on the same 2 cores. Users must not change it (copy it first)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    where, done = base / name, base / f"{name}.done"
    with FileLock(str(base / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)  # a build that failed half way
            where.mkdir()
            done.write_text(build(where))
    return where, done.read_text()
