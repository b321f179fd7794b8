"""A full disk and a second job, on copies of the shared tiny run (errors injected into the
writers, so no root and no small file system are needed): training stops with one line
and exit code 5, keeps its last committed checkpoint, says `failed`, and resumes; a
second trainer on a run in use refuses before touching it; an export on a full disk
leaves the previous artifact whole; prepare leaves no split that looks complete."""

import errno
import json
import os
import shutil
from collections import namedtuple

import pytest

from jaxspeech import tasks
from jaxspeech.common import cli, files
from jaxspeech.common.errors import UserError
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import events, lease
from jaxspeech.runs import lifecycle as status_lib
from jaxspeech.serving import artifact_dir
from jaxspeech.serving import recognizer_export as export_lib
from tests.e2e.cli import tiny_config

pytestmark = pytest.mark.slow
Usage = namedtuple("Usage", "total used free")


def test_disk_full_at_a_save_stops_cleanly_and_the_run_resumes(
    tiny_run_copy, corpus, monkeypatch, capsys
):
    _, shards = corpus
    run = str(tiny_run_copy)  # finished at step 8, checkpoints 4 and 8
    # One more step: its end-of-run save is the save that meets the full disk (one step is
    # one batch shape to compile, where 4 more would be two).
    config = tiny_config(shards, "--config.train.num_steps=9", "--config.train.eval_at_end=False")
    with monkeypatch.context() as m:
        m.setattr(ckpt_lib.shutil, "disk_usage", lambda _: Usage(2**30, 2**30, 0))
        with pytest.raises(SystemExit) as e:
            cli.run_job(lambda: tasks.train_and_evaluate(config, run))
    assert e.value.code == 5
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: storage: no space left on device at {run}/checkpoints")
    state = status_lib.run_status(run)
    assert (state["state"], state["committed"]) == ("failed", 8), state
    assert state["error"].startswith("storage: no space left on device")
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["4", "8"]
    assert not os.path.exists(os.path.join(run, lease.LEASE))  # released on the way out
    tasks.train_and_evaluate(config, run)  # room again: resumes from 8
    names = [e["event"] for e in events.read_events(run)]
    assert names[-1] == "finished" and "resumed" in names[names.index("failed") :]
    assert status_lib.run_status(run)["state"] == "finished"


def test_a_second_trainer_refuses_a_run_in_use_before_touching_it(tiny_run_copy, corpus):
    _, shards = corpus
    run = str(tiny_run_copy)
    before = open(os.path.join(run, events.EVENTS)).read()
    with lease.hold(run, "train", 60.0):  # a live job holds the run
        with pytest.raises(lease.LeaseHeld, match=f"{run} is in use by a train job pid"):
            tasks.train_and_evaluate(tiny_config(shards), run)
    assert open(os.path.join(run, events.EVENTS)).read() == before


def test_export_on_a_full_disk_leaves_the_previous_artifact(tiny_run, tmp_path, monkeypatch):
    workdir, _ = tiny_run
    out = tmp_path / "artifact"
    out.mkdir()
    earlier = {"artifact": artifact_dir.ARTIFACT, "files": [export_lib.MANIFEST]}
    (out / export_lib.MANIFEST).write_text(json.dumps(earlier))  # an earlier export
    real = files.atomic_write

    def full_disk(path, data):
        if path.endswith(".stablehlo"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real(path, data)

    monkeypatch.setattr(files, "atomic_write", full_disk)
    with pytest.raises(OSError) as e:
        export_lib.export_run(str(workdir), str(out), eval_split="")
    assert files.storage_error(e.value).startswith("no space left on device at ")
    assert os.listdir(out) == [export_lib.MANIFEST]
    assert json.loads((out / export_lib.MANIFEST).read_text()) == earlier
    assert sorted(os.listdir(tmp_path)) == ["artifact"]  # no staging directory left
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="afile is a file, not a directory"):
        export_lib.export_run(str(workdir), str(tmp_path / "afile"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="holds files no export wrote: notes.txt;"):
        export_lib.export_run(str(workdir), str(tmp_path / "other"))


def test_prepare_with_every_item_bad_leaves_no_split_and_verify_says_so(corpus, tmp_path):
    from data_prep import prepare, verify

    root, shards = corpus
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text('{"audio_filepath": "missing.wav", "text": "x"}\n')
    data = tmp_path / "data"
    shutil.copytree(shards, data)
    argv = ["--format", "manifest", "--input", str(manifest), "--output", str(data)]
    extra = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
    # A split that was there stays whole; a new one is not written.
    assert prepare.main(["p", *argv, "--split", "dev", *extra]) == 2
    assert os.path.exists(data / "dev" / "index.json")
    assert (data / "dev.failed-prep_report.json").exists()
    assert prepare.main(["p", *argv, "--split", "fresh", *extra]) == 2
    assert os.listdir(data / "fresh") == ["prep_report.json"]  # the why, and no index
    assert verify.main([str(data), "--split", "fresh"]) == 2
    assert verify.main([str(data)]) == 2  # an incomplete split is never passed over


def test_a_second_watcher_refuses_to_score_the_same_run(tiny_run_copy, corpus):
    from jaxspeech.evaluation import watcher

    _, shards = corpus
    run = str(tiny_run_copy)
    with lease.hold(os.path.join(run, "eval"), "watch", 60.0):
        with pytest.raises(lease.LeaseHeld, match=r"eval is in use by a watch job pid"):
            watcher.watch(run, str(shards), ["dev"], poll_s=0)
