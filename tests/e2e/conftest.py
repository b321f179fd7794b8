"""Shared by the end-to-end tests: one tiny synthetic corpus and one finished tiny run per
test session, built once for all pytest-xdist workers."""

import os
import shutil
from pathlib import Path

import pytest
import s3fs

from benchmarks.lib.store_servers import s3_env, s3_server
from jaxspeech.common import storage
from tests.e2e.cli import run_module, train_args
from tests.sharing import built_once

BUCKET = "jaxspeech-data"  # the S3 server's bucket (the `store` fixture)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """(root, shards): the 0.06 h synthetic corpus prepared into train/dev/test shards.
    Tests write their own runs under `root`, each under a name of its own."""
    root, _ = built_once(tmp_path_factory, "e2e", _build_corpus)
    return root, root / "shards"


def _build_corpus(root: Path) -> str:
    raw, shards = root / "raw", root / "shards"
    # No text-to-speech split: these tests prepare and train recognizers only.
    synth = ("--output", str(raw), "--hours", "0.06", "--seed", "1", "--tts_heldout", "0")
    run_module("data_prep.demo.synth", *synth)
    # `python -m data_prep.prepare`'s work, in this process: the same shards without a
    # start-up of 2-3 s of CPU a split (tests/test_colabs.py runs the command line).
    from data_prep import prepare

    for split in ("train", "dev", "test"):
        prepare.prepare(
            [
                "prepare",
                *("--format", "manifest", "--input", str(raw / split / "manifest.jsonl")),
                *("--output", str(shards), "--split", split, "--tokenizer", "char"),
                "--direct_running_mode=in_memory",  # one process: quickest for a tiny corpus
                "--direct_num_workers=1",
            ]
        )
    return ""


@pytest.fixture(scope="session")
def tiny_run(corpus, tmp_path_factory):
    """One finished tiny run (8 steps, checkpoints 4 and 8, evaluated on dev and test at
    the end),
    shared by the resume, evaluation and fault tests; they copy it before changing it.
    Returns (run directory, the run's console output)."""
    _, shards = corpus

    def build(workdir: Path) -> str:
        # Evaluated on both held-out splits at the end: the in-loop multi-split path.
        args = train_args(workdir, shards, "--config.data.eval_split=dev,test")
        return run_module("jaxspeech.train", *args).stdout

    return built_once(tmp_path_factory, "tiny", build)


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    """A private copy of the shared finished run, free to corrupt or extend."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run[0], run)
    return run


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real S3 server on 127.0.0.1 (moto's, benchmarks/lib/store_servers.py) for one test
    module: (s3://BUCKET, the environment of a job that uses it); the variables are set in
    this process too while the module's tests run."""
    cache = tmp_path_factory.mktemp("store-cache")
    with s3_server() as endpoint:
        env = s3_env(endpoint, str(cache))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            # fsspec reuses one client per set of options, which would still be talking to
            # an earlier module's server (the endpoint comes from the environment).
            s3fs.S3FileSystem.clear_instance_cache()
            fs, _ = storage.filesystem(f"s3://{BUCKET}")
            fs.mkdir(BUCKET)
            yield f"s3://{BUCKET}", env
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
