"""Numba's on-disk cache under processes that compile side by side
(jaxspeech/audio/numba_cache.py)."""

import os
import subprocess
import sys
import time

import numba
import pytest

from jaxspeech.audio import numba_cache

# A gufunc like librosa's localmin (explicit signatures, cache=True: compiled and cached
# when its module is imported), in a module of its own so that its cache is the test's.
KERNEL = """
import numba


@numba.guvectorize(
    ["void(float32[:], boolean[:])", "void(float64[:], boolean[:])"],
    "(n)->(n)",
    cache=True,
    nopython=True,
)
def localmin(x, y):
    y[0] = False
    y[-1] = False
    for i in range(1, x.shape[0] - 1):
        y[i] = x[i] < x[i - 1] and x[i] <= x[i + 1]
"""

# Each child imports jaxspeech (which installs the cache setup), waits at a barrier so
# that both reach the compile at the same moment, then imports (compiles or loads) the
# kernel and runs it on both signatures.
CHILD = """
import os, sys, time
import jaxspeech  # noqa: F401
import numpy as np
here, me = sys.argv[1], sys.argv[2]
open(os.path.join(here, "ready-" + me), "w").close()
deadline = time.time() + 300
while not os.path.exists(os.path.join(here, "go")) and time.time() < deadline:
    time.sleep(0.01)
sys.path.insert(0, here)
import kern
for dtype in (np.float32, np.float64):
    print("result", kern.localmin(np.array([3, 1, 2, 0, 5], dtype)).astype(int).tolist())
"""


def test_cache_key_names_the_versions_and_the_cpu():
    key = numba_cache.cache_key()
    assert key.startswith(
        f"py{sys.version_info[0]}.{sys.version_info[1]}-numba{numba.__version__}-"
    )
    import librosa

    assert f"-librosa{librosa.__version__}-" in key


def test_default_cache_dir_is_per_user_and_per_version(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = numba_cache.default_cache_dir()
    assert path == os.path.join(str(tmp_path), "jaxspeech", "numba", numba_cache.cache_key())
    assert os.path.isdir(path)


def test_two_processes_compiling_at_once_leave_one_complete_cache(tmp_path):
    """Both reach the compile at once; the lock lets one look up, compile and write each
    entry while the other waits, then loads it: each file is written exactly once
    (without the lock both miss, both compile and both write every file, the race that
    corrupted `make demo`'s cache). A NUMBA_CACHE_DIR the user set is where it goes."""
    (tmp_path / "kern.py").write_text(KERNEL)
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), NUMBA_DEBUG_CACHE="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):
        if any(p.poll() is not None for p in procs):
            pytest.fail("a child ended early:\n" + "\n".join(p.communicate()[0] for p in procs))
        time.sleep(0.02)
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out in outs:
        results = [ln for ln in out.splitlines() if ln.startswith("result")]
        assert results == ["result [0, 1, 0, 1, 0]"] * 2, out
    saves = [ln for out in outs for ln in out.splitlines() if "data saved to" in ln]
    # Two signatures, each a kernel and a gufunc wrapper: four data files, each written
    # once (by whichever process took the lock first for it) and loaded by the other.
    assert len(saves) == len(set(saves)) == 4, outs
    loads = [ln for out in outs for ln in out.splitlines() if "data loaded from" in ln]
    assert len(loads) == 4, outs
    assert (cache / numba_cache.LOCK_NAME).exists()
