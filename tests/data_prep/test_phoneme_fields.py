"""Phoneme fields in prepared data: their checks (data_prep/phoneme_fields.py), the manifest
reader, and prepare end to end with every skip reason, --require_phonemes and the
inventory."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
from array_record.python.array_record_module import ArrayRecordReader

from data_prep import phoneme_fields as pf
from data_prep import prepare as prep
from data_prep.config import parse_args
from data_prep.readers.common import PrepareError
from data_prep.readers.manifest import parse_manifest_line
from jaxspeech.data import records

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.mark.parametrize(
    "phonemes,ends,expected",
    [
        (None, None, (None, None, None)),
        ("_ a _", [0.1, 0.2, 0.5], (("_", "a", "_"), (0.1, 0.2, 0.5), None)),
        (["_", "a"], [0, 1], (("_", "a"), (0.0, 1.0), None)),
        ("_ a", None, (None, None, pf.PHONEMES_WITHOUT_ENDS)),
        (None, [0.1], (None, None, pf.ENDS_WITHOUT_PHONEMES)),
        ("_ a _", [0.1, 0.5], (None, None, pf.PHONEME_COUNT_MISMATCH)),
        ("_ a", [0.2, 0.1], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_ a", [-0.1, 0.1], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_ a", [0.1, "0.2"], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_ a", [0.1, True], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_ a", [0.1, float("nan")], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_ a", [], (None, None, pf.BAD_PHONEME_ENDS)),
        ("_  a", [0.1, 0.2, 0.3], (None, None, pf.BAD_PHONEMES)),  # an empty token
        (["_", "a b"], [0.1, 0.2], (None, None, pf.BAD_PHONEMES)),
        (["_", "a\tb"], [0.1, 0.2], (None, None, pf.BAD_PHONEMES)),
        ("", [0.1], (None, None, pf.BAD_PHONEMES)),
        (3, [0.1], (None, None, pf.BAD_PHONEMES)),
    ],
)
def test_parse_phoneme_fields(phonemes, ends, expected):
    assert pf.parse_phoneme_fields(phonemes, ends) == expected


def test_fit_ends():
    assert pf.fit_ends((0.1, 0.5), 0.5) == (0.1, 0.5)
    assert pf.fit_ends((0.1, 0.3, 0.62), 0.6) == (round(0.1 * 0.6 / 0.62, 6), 0.290323, 0.6)
    assert pf.fit_ends((0.1, 0.54), 0.5) == (round(0.1 * 0.5 / 0.54, 6), 0.5)  # within 0.05 s
    assert pf.fit_ends((0.1, 0.56), 0.5) is None
    assert pf.fit_ends((0.0,), 0.01) is None  # nothing to scale


def test_manifest_reader_keeps_the_fields():
    line = {"audio_filepath": "a.wav", "text": "hi", "phonemes": "_ h aI _"}
    line["phoneme_ends"] = [0.1, 0.2, 0.3, 0.4]
    item = parse_manifest_line(json.dumps(line).encode(), 1, "m.jsonl", "/data")
    assert item.error is None and item.phonemes == ("_", "h", "aI", "_")
    assert item.phoneme_ends == (0.1, 0.2, 0.3, 0.4)
    del line["phoneme_ends"]
    item = parse_manifest_line(json.dumps(line).encode(), 2, "m.jsonl", "/data")
    assert item.error == pf.PHONEMES_WITHOUT_ENDS and item.id == "a"
    plain = parse_manifest_line(b'{"audio_filepath": "a.wav", "text": "hi"}', 3, "m", "/d")
    assert plain.error is None and plain.phonemes is None and plain.phoneme_ends is None


def _tone(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)).astype(
        np.float32
    )


# id -> (seconds of audio, phonemes, phoneme_ends, the reason it is skipped or None).
LINES = {
    "good": (0.5, "_ a b _", [0.1, 0.2, 0.4, 0.5], None),
    "rescaled": (0.6, ["_", "c", "_"], [0.1, 0.3, 0.62], None),
    "asr": (0.5, None, None, None),  # no phonemes: an ASR record unless they are required
    "no_ends": (0.5, "_ a _", None, pf.PHONEMES_WITHOUT_ENDS),
    "no_phonemes": (0.5, None, [0.1, 0.5], pf.ENDS_WITHOUT_PHONEMES),
    "count": (0.5, "_ a _", [0.1, 0.5], pf.PHONEME_COUNT_MISMATCH),
    "decreasing": (0.5, "_ a _", [0.2, 0.1, 0.5], pf.BAD_PHONEME_ENDS),
    "negative": (0.5, "_ a _", [-0.1, 0.1, 0.5], pf.BAD_PHONEME_ENDS),
    "too_far": (0.5, "_ a _", [0.1, 0.2, 0.7], pf.PHONEME_DURATION_MISMATCH),
    "space": (0.5, ["_", "a b", "_"], [0.1, 0.2, 0.5], pf.BAD_PHONEMES),
    "double_space": (0.5, "_ a  _", [0.1, 0.2, 0.3, 0.5], pf.BAD_PHONEMES),
}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tts")
    rows = []
    for i, (item_id, (seconds, phonemes, ends, _)) in enumerate(LINES.items()):
        sf.write(str(root / f"{item_id}.wav"), _tone(seconds, i), 16000, subtype="PCM_16")
        row = {"audio_filepath": f"{item_id}.wav", "text": "some words", "speaker": "s"}
        if phonemes is not None:
            row["phonemes"] = phonemes
        if ends is not None:
            row["phoneme_ends"] = ends
        rows.append(json.dumps(row))
    (root / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    return str(root / "manifest.jsonl")


def _prepare(manifest: str, output: str, *extra: str) -> dict:
    argv = ["prepare", "--input", manifest, "--output", output, "--split", "train"]
    return prep.prepare([*argv, "--notrain_tokenizer", *extra, *IN_MEMORY])


def _records(output: str) -> dict[str, dict]:
    out = {}
    for path in records.read_split_index(output, "train").shard_paths:
        reader = ArrayRecordReader(path)
        for data in reader.read_all():
            rec = records.decode_record(data)
            out[rec["id"]] = rec
        reader.close()
    return out


def _expected_skips(extra: dict[str, str]) -> dict[str, dict]:
    skipped: dict[str, list[str]] = {}
    for item_id, (*_, reason) in LINES.items():
        reason = extra.get(item_id, reason)
        if reason is not None:
            skipped.setdefault(reason, []).append(item_id)
    return {r: {"count": len(ids), "examples": sorted(ids)} for r, ids in skipped.items()}


def test_prepare_counts_every_reason_and_writes_the_inventory(manifest, tmp_path):
    report = _prepare(manifest, str(tmp_path))
    assert report["skipped"] == _expected_skips({})
    assert report["num_written"] == 3 and report["num_input"] == len(LINES)
    assert report["phonemes"] == {"utterances": 2, "utterances_without": 1, "num_phonemes": 4}
    with open(tmp_path / "train" / pf.INVENTORY_FILE) as f:
        inventory = json.load(f)
    assert inventory["phonemes"] == {"_": 4, "a": 1, "b": 1, "c": 1}
    assert list(inventory["phonemes"]) == sorted(inventory["phonemes"])
    recs = _records(str(tmp_path))
    assert recs["good"]["phonemes"] == "_ a b _"
    assert recs["good"]["phoneme_ends"] == [0.1, 0.2, 0.4, 0.5]
    # Within the tolerance: rescaled to end exactly with the audio.
    assert recs["rescaled"]["phonemes"] == "_ c _"
    assert recs["rescaled"]["phoneme_ends"] == [0.096774, 0.290323, 0.6]
    assert recs["rescaled"]["phoneme_ends"][-1] == recs["rescaled"]["duration"]
    assert "phonemes" not in recs["asr"] and "phoneme_ends" not in recs["asr"]


def test_require_phonemes(manifest, tmp_path):
    report = _prepare(manifest, str(tmp_path), "--require_phonemes")
    assert report["skipped"] == _expected_skips({"asr": pf.MISSING_PHONEMES})
    assert sorted(_records(str(tmp_path))) == ["good", "rescaled"]
    assert report["phonemes"]["utterances_without"] == 0
    with pytest.raises(PrepareError, match="--require_phonemes needs --format manifest"):
        parse_args(
            ["p", "--format", "kaldi", "--input", "x", "--output", "o", "--split", "s"]
            + ["--require_phonemes"]
        )


def test_inventory_of_an_asr_split_is_none():
    summary = pf.PhonemeInventoryFn()
    acc = summary.add_input(summary.create_accumulator(), ())
    assert pf.inventory(summary.extract_output(acc)) is None
