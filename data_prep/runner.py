"""The Beam runner of the data_prep CLIs (prepare, verify): options from the pass-through
flags, with the DirectRunner turned into the FnApiRunner on every CPU, and Beam's routine
console lines kept off stderr unless the CLI's `--verbose` asks for them."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
)


def pipeline_options(beam_args: list[str]) -> tuple[PipelineOptions, Any]:
    """Beam options from the pass-through flags, and the runner object to use (or None).

    DirectRunner (the default) becomes the FnApiRunner in multi_processing mode with one
    worker per CPU unless the flags say otherwise; other runners are left untouched.
    """
    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    runner_name = standard.runner or "DirectRunner"
    if runner_name not in ("DirectRunner", "SwitchingDirectRunner"):
        return options, None
    standard.runner = runner_name
    direct = options.view_as(DirectOptions)

    def given(flag: str) -> bool:
        return any(a == f"--{flag}" or a.startswith(f"--{flag}=") for a in beam_args)

    if not given("direct_running_mode"):
        direct.direct_running_mode = "multi_processing"
    if not given("direct_num_workers"):
        direct.direct_num_workers = os.cpu_count() or 1
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    return options, fn_runner.FnApiRunner()


# ---------------------------------------------------------------- console noise
# Lines Beam prints on every normal run: its workers' INFO log (`INFO:<logger>:...`, the
# format of the root handler the first warning below installs in each worker), a warning
# at import about an optional BigQuery client, and the workers' note that they have no
# staging directory (relayed once more by the main process).
BEAM_NOISE = (
    re.compile(rb"^(INFO|DEBUG):"),
    re.compile(rb"apitools not found, and bigquery client libraries are not available"),
    re.compile(rb"No semi_persistent_directory found"),
)


@contextlib.contextmanager
def quiet_beam_output(enabled: bool = True) -> Iterator[None]:
    """While the pipeline runs, drop `BEAM_NOISE` lines from this process's stderr and
    its worker processes' (`--verbose` keeps them: `enabled=False`). The workers are
    Beam's own subprocesses writing to the stderr they inherit, and their log levels
    cannot be set from the pipeline options, so the filter sits on file descriptor 2: a
    pipe whose lines are forwarded to the real stderr unless they match. Every other
    line (errors, tracebacks, this program's messages) passes unchanged."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    pump = threading.Thread(target=_forward, args=(read_end, saved), daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # our last copy of the pipe's write end: the pump sees its end
        pump.join(timeout=30)  # unless a worker still holds it: then the pump goes on
        if not pump.is_alive():
            os.close(saved)


def _forward(read_end: int, out: int) -> None:
    with os.fdopen(read_end, "rb") as pipe:
        for line in pipe:
            while line and not any(p.search(line) for p in BEAM_NOISE):
                line = line[os.write(out, line) :]
