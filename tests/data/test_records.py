"""Tests of the shard record schema and the split index."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from jaxspeech.data import records


def _audio(n: int = 8000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-32768, 32768, size=n, dtype=np.int64).astype(np.int16)


@pytest.mark.parametrize("audio_format", ["pcm_s16le", "flac"])
def test_round_trip(audio_format):
    audio = _audio()
    data = records.encode_record(
        id="spk1/utt-7",
        audio=audio,
        sample_rate=16000,
        text="Héllo, wörld ✓",
        speaker="spk1",
        audio_format=audio_format,
    )
    rec = records.decode_record(data)
    assert set(rec) == {"id", "audio", "sample_rate", "text", "speaker", "duration"}
    assert rec["audio"].dtype == np.int16 and rec["audio"].shape == (8000,)
    np.testing.assert_array_equal(rec["audio"], audio)
    assert (rec["id"], rec["sample_rate"], rec["text"], rec["speaker"]) == (
        "spk1/utt-7",
        16000,
        "Héllo, wörld ✓",
        "spk1",
    )
    assert rec["duration"] == 0.5
    assert records.decode_header(data)["audio_format"] == audio_format


def test_flac_is_smaller_on_smooth_audio():
    t = np.arange(16000) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    pcm = records.encode_record(id="a", audio=audio, sample_rate=16000, text="x", speaker="s")
    flac = records.encode_record(
        id="a", audio=audio, sample_rate=16000, text="x", speaker="s", audio_format="flac"
    )
    assert len(flac) < len(pcm) / 2
    np.testing.assert_array_equal(
        records.decode_record(flac)["audio"], records.decode_record(pcm)["audio"]
    )


def test_float_audio_is_scaled_and_clipped():
    audio = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.7, -3.0, 1 / 32768], np.float32)
    rec = records.decode_record(
        records.encode_record(id="f", audio=audio, sample_rate=8000, text="t", speaker="s")
    )
    np.testing.assert_array_equal(rec["audio"], [0, 16384, -16384, 32767, -32768, 32767, -32768, 1])
    # An int16 signal read as float (k / 32768) converts back exactly.
    ints = _audio(1000, seed=1)
    np.testing.assert_array_equal(records.to_int16(ints.astype(np.float32) / 32768), ints)


def test_zero_length_audio_round_trips_in_both_formats():
    for fmt in records.AUDIO_FORMATS:
        data = records.encode_record(
            id="z",
            audio=np.zeros(0, np.int16),
            sample_rate=16000,
            text="",
            speaker="s",
            audio_format=fmt,
        )
        rec = records.decode_record(data)
        assert rec["audio"].shape == (0,) and rec["duration"] == 0.0


def test_header_only_decode_does_not_touch_the_audio():
    data = records.encode_record(
        id="h", audio=_audio(1600), sample_rate=16000, text="hi", speaker="s"
    )
    header_len = struct.unpack_from("<I", data, 4)[0]
    header_only = data[: 8 + header_len]  # No payload at all.
    assert records.decode_header(header_only) == {
        "id": "h",
        "sample_rate": 16000,
        "text": "hi",
        "speaker": "s",
        "duration": 0.1,
        "num_samples": 1600,
        "audio_format": "pcm_s16le",
    }
    with pytest.raises(ValueError, match="payload has 0 bytes"):
        records.decode_record(header_only)


def _good() -> bytes:
    return records.encode_record(
        id="c", audio=_audio(100), sample_rate=16000, text="t", speaker="s"
    )


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda d: b"", "shorter than"),
        (lambda d: b"XXXX" + d[4:], "bad magic"),
        (lambda d: d[:4] + struct.pack("<I", 10**6) + d[8:], "exceeds"),
        (lambda d: d[:8] + b"\xff" * 5 + d[13:], "unreadable JSON header"),
        (lambda d: d + b"\x00", "payload has"),
        (lambda d: d[:-1], "payload has"),
    ],
)
def test_corrupt_bytes_raise(corrupt, message):
    with pytest.raises(ValueError, match=message):
        records.decode_record(corrupt(_good()))


def test_header_missing_keys_and_corrupt_flac_raise():
    header = json.dumps({"id": "x"}).encode()
    with pytest.raises(ValueError, match="lacks"):
        records.decode_record(records.MAGIC + struct.pack("<I", len(header)) + header)
    flac = records.encode_record(
        id="f", audio=_audio(4000), sample_rate=16000, text="t", speaker="s", audio_format="flac"
    )
    header_len = struct.unpack_from("<I", flac, 4)[0]
    broken = flac[: 8 + header_len] + b"\x00" * (len(flac) - 8 - header_len)
    with pytest.raises(ValueError, match="corrupt record 'f'"):
        records.decode_record(broken)


def test_bad_inputs_to_encode():
    with pytest.raises(ValueError, match="1-D"):
        records.encode_record(id="x", audio=np.zeros((2, 3)), sample_rate=1, text="", speaker="")
    with pytest.raises(ValueError, match="audio_format"):
        records.encode_record(
            id="x", audio=np.zeros(3), sample_rate=1, text="", speaker="", audio_format="mp3"
        )


def test_split_index_round_trip(tmp_path):
    split_dir = tmp_path / "dev"
    split_dir.mkdir()
    for name in ("dev-00000-of-00002.array_record", "dev-00001-of-00002.array_record"):
        (split_dir / name).write_bytes(b"")
    shards = [
        {"path": "dev-00000-of-00002.array_record", "num_records": 2, "seconds": 3.0},
        {"path": "dev-00001-of-00002.array_record", "num_records": 1, "seconds": 0.5},
    ]
    records.write_split_index(
        str(split_dir), shards, np.array([1.0, 2.0, 0.5]), {"sample_rate": 16000, "x": 1}
    )
    index = records.read_split_index(str(tmp_path), "dev")
    assert index.split == "dev" and index.num_records == 3 and index.seconds == 3.5
    assert index.sample_rate == 16000 and index.shard_num_records == [2, 1]
    assert index.shard_paths == [str(split_dir / s["path"]) for s in shards]
    assert all(os.path.isabs(p) for p in index.shard_paths)
    assert index.durations.dtype == np.float32
    np.testing.assert_array_equal(index.durations, [1.0, 2.0, 0.5])
    with open(split_dir / "index.json") as f:
        on_disk = json.load(f)
    assert on_disk["x"] == 1 and on_disk["shards"] == shards


def test_split_index_rejects_inconsistent_input(tmp_path):
    shards = [{"path": "a.array_record", "num_records": 2, "seconds": 1.0}]
    with pytest.raises(ValueError, match="1 durations for 2 records"):
        records.write_split_index(str(tmp_path), shards, np.ones(1), {"sample_rate": 16000})
    with pytest.raises(ValueError, match="sample_rate"):
        records.write_split_index(str(tmp_path), shards, np.ones(2), {})


def test_missing_split_says_how_to_prepare_it(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        records.read_split_index(str(tmp_path / "data"), "train")
    message = str(info.value)
    assert str(tmp_path / "data" / "train" / "index.json") in message
    assert "python -m data_prep.prepare" in message


def test_phoneme_fields_round_trip_and_absent_fields_change_nothing():
    audio = _audio(8000)
    base = dict(id="u1", audio=audio, sample_rate=16000, text="hello", speaker="s")
    plain = records.encode_record(**base)
    # Without the fields: the header of before they existed, byte for byte.
    header = {
        "id": "u1",
        "sample_rate": 16000,
        "text": "hello",
        "speaker": "s",
        "duration": 0.5,
        "num_samples": 8000,
        "audio_format": "pcm_s16le",
    }
    header_bytes = json.dumps(header, ensure_ascii=False).encode()
    assert plain == b"JSR1" + struct.pack("<I", len(header_bytes)) + header_bytes + audio.tobytes()
    assert "phonemes" not in records.decode_record(plain)
    assert "phonemes" not in records.decode_header(plain)
    ends = [0.1, 0.2, 0.35, 0.5]
    data = records.encode_record(**base, phonemes="_ h @ _", phoneme_ends=np.array(ends))
    rec = records.decode_record(data)
    assert rec["phonemes"] == "_ h @ _" and rec["phoneme_ends"] == ends
    np.testing.assert_array_equal(rec["audio"], audio)
    assert records.decode_header(data)["phoneme_ends"] == ends
    assert data.endswith(audio.tobytes())


def test_phoneme_fields_go_together():
    base = dict(id="u1", audio=_audio(800), sample_rate=16000, text="hi", speaker="s")
    with pytest.raises(ValueError, match="both or neither"):
        records.encode_record(**base, phonemes="a b")
    with pytest.raises(ValueError, match="both or neither"):
        records.encode_record(**base, phoneme_ends=[0.05])
    with pytest.raises(ValueError, match="1 phoneme_ends for 2 phonemes"):
        records.encode_record(**base, phonemes="a b", phoneme_ends=[0.05])
    # A header with one field and not the other is corrupt.
    header = json.dumps(
        {
            "id": "x",
            "sample_rate": 16000,
            "text": "t",
            "speaker": "s",
            "duration": 0.0,
            "num_samples": 0,
            "audio_format": "pcm_s16le",
            "phonemes": "a",
        }
    ).encode()
    with pytest.raises(ValueError, match="phonemes without phoneme_ends"):
        records.decode_record(b"JSR1" + struct.pack("<I", len(header)) + header)
