"""Reading shard records so that a bad disk, an interrupted copy or a flaky mount cannot
kill or loop a run.

- `check_shards`: before any work, every shard a process will read must exist, open and
  hold the number of records the split index says; else one `ShardError` naming it.
- `RecordReader`: reads records by position over a list of shards. A record that cannot
  be read is returned as None with a `Fault` (shard path, record index, the reader's
  message), never an exception; which records fail depends only on the bytes on storage,
  so every host and every resumed run skips the same ones. Errors that may pass (a network
  file system, an object-store mount) are retried with exponential backoff a bounded
  number of times, the shard reopened between tries; a checksum mismatch (the bytes on
  storage are bad) is re-read once at once, in case the bad bytes came from the transfer.

Written against ArrayRecord's own reader rather than Grain's ArrayRecordDataSource
because the latter opens every shard up front, reports a failure without the shard's
name, and cannot reopen one shard after a transient error.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxspeech.data import records

# Riegeli's messages when stored bytes fail their checksums or framing: retrying after a
# wait cannot fix those, a second read only rules out a bad transfer.
_CORRUPTION_SIGNATURES = ("Corrupted Riegeli", "Invalid Riegeli", "hash mismatch")


class ShardError(ValueError):
    """A shard listed in a split index is missing, unreadable or of another record count."""


class Fault(NamedTuple):
    """A record that could not be read or decoded."""

    position: int  # position among the reader's records (what the caller asked for)
    shard: str  # the shard file
    index: int  # the record's index inside that shard
    error: str  # why: the reader's or decoder's message


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Transient read errors: `retries` more tries, waiting backoff_s, 2 backoff_s, ..."""

    retries: int = 3
    backoff_s: float = 1.0

    def __post_init__(self):
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"read retries and backoff must be >= 0, got {self}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try `attempt` + 1 (attempt 0 is the first read)."""
        return self.backoff_s * 2**attempt


DEFAULT_RETRY = RetryPolicy()


def is_corruption(error: BaseException) -> bool:
    """True for an error that says the stored bytes are bad (not worth waiting for)."""
    return any(s in str(error) for s in _CORRUPTION_SIGNATURES)


def open_shard(path: str) -> Any:
    """An ArrayRecordReader for random access (no read-ahead, as Grain opens them)."""
    from array_record.python.array_record_module import ArrayRecordReader

    return ArrayRecordReader(path, options="readahead_buffer_size:0", file_reader_buffer_size=32768)


def shard_status(path: str, expected: int) -> tuple[int | None, str]:
    """(records the file holds, None when it cannot be opened; why it cannot serve
    `expected` records: "missing", "unreadable (...)", "holds N records, ...", or "")."""
    if not os.path.isfile(path):
        return None, "missing"
    try:
        reader = open_shard(path)
        found = int(reader.num_records())
        reader.close()
    except Exception as e:  # noqa: BLE001 - any failure to open is the shard's problem
        return None, f"unreadable ({type(e).__name__}: {e})"
    if found != expected:
        return found, f"holds {found} records, the index says {expected}"
    return found, ""


def check_shards(paths: Sequence[str], counts: Sequence[int]) -> None:
    """Raises ShardError naming every shard of `paths` that cannot serve its `counts`
    records (missing, unreadable, or another record count)."""
    bad = [(p, why) for p, n in zip(paths, counts) if (why := shard_status(p, n)[1])]
    if bad:
        lines = "\n".join(f"  {p}: {why}" for p, why in bad)
        raise ShardError(
            f"{len(bad)} of {len(paths)} shards cannot be read as the split index says:\n"
            f"{lines}\ncopy them again from their source, or run `python -m data_prep.verify "
            f"{os.path.dirname(os.path.dirname(bad[0][0]))} --repair` to drop what is lost"
        )


