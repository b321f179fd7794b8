"""Run the project's CLIs as users do, from the repository root."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tests' programs are tiny and run a few steps: compiling them is most of their cost,
# and LLVM's optimization passes most of the compilation (they nearly halve the suite's
# CPU time). The results are the same programs' results to float rounding. XLA's CPU
# fusion emitters (MLIR-based, jaxlib's default) compile a program about twice as slowly
# as its older loop emitters at this optimization level (a tiny train step: 18 -> 8 s of
# compilation; the 8-device GTC step: 38 -> 15 s; a 2-core CPU VM): the tests use the
# loop emitters.
QUICK_COMPILE_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false"
)


CACHE_ENV = "JAXSPEECH_TEST_JIT_CACHE"


def compile_cache() -> str:
    """One persistent compilation cache for every process of the test session: a program
    that one test's run compiled is loaded, not compiled again, by the next run. The
    session's first process (pytest itself, which tests/conftest.py imports this into
    before pytest-xdist starts its workers) makes the directory and removes it when it
    exits; its workers and every process they start inherit its path through CACHE_ENV
    (before, each session left a directory of up to ~80 MB in the temp dir)."""
    path = os.environ.get(CACHE_ENV)
    if path is None:
        path = tempfile.mkdtemp(prefix="jaxspeech-test-jit-cache-")
        os.environ[CACHE_ENV] = path
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def cpu_env(devices: int = 1) -> dict:
    """The environment of a CPU job with `devices` devices (1: as users run it) that
    shares the session's compilation cache. A size limit turns on the cache's file lock
    (jax's LRU cache), so processes of both workers never read an entry half written."""
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=compile_cache(),
        JAX_COMPILATION_CACHE_MAX_SIZE=str(16 * 2**30),
    )
    devices_flag = f"--xla_force_host_platform_device_count={devices} " if devices > 1 else ""
    env["XLA_FLAGS"] = devices_flag + QUICK_COMPILE_FLAGS
    return env


def run_module(*args, check=True, env=None, timeout=900):
    """`python -m <args>` from the repository root; one CPU device unless `env` says otherwise."""
    env = env or cpu_env()
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


def session_overrides() -> list[str]:
    """Config overrides of every training run in the tests: the session's compilation
    cache, and no FLOP count (a second lowering of every batch shape)."""
    return [
        f"--config.train.compile_cache_dir={compile_cache()}",
        "--config.monitor.count_flops=False",
    ]


def train_args(workdir, shards, *extra) -> list[str]:
    """`jaxspeech.train` arguments for the tiny config on `shards`, with the session's
    overrides."""
    return [
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(workdir),
        f"--config.data.dir={shards}",
        *session_overrides(),
        *extra,
    ]


def tts_train_args(workdir, data, *extra) -> list[str]:
    """`jaxspeech.train` arguments for configs/tts.py:tiny (a synthesizer) on the tiny
    text-to-speech corpus `data` (tests/tts/corpus.py), with the session's overrides."""
    return [
        "--config",
        "configs/tts.py:tiny",
        "--workdir",
        str(workdir),
        f"--config.data.dir={data}",
        *session_overrides(),
        *extra,
    ]


def tiny_train_args(workdir, shards, *extra) -> list[str]:
    """`train_args` with a progress line every step, no periodic samples and no final
    evaluation (the faults and multi-host tests)."""
    return train_args(
        workdir,
        shards,
        "--config.train.log_every=1",
        "--config.train.eval_at_end=False",
        "--config.monitor.samples_every=0",
        *extra,
    )


def tiny_config(shards, *overrides: str):
    """The tiny config as `jaxspeech.train` parses `overrides`, for the trainer in this
    process: no compilation cache (the trainer would point this process's at the run)."""
    from tests.test_config_keys import TINY, parse

    return parse(
        TINY, f"--config.data.dir={shards}", "--config.train.compile_cache_dir=", *overrides
    )
