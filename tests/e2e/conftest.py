"""Shared by the end-to-end tests: one tiny synthetic corpus per session."""

import pytest

from tests.e2e.cli import run_module


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    raw, shards = root / "raw", root / "shards"
    run_module("data_prep.synth_demo", "--output", str(raw), "--hours", "0.06", "--seed", "1")
    for split in ("train", "dev", "test"):
        run_module(
            "data_prep.prepare",
            "--format",
            "manifest",
            "--input",
            str(raw / split / "manifest.jsonl"),
            "--output",
            str(shards),
            "--split",
            split,
            "--tokenizer",
            "char",
            "--direct_running_mode=in_memory",  # one process: quickest for a tiny corpus
            "--direct_num_workers=1",
        )
    return root, shards
