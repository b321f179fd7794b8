"""The Beam runner of the data_prep CLIs (prepare, verify): options from the pass-through
flags, with the DirectRunner turned into the FnApiRunner on every CPU."""

from __future__ import annotations

import os
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
