"""data_prep.verify on a split with every kind of damage: the report names each bad shard
and record; --repair leaves a split that verifies clean and that the loader reads in full,
with the originals kept aside."""

import json
import os

import numpy as np
import pytest

from data_prep import verify
from jaxspeech.data import pipeline as pl
from jaxspeech.data import reader as rd
from jaxspeech.data import records
from tests.data import damage
from tests.data.test_pipeline import SR, write_corpus

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _ids(root, split="train"):
    index = records.read_split_index(root, split)
    reader = rd.RecordReader(index.shard_paths, index.shard_num_records)
    data, found, _ = reader.read(list(range(len(reader))))
    assert not found
    return [records.decode_header(d)["id"] for d in data]


def test_verify_reports_every_damage_and_repair_keeps_every_good_record(tmp_path, capsys):
    root = str(tmp_path / "data")
    write_corpus(root, n=40, num_shards=5, long_ones=0)
    write_corpus(root, split="dev", n=6, num_shards=1, long_ones=0, seed=1)
    index = records.read_split_index(root, "train")
    ids = _ids(root)
    p = index.shard_paths
    flipped = damage.rewrite_uncompressed(p[0])
    damage.flip_record(p[0], flipped[3])  # a checksum failure
    old = damage.replace_record(p[1], 0, damage.undecodable(damage.read_all(p[1])[0]))
    damage.truncate(p[2])  # no footer: nothing in it can be read
    os.remove(p[3])
    starts = np.concatenate([[0], np.cumsum(index.shard_num_records)])
    lost = {ids[starts[0] + 3], ids[starts[1]]} | set(ids[starts[2] : starts[4]])
    assert records.decode_header(old[0])["id"] == ids[starts[1]]

    report_path = str(tmp_path / "report.json")
    assert verify.main([root, "--report", report_path, *IN_MEMORY]) == 1
    out = capsys.readouterr().out
    report = json.load(open(report_path))
    train, dev = report["splits"]["train"], report["splits"]["dev"]
    assert dev["bad_shards"] == 0 and dev["bad_records"] == 0 and dev["records"] == 6
    assert (train["shards"], train["records"], train["bad_shards"]) == (5, 40, 4)
    assert train["bad_records"] == len(lost)
    problems = {os.path.basename(x["path"]): x for x in train["problems"]}
    name = [os.path.basename(x) for x in p]
    assert problems[name[0]]["problem"] == "" and problems[name[1]]["problem"] == ""
    # Unreadable bytes have no id to give; the index inside the shard says which it is.
    assert [(r["index"], r["id"]) for r in problems[name[0]]["bad_records"]] == [(3, "")]
    assert "hash mismatch" in problems[name[0]]["bad_records"][0]["error"]
    assert problems[name[1]]["bad_records"][0]["id"] == ids[starts[1]]  # the header reads
    assert "payload has" in problems[name[1]]["bad_records"][0]["error"]
    assert problems[name[2]]["problem"].startswith("unreadable (RuntimeError:")
    assert problems[name[3]]["problem"] == "missing"
    assert name[4] not in problems
    assert f"{p[3]}: missing" in out and "train: 5 shards, 40 records; 4 bad shards" in out

    assert verify.main([root, "--split", "train", "--repair", *IN_MEMORY]) == 0
    out = capsys.readouterr().out
    assert "2 shards rewritten, 2 dropped, 18 records removed" in out
    # The repaired split verifies clean, holds every good record in order, and loads.
    assert verify.main([root, "--split", "train", *IN_MEMORY]) == 0
    assert _ids(root) == [i for i in ids if i not in lost]
    repaired = records.read_split_index(root, "train")
    assert repaired.num_records == 40 - len(lost) == len(repaired.durations)
    assert np.isclose(repaired.seconds, float(repaired.durations.sum()), atol=1e-3)
    pipe = pl.make_pipeline(
        data_dir=root,
        split="train",
        tokenizer_dir=os.path.join(root, "tokenizer"),
        spec=pl.make_bucket_spec([2.0, 5.0], 12.0, 30.0, SR),
        seed=0,
        train=False,
        with_text=True,
    )
    seen = [i for s in range(len(pipe.plan)) for i in pipe.load(pipe.plan[s])["id"] if i]
    assert sorted(seen) == sorted(ids[i] for i in range(40) if ids[i] not in lost)
    # Nothing was deleted: the damaged originals and the old index are kept aside.
    (aside,) = os.listdir(os.path.join(root, "train", verify.SET_ASIDE))
    kept = set(os.listdir(os.path.join(root, "train", verify.SET_ASIDE, aside)))
    assert kept == {name[0], name[1], name[2], records.INDEX_FILE, records.DURATIONS_FILE}


def test_verify_command_mistakes(tmp_path, capsys):
    assert verify.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert verify.main([str(tmp_path)]) == 2
    assert "holds no prepared split" in capsys.readouterr().err
    write_corpus(str(tmp_path), split="dev", n=3, num_shards=1, long_ones=0)
    assert verify.main([str(tmp_path), "--split", "test"]) == 2
    assert "has no prepared split test (it has: dev)" in capsys.readouterr().err


@pytest.mark.parametrize("duration", [1.25, None])
def test_check_record_durations_and_rates(duration):
    rec = records.encode_record(
        id="u", audio=np.zeros(16000, np.int16), sample_rate=SR, text="a", speaker="s"
    )
    assert verify.check_record(rec, 1.0 if duration else None, SR) == ("u", "")
    if duration:
        assert verify.check_record(rec, duration, SR) == (
            "u",
            "1.000 s of audio, the index says 1.250 s",
        )
    assert (
        verify.check_record(rec, None, 8000)[1] == "sample rate 16000 Hz, the split is at 8000 Hz"
    )
    assert verify.check_record(b"junk", None, SR)[0] == ""
