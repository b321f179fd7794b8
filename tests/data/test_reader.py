"""Reading damaged shards: a corrupt or undecodable record is skipped and reported with its
shard and index, deterministically; a shard that is missing, truncated or of another
record count is one error before any work; transient errors are retried with backoff."""

import os
import shutil

import numpy as np
import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.data import pipeline as pl
from jaxspeech.data import reader as rd
from jaxspeech.data import records
from jaxspeech.runs import faults
from tests.data import damage
from tests.data.test_pipeline import SR, write_corpus


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("clean"))
    write_corpus(root, n=30, num_shards=3, long_ones=0)
    return root


@pytest.fixture
def copy(clean, tmp_path):
    root = str(tmp_path / "data")
    shutil.copytree(clean, root)
    return root


def _index(root):
    return records.read_split_index(root, "train")


def test_flipped_bytes_cost_exactly_their_record(copy):
    index = _index(copy)
    path = index.shard_paths[1]
    original = damage.rewrite_uncompressed(path)
    damage.flip_record(path, original[4])
    reader = rd.RecordReader(index.shard_paths, index.shard_num_records)
    first = int(index.shard_num_records[0])
    positions = list(range(len(reader)))
    data, found, retries = reader.read(positions)
    assert [(f.position, f.shard, f.index) for f in found] == [(first + 4, path, 4)]
    assert "hash mismatch" in found[0].error
    assert retries == 1  # a checksum failure is read once more, at once, then given up
    assert data[first + 4] is None
    assert data[first : first + index.shard_num_records[1]][:4] == original[:4]
    assert all(d is not None for i, d in enumerate(data) if i != first + 4)
    # The same record fails again: the skip depends only on the stored bytes.
    again = rd.RecordReader(index.shard_paths, index.shard_num_records).read([first + 4])
    assert again[0] == [None] and again[1][0].index == 4


def test_read_split_records_reads_all_or_some_and_names_a_bad_record(copy):
    """The tools' whole-split reader: every record in order, or a chosen few; decoded; the
    loader's float scaling; a damaged record is an error naming its shard and index."""
    index = _index(copy)
    every = rd.read_split_records(copy, "train")
    assert len(every) == index.num_records
    some = rd.read_split_records(copy, "train", [7, 2])
    assert [r["id"] for r in some] == [every[7]["id"], every[2]["id"]]
    audio = rd.audio_float32(every[0])
    assert audio.dtype == np.float32
    np.testing.assert_array_equal(audio * 32768, every[0]["audio"])  # exact: 2^15 scale
    path = index.shard_paths[1]
    damage.flip_record(path, damage.rewrite_uncompressed(path)[4])
    with pytest.raises(ValueError, match=f"1 unreadable records .*{os.path.basename(path)}\\[4\\]"):
        rd.read_split_records(copy, "train")
    with pytest.raises(FileNotFoundError):
        rd.read_split_records(copy, "nope")


def test_missing_truncated_and_miscounted_shards_are_one_error_naming_each(copy):
    index = _index(copy)
    os.remove(index.shard_paths[0])
    damage.truncate(index.shard_paths[1])
    counts = list(index.shard_num_records)
    counts[2] += 1
    with pytest.raises(rd.ShardError) as e:
        rd.check_shards(index.shard_paths, counts)
    msg = str(e.value)
    assert msg.startswith("3 of 3 shards cannot be read as the split index says")
    assert f"{index.shard_paths[0]}: missing" in msg
    assert f"{index.shard_paths[1]}: unreadable (RuntimeError: " in msg and "Riegeli" in msg
    assert f"{index.shard_paths[2]}: holds {counts[2] - 1} records, the index says" in msg
    assert "data_prep.verify" in msg
    # The pipeline checks the shards it reads when it is built, before any batch.
    with pytest.raises(rd.ShardError, match="missing"):
        pl.make_pipeline(
            data_dir=copy,
            split="train",
            tokenizer_dir=os.path.join(copy, "tokenizer"),
            spec=pl.make_bucket_spec([2.0, 5.0], 12.0, 30.0, SR),
            seed=0,
            train=True,
        )


def _pipe(root, **kw):
    return pl.make_pipeline(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=pl.make_bucket_spec([2.0, 3.5, 5.0], 12.0, 30.0, SR),
        seed=3,
        train=True,
        **kw,
    )


def test_unusable_records_become_counted_padding_rows_and_nothing_else_changes(clean, copy):
    index = _index(copy)
    damage.replace_record(
        index.shard_paths[0], 2, damage.undecodable(damage.read_all(index.shard_paths[0])[2])
    )
    flipped = damage.rewrite_uncompressed(index.shard_paths[2])
    damage.flip_record(index.shard_paths[2], flipped[5])
    first2 = sum(index.shard_num_records[:2])
    bad = {2: (index.shard_paths[0], 2), first2 + 5: (index.shard_paths[2], 5)}
    good, hurt = _pipe(clean), _pipe(copy)
    met = {}
    for step in range(hurt.plan.batches_per_epoch):
        want, got = good.load(good.plan[step]), hurt.load(hurt.plan[step])
        rows = np.flatnonzero(got["corrupt"])
        indices = hurt.plan[step].indices
        assert sorted(int(indices[r]) for r in rows) == sorted(f["record"] for f in got["faults"])
        for f in got["faults"]:
            met[f["record"]] = (f["shard"], f["index"], f["error"])
        # The damaged rows are padding rows; every other row and every shape is unchanged.
        pad = pl.empty_batch(len(rows), *want["audio"].shape[1:], want["labels"].shape[1])
        for k in pl.empty_batch(1, 1, 1):
            expect = want[k].copy()
            if k != "corrupt":
                expect[rows] = pad[k]
            else:
                expect[rows] = 1
            np.testing.assert_array_equal(got[k], expect, err_msg=f"step {step} {k}")
    assert {r: m[:2] for r, m in met.items()} == bad
    assert "payload has" in met[2][2] and "hash mismatch" in met[first2 + 5][2]


