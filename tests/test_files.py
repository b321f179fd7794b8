"""jaxspeech.common.files: whole files or none, storage failures recognised, and the entry points'
one line and exit code 5 for them (errors injected into the writers: no root needed)."""

import errno
import json
import os

import numpy as np
import pytest

from jaxspeech.common import cli, files
from jaxspeech.data import records
from jaxspeech.evaluation import scoring
from jaxspeech.runs import events


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_replaces_whole_or_keeps_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "a.json")
    files.atomic_json(path, {"v": 1})
    files.atomic_write(path, b"\x00\x01")
    assert open(path, "rb").read() == b"\x00\x01"
    files.atomic_json(path, {"v": 2})
    monkeypatch.setattr(os, "fsync", _enospc)  # the disk fills before the data is safe
    with pytest.raises(OSError, match="No space left"):
        files.atomic_json(path, {"v": 3})
    assert json.load(open(path)) == {"v": 2}
    assert os.listdir(tmp_path) == ["a.json"]  # no temporary file left behind


def test_atomic_open_rejects_appends_and_removes_its_temporary_on_error(tmp_path):
    with pytest.raises(ValueError, match="whole files"):
        with files.atomic_open(str(tmp_path / "x"), "a"):
            pass
    with pytest.raises(RuntimeError):
        with files.atomic_open(str(tmp_path / "y")) as f:
            f.write("half")
            raise RuntimeError("killed midway")
    assert os.listdir(tmp_path) == []


def test_create_exclusive_makes_one_complete_file(tmp_path):
    path = str(tmp_path / "lease.json")
    assert files.create_exclusive(path, "first")
    assert not files.create_exclusive(path, "second")
    assert open(path).read() == "first"
    assert os.listdir(tmp_path) == ["lease.json"]


def test_replace_dir_swaps_whole_directories(tmp_path):
    final = str(tmp_path / "out")
    for content in ("old", "new"):
        stage = files.staging_dir(final)
        assert os.path.dirname(stage) == str(tmp_path) and os.path.basename(stage)[0] == "."
        open(os.path.join(stage, content), "w").close()
        files.replace_dir(stage, final)
    assert os.listdir(final) == ["new"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_remove_temporaries(tmp_path):
    (tmp_path / ".a.json.tmp-1234abcd").write_text("x")
    (tmp_path / "keep.json").write_text("x")
    assert files.remove_temporaries(str(tmp_path)) == [".a.json.tmp-1234abcd"]
    assert os.listdir(tmp_path) == ["keep.json"]


@pytest.mark.parametrize(
    "exc,expected",
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/r/x"),
            "no space left on device at /r/x",
        ),
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied", "/o"), "permission denied at /o"),
        (
            ValueError(
                'RESOURCE_EXHAUSTED: Error writing "p/0" in OCDBT database at local file "/r/c/": '
                'Failed writing: "/r/c/d/e27a": Failed to write 32554 bytes to file 14: No space '
                "left on device [os_error_code='28']"
            ),
            "no space left on device at /r/c/d/e27a",
        ),
        (
            RuntimeError("OSError: [Errno 122] Disk quota exceeded: '/s/x.array_record' [Write]"),
            "disk quota exceeded at /s/x.array_record",
        ),
        (ValueError("a bug"), None),
        (OSError(errno.ECONNRESET, "reset"), None),
    ],
)
def test_storage_error_recognises_failures_and_their_paths(exc, expected):
    assert files.storage_error(exc) == expected


def test_storage_error_follows_the_cause_chain():
    try:
        try:
            _enospc()
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as e:
        assert files.storage_error(e) == "no space left on device"


def test_run_job_reports_storage_failures_as_one_line_exit_5(capsys):
    def job():
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/r/checkpoints")

    with pytest.raises(SystemExit) as e:
        cli.run_job(job)
    assert e.value.code == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: storage: no space left on device at /runs/r/checkpoints"
    )


def test_event_lines_are_whole_and_a_failure_is_recorded(tmp_path, monkeypatch):
    run = str(tmp_path)
    log = events.EventLog(run)
    log.write("started", step=0)
    log.close()
    with open(os.path.join(run, events.EVENTS), "a") as f:
        f.write('{"event": "checkpoint_sa')  # a line cut by a kill
    events.record_failure(run, OSError(errno.ENOSPC, "No space left on device", "/r/c"))
    got = events.read_events(run)
    assert [e["event"] for e in got] == ["started", "failed"]
    assert got[-1]["error"] == "storage: no space left on device at /r/c"
    monkeypatch.setattr(events, "EventLog", _enospc)  # the log itself cannot be written
    events.record_failure(run, RuntimeError("x"))  # no exception: the lease tells instead


def test_eval_results_and_split_index_are_written_whole(tmp_path, monkeypatch):
    result = {"split": "dev", "wer": 0.5, "cer": 0.2, "utterances": [{"id": "u"}]}
    path = scoring.write_result(str(tmp_path), result, 8)
    assert json.load(open(path))["wer"] == 0.5
    split = tmp_path / "s"
    split.mkdir()
    shards = [{"path": "s-0.array_record", "num_records": 1, "seconds": 1.0}]
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(OSError):
        scoring.write_result(str(tmp_path), result | {"wer": 0.1}, 8)
    with pytest.raises(OSError):
        records.write_split_index(
            str(split), shards, np.ones(1, np.float32), {"sample_rate": 16000}
        )
    assert json.load(open(path))["wer"] == 0.5  # the earlier result, whole
    assert os.listdir(split) == []  # no index: the split does not look complete
    assert sorted(os.listdir(tmp_path / "eval")) == ["dev-step8-utts.jsonl", "dev-step8.json"]


@pytest.mark.timeout(120)  # the bug this guards against is a hang
def test_a_full_disk_under_tensorboard_is_raised_not_a_hang(tmp_path, monkeypatch):
    """tensorboardX writes from its own thread: when a write fails the thread dies and
    its bounded queue would block the trainer forever; the writer raises the failure."""
    from tensorboardX import event_file_writer

    from jaxspeech.metrics.writers import MetricWriter

    writer = MetricWriter(str(tmp_path / "tb"), str(tmp_path / "m.jsonl"))
    monkeypatch.setattr(event_file_writer.EventsWriter, "write_event", _enospc)
    # Many values in one call: the thread dies on the first while the queue (10) fills.
    with pytest.raises(OSError, match="No space left"):
        for step in range(1, 40):  # more than the queue holds: no call may block
            writer.scalars(step, {f"v{i}": 1.0 for i in range(25)})
    writer.close()  # does not wait on the dead thread
    assert len(open(tmp_path / "m.jsonl").readlines()) < 39
