"""The webdataset reader on shards written by the webdataset library itself: samples with
flac or wav audio and a txt or json transcript, and the bad ones (no audio, no text,
undecodable audio, a duplicated key in another shard, a json that is not an object, a
truncated shard), each skipped and counted; the records hold the members' samples."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
import webdataset as wds

from data_prep.readers.common import PrepareError
from data_prep.readers.webdataset import (
    MALFORMED_SAMPLE,
    UNREADABLE_SHARD,
    shard_paths,
    split_key,
)
from tests.data_prep.test_prepare import IN_MEMORY, _read_split, _run

RATE = 16000


def _audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-0.5, 0.5, int(seconds * RATE)) * 32767).astype(np.int16)


def _encoded(audio: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format=fmt, subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    audio = {i: _audio(0.5 + 0.1 * i, i) for i in range(4)}
    with wds.TarWriter(str(root / "shard-000000.tar")) as sink:
        sink.write({"__key__": "spk1/utt0", "flac": _encoded(audio[0], "FLAC"), "txt": "hello"})
        sink.write(
            {
                "__key__": "spk1/utt1",
                "wav": _encoded(audio[1], "WAV"),
                "json": json.dumps({"text": "world", "speaker": "s1"}).encode(),
            }
        )
        sink.write({"__key__": "spk2/notext", "flac": _encoded(audio[2], "FLAC")})
        sink.write({"__key__": "spk2/noaudio", "txt": "no audio here"})
        sink.write({"__key__": "spk2/garbage", "flac": b"not a sound file", "txt": "garbage"})
        sink.write({"__key__": "spk2/badjson", "flac": _encoded(audio[3], "FLAC"), "json": b"[1]"})
    with wds.TarWriter(str(root / "shard-000001.tar")) as sink:
        sink.write({"__key__": "spk1/utt0", "flac": _encoded(audio[3], "FLAC"), "txt": "again"})
        sink.write({"__key__": "spk3/utt9", "flac": _encoded(audio[2], "FLAC"), "txt": "last one"})
    good = (root / "shard-000001.tar").read_bytes()
    (root / "shard-000002.tar").write_bytes(good[: len(good) // 3])  # truncated
    return root, audio


def test_keys_follow_webdatasets_rule():
    assert split_key("a/b/utt.seg.flac") == ("a/b/utt", "seg.flac")
    assert split_key("utt.txt") == ("utt", "txt")


def test_shards_prepare_with_every_bad_sample_counted(shards, tmp_path):
    root, audio = shards
    report = _run(str(root), str(tmp_path / "out"), "--format", "webdataset", *IN_MEMORY)
    got = {r["id"]: r for r in _read_split(str(tmp_path / "out"), "train")}
    assert sorted(got) == ["spk1/utt0", "spk1/utt1", "spk3/utt9"]
    np.testing.assert_array_equal(got["spk1/utt0"]["audio"], audio[0])  # the first shard's
    np.testing.assert_array_equal(got["spk1/utt1"]["audio"], audio[1])
    assert (got["spk1/utt1"]["text"], got["spk1/utt1"]["speaker"]) == ("world", "s1")
    skipped = {k: v["count"] for k, v in report["skipped"].items()}
    assert skipped == {
        "duplicate_id": 1,
        "empty_transcript": 1,
        "missing_audio": 1,
        "undecodable_audio": 1,
        MALFORMED_SAMPLE: 1,
        UNREADABLE_SHARD: 1,
    }, report["skipped"]


def test_no_shards_or_compressed_shards_are_one_line(tmp_path):
    with pytest.raises(PrepareError, match="no WebDataset shards match"):
        shard_paths(str(tmp_path))
    (tmp_path / "x.tar.gz").write_bytes(b"")
    with pytest.raises(PrepareError, match="only uncompressed .tar shards"):
        shard_paths(str(tmp_path / "*.tar*"))
