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


def tiny_train_args(workdir, shards, *extra) -> list[str]:
    """`jaxspeech.train` arguments for the tiny config on `shards`: a progress line every
    step, no periodic samples, no final evaluation (the faults and multi-host tests)."""
    return [
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(workdir),
        f"--config.data.dir={shards}",
        "--config.train.log_every=1",
        "--config.train.eval_at_end=False",
        "--config.monitor.samples_every=0",
        *extra,
    ]
