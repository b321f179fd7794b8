"""Run the project's CLIs as users do, from the repository root."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_module(*args, check=True, env=None, timeout=900):
    """`python -m <args>` from the repository root; one CPU device unless `env` says otherwise."""
    env = env or dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # as users run it
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{args} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
        )
    return proc
