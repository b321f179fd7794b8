"""Test-wide setup: 8 CPU devices, so sharding tests run on a simulated mesh, XLA's
CPU backend without its expensive LLVM optimizations, and one bytecode cache for every
Python interpreter of the session."""

import os
import tempfile

# The session starts many Python interpreters (each CLI run, each process of a
# multi-process job, the notebooks' kernels, the ONNX converter; the xdist workers):
# without bytecode (uv installs none, and PYTHONDONTWRITEBYTECODE, set in some
# environments, keeps Python from writing it) every one of them compiles the source of
# jax, flax, orbax... again: about 2.7 s of CPU of the 4.7 s that `import jaxspeech.train`
# takes. Compiled once into a cache outside the repository and the virtualenvs instead
# (written atomically, checked against each source's mtime and size as any .pyc is).
# Set here, before pytest-xdist starts its workers, so that they and every process they
# start inherit it.
os.environ.setdefault(
    "PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "jaxspeech-test-pycache")
)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from tests.e2e.cli import QUICK_COMPILE_FLAGS, compile_cache  # noqa: E402

# Must happen before jax initializes its backend (i.e. before any test imports jax).
os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags = f"{_flags} --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags = f"{_flags} {QUICK_COMPILE_FLAGS}"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402

from jaxspeech.serving import staging  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# The tests' own programs go to the session's persistent compilation cache too (the one
# their CLI runs share, tests/e2e/cli.py): many tests build the same tiny models and
# steps afresh, and jit's in-memory cache is keyed by the Python function, the persistent
# one by the program, so a program another test (or the other worker) compiled is loaded
# instead (about 6% of the CPU time of tests/models + decoding + losses). The size limit
# turns on the cache's file lock, as in cli.cpu_env; compilations under 0.2 s are not
# worth a file.
jax.config.update("jax_compilation_cache_dir", compile_cache())
jax.config.update("jax_compilation_cache_max_size", 16 * 2**30)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


def onnx_converter() -> str:
    """The ONNX converter's python (`make install-onnx`). Missing: the test is skipped,
    or fails under `make test` (JAXSPEECH_REQUIRE_ONNX=1), where it must run."""
    import pytest

    path = staging.default_onnx_python()
    if not os.path.exists(path):
        message = f"the ONNX converter's environment is missing ({path}): make install-onnx"
        if os.environ.get("JAXSPEECH_REQUIRE_ONNX"):
            pytest.fail(message)
        pytest.skip(message)
    return path
