"""Worker processes: a script re-run with `--worker ...` prints its answer as one JSON line.

A fresh process per measurement keeps each one's peak memory its own (train_step, losses).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any


def last_json_line(
    cmd: list[str], timeout_s: float, what: str, tail: int, cwd: str | None = None
) -> Any:
    """Runs `cmd` (in `cwd` if given) and returns the JSON of the last line it prints; a
    non-zero exit raises RuntimeError("`what` failed:" and the last `tail` characters of
    its stderr)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-tail:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
