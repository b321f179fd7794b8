"""The hf reader on datasets written by the datasets library itself (save_to_disk and
parquet with row groups of 2 rows): transcripts, speakers, ids, audio bytes decoded with
soundfile, and the bad rows (no audio, undecodable bytes, empty text, a duplicated id)
skipped and counted; a wrong column or no dataset is one line."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest
import soundfile as sf

from data_prep.readers.common import PrepareError
from tests.data_prep.test_prepare import IN_MEMORY, _read_split, _run

RATE = 16000


def _audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(-0.5, 0.5, int(seconds * RATE)) * 32767).astype(np.int16)


def _flac(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    audio = {i: _audio(0.4 + 0.1 * i, i) for i in range(5)}
    rows = {
        "audio": [
            {"bytes": _flac(audio[0]), "path": "a.flac"},
            {"bytes": _flac(audio[1]), "path": "b.flac"},
            {"bytes": _flac(audio[4]), "path": "c.flac"},
            None,  # no audio at all
            {"bytes": b"garbage", "path": "c.flac"},
            {"bytes": _flac(audio[2]), "path": "d.flac"},
            {"bytes": _flac(audio[3]), "path": "e.flac"},
        ],
        "text": ["first", "second", "third", "no audio", "garbage", "   ", "twice"],
        "speaker_id": ["s1", "s1", "s2", "s2", "s3", "s3", "s4"],
        "id": ["u0", "u1", "u2", "u3", "u4", "u5", "u0"],
    }
    ds = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(decode=False))
    ds.save_to_disk(str(root / "saved"))
    (root / "parquet").mkdir()
    ds.to_parquet(str(root / "parquet" / "train-00000.parquet"), batch_size=2)  # row groups of 2
    return root, audio


@pytest.mark.parametrize("layout", ["saved", "parquet"])
def test_a_dataset_prepares_with_every_bad_row_counted(dataset, layout, tmp_path):
    root, audio = dataset
    out = tmp_path / "out"
    report = _run(str(root / layout), str(out), "--format", "hf", *IN_MEMORY)
    got = {r["id"]: r for r in _read_split(str(out), "train")}
    assert sorted(got) == ["u0", "u1", "u2"]
    for key, i in (("u0", 0), ("u1", 1), ("u2", 4)):
        np.testing.assert_array_equal(got[key]["audio"], audio[i])
    assert (got["u1"]["text"], got["u1"]["speaker"]) == ("second", "s1")
    skipped = {k: v["count"] for k, v in report["skipped"].items()}
    assert skipped == {
        "duplicate_id": 1,
        "empty_transcript": 1,
        "missing_audio": 1,
        "undecodable_audio": 1,
    }, report["skipped"]


def test_a_missing_column_or_dataset_is_one_line(dataset, tmp_path):
    root, _ = dataset
    with pytest.raises(PrepareError, match=r"has no column 'transcript' \(--hf_text_column\)"):
        _run(
            str(root / "saved"),
            str(tmp_path / "o"),
            "--format",
            "hf",
            "--hf_text_column",
            "transcript",
            *IN_MEMORY,
        )
    with pytest.raises(PrepareError, match="no Hugging Face dataset at"):
        _run(str(tmp_path), str(tmp_path / "o"), "--format", "hf", *IN_MEMORY)
