"""What the entry points do with records the loader could not use (`data.reader`): report
each once, keep them on file per process, and stop a run whose corpus is badly damaged.

- `FaultLog`: the batches' "faults" (host-local: a process sees only its own shards)
  printed once per record and run invocation with the shard's path and the record's index,
  appended to RUN/data_faults/p<process>.jsonl, counted by shard.
- `CorruptBudget`: the global count of skipped records (summed in the train step, so every
  process sees the same number and stops at the same step) against
  `data.max_corrupt_fraction` of the split, per epoch: within an epoch every record is met
  once, so the count is of distinct records and the limit can only trip on a corpus that
  really is past it, however early in the epoch.
"""

from __future__ import annotations

import collections
import json
import os

import jax

from jaxspeech.common.errors import UserError
from jaxspeech.data.records import SplitIndex
from jaxspeech.runs import events

FAULTS_DIR = "data_faults"


class CorpusDamaged(UserError):
    """More unusable records than data.max_corrupt_fraction allows."""


def worst_shards(by_shard: dict[str, int], n: int = 5) -> str:
    """The `n` shards with the most faults, as "path (k bad), ..."."""
    top = sorted(by_shard.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{path} ({k} bad)" for path, k in top)


class FaultLog:
    """This process's unusable records: reported once each, on file, counted by shard."""

    def __init__(self, workdir: str | None, what: str = "training"):
        self.what = what
        self.by_shard: collections.Counter[str] = collections.Counter()
        self._seen: set[tuple[str, int]] = set()
        self._f = None
        if workdir is not None:
            os.makedirs(os.path.join(workdir, FAULTS_DIR), exist_ok=True)
            path = os.path.join(workdir, FAULTS_DIR, f"p{jax.process_index()}.jsonl")
            self._f = events.open_for_append(path)  # a line cut by a kill stays apart

    def add(self, faults: list[dict], step: int | None = None) -> list[dict]:
        """Notes a batch's faults; returns (and prints, from whichever process met them)
        the ones not seen before in this invocation."""
        new = []
        for f in faults:
            key = (f["shard"], int(f["index"]))
            if key in self._seen:
                continue
            self._seen.add(key)
            self.by_shard[f["shard"]] += 1
            new.append(f)
            print(
                f"skipping unreadable record {f['index']} of shard {f['shard']} "
                f"(record {f['record']} of the split; {self.what}"
                + (f" step {step}" if step is not None else "")
                + f"): {f['error']}",
                flush=True,
            )
            if self._f is not None:
                self._f.write(json.dumps({"step": step} | f) + "\n")
        return new

    @property
    def total(self) -> int:
        return sum(self.by_shard.values())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class CorruptBudget:
    """Skipped records per epoch against `max_fraction` of the split's `num_records`."""

    def __init__(self, num_records: int, max_fraction: float, split: str):
        if not 0.0 <= max_fraction <= 1.0:
            raise UserError(f"data.max_corrupt_fraction must be in [0, 1], got {max_fraction}")
        self.num_records, self.max_fraction, self.split = num_records, max_fraction, split
        self.epoch, self.count = 0, 0

    @property
    def limit(self) -> int:
        """The most skipped records an epoch may have."""
        return int(self.max_fraction * self.num_records)

    def state(self) -> dict:
        """JSON for the checkpoint: a resumed run continues the epoch's count."""
        return {"epoch": self.epoch, "count": self.count}

    def load(self, state: dict | None) -> None:
        if state:
            self.epoch, self.count = int(state["epoch"]), int(state["count"])

    def add(self, epoch: int, count: int, by_shard: dict[str, int]) -> None:
        """Adds a step's skipped records (global); raises CorpusDamaged past the limit,
        naming this process's worst shards."""
        if epoch != self.epoch:
            self.epoch, self.count = epoch, 0
        self.count += count
        if self.count > self.limit:
            raise CorpusDamaged(
                f"{self.count} of the {self.num_records} records of {self.split} could not be "
                f"read or decoded in epoch {epoch}, more than data.max_corrupt_fraction="
                f"{self.max_fraction:g} allows ({self.limit}). Worst shards read by "
                f"process {jax.process_index()}: {worst_shards(by_shard) or 'none'}. Run "
                "`python -m data_prep.verify DIR --split SPLIT` for the full report and "
                "--repair, copy the shards again, or raise the limit."
            )


class TrainingFaults:
    """A training run's handling of unusable records, step by step: this process's faults
    reported (`FaultLog`), its retried reads said, the step's global skips counted against
    the budget, and the events written."""

    def __init__(self, workdir: str, index: SplitIndex, max_fraction: float, events):
        self.workdir, self.events = workdir, events
        self.log = FaultLog(workdir)
        self.budget = CorruptBudget(index.num_records, max_fraction, index.split)

    def step(self, done: int, epoch: int, host: dict, skipped: int) -> None:
        """`host`: the batch's host values (faults, read_retries); `skipped`: the step's
        unusable records over all processes. Raises CorpusDamaged past the budget."""
        self.log.add(host["faults"], step=done)
        if host["read_retries"]:
            print(
                f"process {jax.process_index()}: {host['read_retries']} reads retried for the "
                f"batch of step {done}",
                flush=True,
            )
        if not skipped:
            return
        self.events.write("records_skipped", step=done, count=skipped)
        try:
            self.budget.add(epoch, skipped, self.log.by_shard)
        except CorpusDamaged as e:
            self.events.write("corpus_damaged", step=done, message=str(e))
            raise

    def summary(self) -> str:
        """This process's skipped records by shard ("" when none)."""
        if not self.log.total:
            return ""
        return (
            f"process {jax.process_index()} skipped {self.log.total} unreadable records: "
            f"{worst_shards(self.log.by_shard, n=20)} (details in "
            f"{os.path.join(self.workdir, FAULTS_DIR)})"
        )