class RecordReader:
    """Records by position over `paths` (shard i holds `counts[i]` records, in order).

    Picklable: shards are opened lazily, in the process that reads. `open_fn` and `sleep`
    are injectable so that tests can stage failing readers without real faults.
    """

    def __init__(
        self,
        paths: Sequence[str],
        counts: Sequence[int],
        policy: RetryPolicy = DEFAULT_RETRY,
        open_fn: Callable[[str], Any] = open_shard,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if len(paths) != len(counts):
            raise ValueError(f"{len(paths)} shard paths but {len(counts)} record counts")
        self.paths = list(paths)
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
        self.policy, self.open_fn, self.sleep = policy, open_fn, sleep
        self._readers: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_readers"}

    def __setstate__(self, state):
        self.__dict__.update(state, _readers={})

    def locate(self, position: int) -> tuple[int, int]:
        """(shard number, index inside it) of a position."""
        if not 0 <= position < len(self):
            raise IndexError(f"record {position} of {len(self)}")
        shard = int(np.searchsorted(self.starts, position, side="right")) - 1
        return shard, position - int(self.starts[shard])

    def _reader(self, shard: int) -> Any:
        if shard not in self._readers:
            self._readers[shard] = self.open_fn(self.paths[shard])
        return self._readers[shard]

    def _reopen(self, shard: int) -> None:
        reader = self._readers.pop(shard, None)
        try:
            if reader is not None:
                reader.close()
        except Exception:  # noqa: BLE001 - a broken handle is why we reopen
            pass

    def read(self, positions: Sequence[int]) -> tuple[list[bytes | None], list[Fault], int]:
        """The records at `positions` (None where one cannot be read), the faults, and how
        many reads were tried again.

        Each shard's records are read in one call; only when that fails are its records
        read one by one, to find the bad ones.
        """
        out: list[bytes | None] = [None] * len(positions)
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for slot, pos in enumerate(positions):
            shard, index = self.locate(int(pos))
            by_shard.setdefault(shard, []).append((slot, index))
        faults, retries = [], 0
        for shard, items in by_shard.items():
            try:
                data = self._reader(shard).read([i for _, i in items])
                for (slot, _), record in zip(items, data):
                    out[slot] = record
                continue
            except Exception:  # noqa: BLE001 - one of them failed: find which
                pass
            for slot, index in items:
                out[slot], error, tries = self._read_one(shard, index)
                retries += tries - 1
                if error is not None:
                    faults.append(Fault(int(positions[slot]), self.paths[shard], index, error))
        return out, faults, retries

    def _read_one(self, shard: int, index: int) -> tuple[bytes | None, str | None, int]:
        """(record, None, tries), or (None, the last error, tries) once the policy gives up."""
        error: BaseException | None = None
        for attempt in range(self.policy.retries + 1):
            try:
                return self._reader(shard).read([index])[0], None, attempt + 1
            except Exception as e:  # noqa: BLE001 - every failure is judged below
                error = e
            if is_corruption(error):
                if attempt >= 1:
                    break  # the same checksum failure twice: stored that way
                continue
            if attempt < self.policy.retries:
                self.sleep(self.policy.delay(attempt))
                self._reopen(shard)
        return None, f"{type(error).__name__}: {error}", attempt + 1


def read_split_records(
    data_dir: str, split: str, positions: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Decoded records (`records.decode_record`) of a prepared split: every one, or those
    at `positions` in that order; for tools that read a whole split or a sample of it
    (export calibration, benchmarks, tests), not for training (`pipeline` reads batches).

    Raises:
      FileNotFoundError: the split is not prepared (no index).
      ValueError: records that cannot be read, named (at most 3) with the count.
    """
    index = records.read_split_index(data_dir, split)
    if positions is None:
        positions = range(index.num_records)
    data, faults, _ = RecordReader(index.shard_paths, index.shard_num_records).read(positions)
    if faults:
        named = "; ".join(f"{f.shard}[{f.index}]: {f.error}" for f in faults[:3])
        raise ValueError(f"{data_dir}:{split}: {len(faults)} unreadable records ({named})")
    return [records.decode_record(d) for d in data]


def audio_float32(record: dict[str, Any]) -> np.ndarray:
    """A decoded record's int16 samples as float32 in [-1, 1), scaled as the loader does."""
    return np.asarray(record["audio"], np.float32) / np.float32(32768.0)
