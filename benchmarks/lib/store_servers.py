"""Object-store servers on 127.0.0.1 for the storage tests and benchmarks, each a
subprocess reached over HTTP like the real service (no object in the test process is
mocked): moto's standalone S3 server (`moto_server`) and gcp-storage-emulator's GCS JSON
API (dev dependencies)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_env(endpoint: str, cache: str) -> dict[str, str]:
    """The variables a job needs for the server: the endpoint, a fixed key pair (moto
    accepts any), a region, and the storage cache."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "JAXSPEECH_CACHE": cache,
    }


def gcs_env(endpoint: str, cache: str) -> dict[str, str]:
    """The variables a job needs for the GCS emulator, and the storage cache."""
    return {"STORAGE_EMULATOR_HOST": endpoint, "JAXSPEECH_CACHE": cache}


@contextmanager
def s3_server(timeout_s: float = 60.0) -> Iterator[str]:
    """Starts moto's server on a free port; yields its endpoint URL; stops it."""
    with _server(["moto_server", "-H", "127.0.0.1", "-p"], timeout_s) as endpoint:
        yield endpoint


@contextmanager
def gcs_server(timeout_s: float = 60.0) -> Iterator[str]:
    """Starts gcp-storage-emulator (in memory) on a free port; yields its endpoint URL.
    It runs with the generation headers of GCS's media downloads, which tensorstore needs
    (benchmarks/lib/gcs_emulator.py)."""
    args = [sys.executable, "-m", "benchmarks.lib.gcs_emulator", "start", "--in-memory"]
    with _server([*args, "--host", "127.0.0.1", "--port"], timeout_s) as endpoint:
        yield endpoint


@contextmanager
def _server(command: list[str], timeout_s: float) -> Iterator[str]:
    """Runs ``command`` (a program of the venv, or a path) with a free port appended, from
    the repository root, until the server answers HTTP; yields its endpoint; stops it."""
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), command[0])
    proc = subprocess.Popen(
        [exe, *command[1:], str(port)],
        cwd=_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).read()
                break
            except urllib.error.HTTPError:  # an answer: the server is up
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not start on {endpoint}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)