class Flaky:
    """A shard reader that fails `failures` times on one record, then reads it."""

    def __init__(self, path, failures, error):
        self.inner, self.failures, self.error = rd.open_shard(path), failures, error

    def num_records(self):
        return self.inner.num_records()

    def read(self, indices):
        if 3 in indices and self.failures[0] > 0:
            self.failures[0] -= 1
            raise self.error
        return self.inner.read(indices)

    def close(self):
        self.inner.close()


def _flaky_reader(index, failures, error, retries=3):
    left, sleeps = [failures], []
    reader = rd.RecordReader(
        index.shard_paths[:1],
        index.shard_num_records[:1],
        rd.RetryPolicy(retries=retries, backoff_s=0.5),
        open_fn=lambda p: Flaky(p, left, error),
        sleep=sleeps.append,
    )
    return reader, sleeps


def test_transient_errors_are_retried_with_backoff_and_counted(clean):
    index = _index(clean)
    expected = damage.read_all(index.shard_paths[0])
    # Fails twice (the batch read, then the first single read), then succeeds.
    reader, sleeps = _flaky_reader(index, 2, OSError(5, "Input/output error"))
    data, found, retries = reader.read([1, 3, 4])
    assert data == [expected[1], expected[3], expected[4]] and found == []
    assert retries == 1 and sleeps == [0.5]
    # Still failing after the retries: skipped and reported like a corrupt record.
    reader, sleeps = _flaky_reader(index, 100, OSError(5, "Input/output error"))
    data, found, retries = reader.read([3])
    assert data == [None] and retries == 3 and sleeps == [0.5, 1.0, 2.0]
    assert found[0].index == 3 and found[0].error == "OSError: [Errno 5] Input/output error"
    # A checksum failure is not waited for: read once more at once, then skipped.
    reader, sleeps = _flaky_reader(index, 100, RuntimeError("Corrupted Riegeli: hash mismatch"))
    assert reader.read([3])[0] == [None] and sleeps == []
    with pytest.raises(ValueError, match="must be >= 0"):
        rd.RetryPolicy(retries=-1)


def test_pipeline_reports_read_retries_of_a_batch(clean):
    pipe = _pipe(clean)
    left = [2]
    pipe.load.reader.open_fn = lambda p: Flaky(p, left, OSError("stale file handle"))
    pipe.load.reader.sleep = lambda s: None
    total = 0
    for step in range(pipe.plan.batches_per_epoch):
        batch = pipe.load(pipe.plan[step])
        total += batch["read_retries"]
        assert batch["faults"] == [] and not batch["corrupt"].any()
    assert total == 1 and left == [0]


def test_fault_log_reports_each_record_once_and_counts_by_shard(tmp_path, capsys):
    log = faults.FaultLog(str(tmp_path), what="training")
    f = [
        {"record": 7, "shard": "/d/a", "index": 1, "error": "x"},
        {"record": 9, "shard": "/d/a", "index": 3, "error": "y"},
    ]
    assert len(log.add(f, step=4)) == 2
    assert log.add(f[:1], step=9) == []  # the next epoch meets it again: reported once
    log.add([{"record": 1, "shard": "/d/b", "index": 0, "error": "z"}], step=10)
    log.close()
    out = capsys.readouterr().out
    assert out.count("skipping unreadable record") == 3
    assert (
        "skipping unreadable record 1 of shard /d/a (record 7 of the split; training "
        "step 4): x" in out
    )
    assert log.by_shard == {"/d/a": 2, "/d/b": 1}
    assert faults.worst_shards(log.by_shard) == "/d/a (2 bad), /d/b (1 bad)"
    lines = (tmp_path / "data_faults" / "p0.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"step": 4' in lines[0]


def test_corrupt_budget_counts_per_epoch_and_resumes():
    budget = faults.CorruptBudget(num_records=2000, max_fraction=0.001, split="train")
    assert budget.limit == 2
    budget.add(0, 2, {})
    budget.add(1, 2, {})  # a new epoch meets the same records again: counted afresh
    saved = budget.state()
    resumed = faults.CorruptBudget(2000, 0.001, "train")
    resumed.load(saved)
    with pytest.raises(faults.CorpusDamaged) as e:
        resumed.add(1, 1, {"/d/a": 3, "/d/b": 1})
    assert isinstance(e.value, UserError)
    assert str(e.value).startswith(
        "3 of the 2000 records of train could not be read or decoded in epoch 1, more than "
        "data.max_corrupt_fraction=0.001 allows (2)"
    )
    assert "/d/a (3 bad), /d/b (1 bad)" in str(e.value)
    with pytest.raises(UserError, match="must be in"):
        faults.CorruptBudget(10, 1.5, "train")
