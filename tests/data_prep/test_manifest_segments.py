"""NeMo segment manifests: ``offset`` (and ``duration``) cut an item out of a longer
recording; bad offsets and segments past the audio are skipped and counted."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from data_prep.readers.manifest import BAD_SEGMENT, parse_manifest_line
from tests.data_prep.test_prepare import IN_MEMORY, _read_split, _run


@pytest.mark.parametrize(
    "entry, expected",
    [
        ({"offset": 1.5, "duration": 2.0}, ("long-0000150", 1.5, 3.5)),
        ({"offset": 0, "duration": 1}, ("long-0000000", 0.0, 1.0)),
        ({"offset": 2.25}, ("long-0000225", 2.25, None)),  # to the end of the recording
        ({"offset": 2.0, "id": "seg7"}, ("seg7", 2.0, None)),
        ({"offset": None, "duration": 9.0}, ("long", 0.0, None)),  # duration alone: measured
        ({"duration": 9.0}, ("long", 0.0, None)),
        ({"offset": -0.5, "duration": 1.0}, BAD_SEGMENT),
        ({"offset": "1.0", "duration": 1.0}, BAD_SEGMENT),
        ({"offset": 1.0, "duration": 0}, BAD_SEGMENT),
        ({"offset": 1.0, "duration": "x"}, BAD_SEGMENT),
        ({"offset": True}, BAD_SEGMENT),
    ],
)
def test_offset_and_duration_give_the_segment(entry, expected):
    line = json.dumps({"audio_filepath": "long.wav", "text": "t"} | entry).encode()
    item = parse_manifest_line(line, 3, "m.jsonl", "/m")
    if expected == BAD_SEGMENT:
        assert (item.id, item.error) == ("m.jsonl:3", BAD_SEGMENT)
    else:
        assert (item.id, item.start, item.end, item.error) == (*expected, None)


def test_segments_of_one_recording_prepare_as_items(tmp_path):
    """A 3 s recording cut into two segments by offset; a segment past its end and a
    negative offset are skipped with their reasons; the records hold exactly the
    recording's samples of each segment."""
    rate = 16000
    audio = (np.random.default_rng(0).uniform(-0.5, 0.5, 3 * rate) * 32767).astype(np.int16)
    sf.write(str(tmp_path / "long.wav"), audio, rate, subtype="PCM_16")
    lines = [
        {"audio_filepath": "long.wav", "text": "first part", "offset": 0.0, "duration": 1.25},
        {"audio_filepath": "long.wav", "text": "second part", "offset": 1.25, "duration": 1.0},
        {"audio_filepath": "long.wav", "text": "past the end", "offset": 3.5, "duration": 1.0},
        {"audio_filepath": "long.wav", "text": "negative", "offset": -1.0, "duration": 1.0},
    ]
    manifest = tmp_path / "segments.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    report = _run(str(manifest), str(out), "--num_shards", "1", *IN_MEMORY)
    got = {r["id"]: r for r in _read_split(str(out), "train")}
    assert sorted(got) == ["long-0000000", "long-0000125"]
    np.testing.assert_array_equal(got["long-0000000"]["audio"], audio[: int(1.25 * rate)])
    np.testing.assert_array_equal(
        got["long-0000125"]["audio"], audio[int(1.25 * rate) : int(2.25 * rate)]
    )
    assert got["long-0000125"]["text"] == "second part"
    skipped = report["skipped"]
    assert skipped["segment_out_of_range"]["count"] == 1
    assert skipped[BAD_SEGMENT] == {"count": 1, "examples": ["segments.jsonl:4"]}
