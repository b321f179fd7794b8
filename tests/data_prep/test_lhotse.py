"""The lhotse reader on manifests written by Lhotse itself (tests/data_prep/lhotse_inputs,
made by its make.py with lhotse 1.33.0): supervisions of recordings and cuts, segments
and channels cut exactly out of the audio, and every bad entry (a segment past the audio
or with a bad start or duration, an empty text, a duplicated id, an unknown recording, a
missing channel or file, sources and cuts it cannot read) skipped and counted; mistakes
in the input files are one line."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil

import numpy as np
import pytest

from data_prep.readers.common import PrepareError
from tests.data_prep.test_prepare import IN_MEMORY, _read_split, _run

INPUTS = os.path.join(os.path.dirname(__file__), "lhotse_inputs")
_spec = importlib.util.spec_from_file_location("lhotse_inputs", os.path.join(INPUTS, "make.py"))
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)

RATE = make.RATE
# Every supervision (and cut) that prepares: its recording, samples, channel column(s).
WANT = {
    "s1a": ("rec1", slice(0, RATE), [0]),
    "s1b": ("rec1", slice(RATE, 2 * RATE), [0]),
    "s2l": ("rec2", slice(0, RATE), [0]),
    "s2r": ("rec2", slice(RATE // 4, 3 * RATE // 4), [1]),
    "s2m": ("rec2", slice(0, RATE), [0, 1]),
}


@pytest.fixture()
def inputs(tmp_path):
    """The manifests beside the audio they name (relative paths under tmp_path)."""
    for name in ("recordings.jsonl.gz", "supervisions.jsonl.gz", "cuts.jsonl.gz"):
        shutil.copy(os.path.join(INPUTS, name), tmp_path / name)
    return tmp_path, make.write_audio(str(tmp_path))


def _prepare(manifest, out, root, *extra) -> dict:
    args = ("--format", "lhotse", "--lhotse_audio_root", str(root), "--sample_rate", str(RATE))
    return _run(str(manifest), str(out), *args, *extra, *IN_MEMORY)


def _check_audio(got: dict, samples: dict, prefix: str = "") -> None:
    assert sorted(got) == sorted(prefix + k for k in WANT)
    for key, (rec, span, columns) in WANT.items():
        want = samples[rec][span][:, columns].astype(np.float64)
        # One channel is stored as it was; several are averaged (rounded back to int16).
        want = want[:, 0] if len(columns) == 1 else want.mean(axis=1)
        np.testing.assert_allclose(got[prefix + key]["audio"], want, atol=1.0)


def test_recordings_and_supervisions_prepare_with_every_bad_entry_counted(inputs, tmp_path):
    root, samples = inputs
    report = _prepare(root / "recordings.jsonl.gz", tmp_path / "out", root)
    got = {r["id"]: r for r in _read_split(str(tmp_path / "out"), "train")}
    _check_audio(got, samples)
    assert got["s1a"]["text"] == "the first half"  # the first of the two s1a
    assert (got["s1b"]["speaker"], got["s2r"]["text"]) == ("spk2", "the right channel")
    skipped = {k: v["count"] for k, v in report["skipped"].items()}
    assert skipped == {
        "segment_out_of_range": 1,  # s1past
        "bad_offset_or_duration": 2,  # s1neg, s1zero
        "empty_transcript": 1,
        "duplicate_id": 1,
        "unknown_recording": 1,
        "channel_out_of_range": 1,
        "missing_audio": 1,
        "unsupported_audio_source": 1,  # http
        "pipe_not_allowed": 1,  # a command source without --allow_pipes
    }, report["skipped"]
    assert report["skipped"]["unknown_recording"]["examples"] == ["s9"]
    # The supervisions file as --input finds its recordings by name, too.
    again = _prepare(root / "supervisions.jsonl.gz", tmp_path / "again", root)
    assert again["skipped"] == report["skipped"]


def test_cuts_prepare_and_unsupported_cuts_are_counted(inputs, tmp_path):
    root, samples = inputs
    report = _prepare(root / "cuts.jsonl.gz", tmp_path / "out", root)
    got = {r["id"]: r for r in _read_split(str(tmp_path / "out"), "train")}
    _check_audio(got, samples, prefix="cut-")
    assert got["cut-s2m"]["text"] == "both channels"
    skipped = {k: v["count"] for k, v in report["skipped"].items()}
    assert skipped == {
        "missing_transcript": 1,  # a cut without supervisions
        "unsupported_lhotse_cut": 1,  # a MixedCut
        "unsupported_lhotse_transform": 1,  # a speed-perturbed copy
    }, report["skipped"]


def test_malformed_lines_and_duplicate_recordings_in_plain_jsonl(inputs, tmp_path):
    root, _ = inputs
    for name, extra in (
        ("recordings", ["{not json", '{"id": "rec1", "sources": []}']),
        ("supervisions", ["[1, 2]", '{"id": "x", "recording_id": "rec2", "channel": "left"}']),
    ):
        with gzip.open(root / f"{name}.jsonl.gz", "rt") as f:
            lines = f.read().splitlines() + extra
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    report = _prepare(root / "recordings.jsonl", tmp_path / "out", root)
    assert len(_read_split(str(tmp_path / "out"), "train")) == len(WANT)
    skipped = report["skipped"]
    assert skipped["malformed_lhotse_line"]["count"] == 3, skipped
    assert skipped["duplicate_recording_id"] == {"count": 1, "examples": ["recordings.jsonl:7"]}


def test_input_mistakes_are_one_line(inputs, tmp_path):
    root, _ = inputs
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(root / "recordings.jsonl.gz", alone / "recordings.jsonl.gz")
    with pytest.raises(PrepareError, match="Lhotse supervisions manifest not found: .*alone"):
        _prepare(alone / "recordings.jsonl.gz", tmp_path / "o", root)
    with pytest.raises(PrepareError, match="Lhotse manifest not found"):
        _prepare(root / "nope.jsonl.gz", tmp_path / "o", root)
    (root / "other.jsonl").write_text('{"audio_filepath": "a.wav", "text": "x"}\n')
    with pytest.raises(PrepareError, match="not a Lhotse CutSet, RecordingSet or Supervision"):
        _prepare(root / "other.jsonl", tmp_path / "o", root)
