"""The corpus of the chaos runs: synthesized, damaged on purpose, and what a run skipped.

Without prepared shards the tiny corpus of tests/e2e/conftest.py is synthesized and
prepared (0.06 h, char tokenizer); `damage_corpus` inverts bytes in a copy's largest train
shard, and a run's `records_skipped` events and RUN/data_faults/p0.jsonl say which
unreadable records it skipped. Used by benchmarks/chaos.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from benchmarks.lib import ROOT
from benchmarks.lib.trainer_process import trainer_env


def make_corpus(root: str) -> str:
    """Synthesize and prepare the tiny corpus of tests/e2e/conftest.py under `root`."""
    raw, shards = os.path.join(root, "raw"), os.path.join(root, "shards")

    def module(*args):
        proc = subprocess.run(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=trainer_env(),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")

    # As tests/e2e: no text-to-speech split (the chaos runs train a recognizer).
    synth = ("--output", raw, "--hours", "0.06", "--seed", "1", "--tts_heldout", "0")
    module("data_prep.demo.synth", *synth)
    for split in ("train", "dev", "test"):
        module(
            "data_prep.prepare",
            "--format",
            "manifest",
            "--input",
            os.path.join(raw, split, "manifest.jsonl"),
            "--output",
            shards,
            "--split",
            split,
            "--tokenizer",
            "char",
            "--direct_running_mode=in_memory",
            "--direct_num_workers=1",
        )
    return shards


def damage_corpus(data: str, dest: str, places: int) -> str:
    """A copy of the prepared corpus `data` at `dest` whose largest train shard has 64
    bytes inverted at `places` points spread evenly over its first 90% (its index and
    footer at the end stay readable). Returns `dest`."""
    shutil.copytree(data, dest)
    split = os.path.join(dest, "train")
    shards = [os.path.join(split, n) for n in os.listdir(split) if n.endswith(".array_record")]
    path = max(shards, key=os.path.getsize)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for k in range(places):
            at = int(0.9 * size * (k + 1) / (places + 1))
            f.seek(at)
            chunk = f.read(64)
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in chunk))
    return dest


def skipped_by_step(workdir: str) -> dict[int, int]:
    """{step: unreadable records skipped} from a run's `records_skipped` events (a step
    replayed after a kill: its last event)."""
    from jaxspeech.runs.events import read_events

    return {e["step"]: e["count"] for e in read_events(workdir) if e["event"] == "records_skipped"}


def faulty_records(workdir: str) -> list[tuple[str, int]]:
    """(shard file name, record index) of every record RUN/data_faults/p0.jsonl reports."""
    path = os.path.join(workdir, "data_faults", "p0.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a SIGKILL
                continue
    return sorted({(os.path.basename(r["shard"]), r["index"]) for r in rows})
