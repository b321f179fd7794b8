"""Writing a benchmark's result: the JSON file of benchmarks/results/<name>.json (or --out)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def write_json(path: str, result: dict, *, atomic: bool = False) -> None:
    """Writes `result` to `path` as JSON (indent 1), creating its directory. `atomic`:
    through `path`.tmp renamed over `path`, so a kill mid-write leaves the old file whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    target = path + ".tmp" if atomic else path
    with open(target, "w") as f:
        json.dump(result, f, indent=1)
    if atomic:
        os.replace(target, path)


def save_result(path: str, result: dict, say: Callable[..., None] = print) -> None:
    """`write_json`, then the line `wrote PATH`."""
    write_json(path, result)
    say(f"wrote {path}")
