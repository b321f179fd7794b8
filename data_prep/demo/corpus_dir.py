"""The demo corpus's output directory (data_prep/demo/synth.py): what a finished or
interrupted build there was made with, checked before a build or a training run so that
two builds never mix and no run trains on a corpus of other settings."""

from __future__ import annotations

import json
import os
import shutil

INFO_FILE = "corpus_info.json"
# Written first and removed last: a directory holding it is a build of ours in progress.
PARTIAL_FILE = ".synth_demo_partial.json"

# Identity keys added after corpora were built without them, and the value such a corpus
# was built with: a corpus from before the tts_heldout split has none, as --tts_heldout 0.
IDENTITY_DEFAULTS = {"tts_heldout": 0}


def same_identity(output: str, previous: dict, identity: dict) -> None:
    """Raise FileExistsError unless `previous` (a corpus's info) was built as `identity`."""
    found = {k: previous.get(k, IDENTITY_DEFAULTS.get(k)) for k in identity}
    if found != identity:
        raise FileExistsError(
            f"--output {output} holds a synth_demo corpus built with {found}, not "
            f"{identity}; remove it or choose another directory"
        )


def check_corpus(output: str, identity: dict) -> dict:
    """--check: the info of the finished corpus in `output` if it was built as `identity`
    (what `make demo` runs before training on a corpus an earlier default made)."""
    try:
        with open(os.path.join(output, INFO_FILE)) as f:
            info = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise FileExistsError(
            f"--output {output} holds no finished synth_demo corpus ({e})"
        ) from None
    same_identity(output, info, identity)
    return info


def prepare_output(output: str, identity: dict, ours: set[str]) -> None:
    """Make `output` ready for a build, refusing to mix with anything else.

    ours: the names a build writes at the top of `output` (its splits' directories).
    An empty or missing directory is used as is. A directory holding a complete or
    interrupted build of ours with the same arguments is cleared and rebuilt. Anything
    else is an error.
    """
    if not os.path.exists(output):
        os.makedirs(output)
        return
    if not os.path.isdir(output):
        raise FileExistsError(f"--output {output} exists and is not a directory")
    entries = set(os.listdir(output))
    if not entries:
        return
    ours = ours | {INFO_FILE, PARTIAL_FILE}
    previous = None
    for name in (INFO_FILE, PARTIAL_FILE):
        if name in entries:
            try:
                with open(os.path.join(output, name)) as f:
                    previous = json.load(f)
            except (OSError, json.JSONDecodeError):
                previous = None
            break
    if previous is None or (entries - ours):
        raise FileExistsError(
            f"--output {output} is not empty and does not hold a synth_demo corpus "
            f"(found: {', '.join(sorted(entries)[:8])}); choose an empty or new directory"
        )
    same_identity(output, previous, identity)
    for name in entries:
        path = os.path.join(output, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
