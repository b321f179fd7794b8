"""An export's output directory: what the exports (recognizer, synthesizer, vocoder) may
replace there, and how they move a finished artifact into place.

`--output DIR` is the user's. An export replaces DIR only when DIR is new, empty, or an
earlier export: a `manifest.json` that carries our mark (`ARTIFACT`) and lists every file
it wrote ("files", paths relative to DIR), with nothing else beside them. A directory
holding anything else (a file named manifest.json that is not ours, an extra file next
to an earlier export, a symlink) is refused before any work, naming what is in the way;
the user moves it or chooses another directory. When the new artifact is moved in, only
the files the earlier manifest lists are deleted: a file that appears meanwhile is kept
(and named), never removed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

from jaxspeech.common import files
from jaxspeech.common.errors import UserError

MANIFEST = "manifest.json"
ARTIFACT = "jaxspeech-export"  # the manifest's "artifact": written by an export
_SHOWN = 5  # foreign entries named in the refusal (then a count)


def _entries(directory: str) -> tuple[list[str], list[str]]:
    """(files, directories) under `directory`, as sorted paths relative to it. A symlink
    (to a file or a directory) is an entry of the first list: never followed."""
    found, dirs = [], []
    for path, subdirs, names in os.walk(directory):
        rel = os.path.relpath(path, directory)
        for name in subdirs + names:
            full, relname = os.path.join(path, name), os.path.normpath(os.path.join(rel, name))
            (dirs if name in subdirs and not os.path.islink(full) else found).append(relname)
    return sorted(found), sorted(dirs)


def _listed(output: str) -> list[str] | None:
    """The files the export manifest in `output` lists (itself included), or None when
    `output` holds no manifest of ours (missing, unreadable, without our mark, or listing
    a path outside `output`)."""
    try:
        with open(os.path.join(output, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("artifact") != ARTIFACT:
        return None
    listed = manifest.get("files")
    if not isinstance(listed, list):
        return None
    if any(files.escape_reason(output, name) for name in listed):
        return None
    return [os.path.normpath(name) for name in listed] + [MANIFEST]


def foreign_entries(output: str) -> tuple[list[str], bool]:
    """(what in `output` no export wrote, whether it holds a manifest of ours): the files,
    symlinks and directories the manifest does not list (everything, without one)."""
    found, dirs = _entries(output)
    listed = _listed(output)
    if listed is None:
        return found + dirs, False
    mine = set(listed)
    parents = {p for name in mine for p in _ancestors(name)}
    return [f for f in found if f not in mine] + [d for d in dirs if d not in parents], True


def _ancestors(path: str) -> list[str]:
    """The directories above the relative `path`: "a/b/c" -> ["a/b", "a", ""]."""
    out = []
    while path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def check_output(output: str) -> None:
    """`output` is a new or empty directory, or an earlier export with nothing beside it:
    an export may replace it.

    Raises:
      UserError: `output` is a file, or holds files no export wrote (named).
    """
    if os.path.exists(output) and not os.path.isdir(output):
        raise UserError(f"--output {output} is a file, not a directory")
    if not os.path.isdir(output):
        return
    foreign, ours = foreign_entries(output)
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (
            f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
        )
        what = "files the earlier export there did not write" if ours else "files no export wrote"
        raise UserError(
            f"--output {output} holds {what}: {shown}; an export replaces only a new, empty "
            "or earlier export's directory: move them, or choose another --output"
        )


def publish(stage: str, output: str, manifest: dict) -> None:
    """Writes `manifest` (marked ours, listing every file of the filled staging directory
    `stage`, made by `files.staging_dir(output)`) into `stage` and moves `stage` into place
    at `output`, deleting of an earlier export only the files its manifest lists.

    Raises:
      UserError: `output` gained foreign files since `check_output` (nothing replaced),
        or files that appeared during the swap were kept aside (named, with where).
    """
    manifest["artifact"] = ARTIFACT
    manifest["files"] = _entries(stage)[0] + [MANIFEST]
    files.atomic_write(os.path.join(stage, MANIFEST), json.dumps(manifest, indent=1, default=str))
    old = None
    if os.path.lexists(output):
        check_output(output)  # again, just before the swap: the export took a while
        listed = _listed(output) or []
        old = f"{stage}.old"
        os.rename(output, old)
    files.replace_dir(stage, output)  # nothing is at `output` now: a rename
    if old is not None:
        _remove_listed(old, listed, output)


def write_and_publish(output: str, write: Callable[[str], dict]) -> dict:
    """Runs `write(stage)` (an export writing its files into a fresh staging directory
    beside `output`, `files.staging_dir`, and returning the manifest), then `publish`es the
    stage as `output`; returns the manifest. A failure (a full disk, an error, a kill)
    removes the stage: `output` keeps the previous export (or nothing), never half of one.
    """
    stage = files.staging_dir(output)
    try:
        manifest = write(stage)
        publish(stage, output, manifest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return manifest


def _remove_listed(old: str, listed: list[str], output: str) -> None:
    """Deletes the `listed` files of the earlier export moved to `old`, then its emptied
    directories; anything else stays (named in a UserError)."""
    for name in listed:
        try:
            os.remove(os.path.join(old, name))  # a symlink itself, never what it leads to
        except (FileNotFoundError, IsADirectoryError):
            pass
    left, dirs = _entries(old)
    for d in sorted(dirs, key=len, reverse=True) + [""]:
        try:
            os.rmdir(os.path.join(old, d))  # only when empty
        except OSError:
            pass
    if left:
        raise UserError(
            f"exported to {output}; files that appeared in it during the export were kept "
            f"in {old}: {', '.join(left[:_SHOWN])}"
        )
