"""Sizes checked from headers before anything is read: audio files longer than
--max_duration (by the sound file's header) and WebDataset text members bigger than
MAX_TEXT_BYTES (by the tar member's header) are skipped with a reason, unread."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
import soundfile as sf

from data_prep.config import parse_args
from data_prep.readers import webdataset
from data_prep.readers.audio import load_item_audio
from data_prep.readers.common import TOO_LONG_AUDIO, AudioError, Item


def test_a_file_longer_than_max_duration_is_skipped_by_its_header(tmp_path, monkeypatch):
    path = str(tmp_path / "long.wav")
    sf.write(path, np.zeros(3 * 16000, np.float32), 16000)
    args = ["p", "--input", "i", "--output", "o", "--split", "s", "--max_duration", "2"]
    cfg = parse_args(args)[0]
    item = Item("u", path, "t", "s")
    audio, rate = load_item_audio(item._replace(end=1.5), cfg)  # a segment: read as before
    assert rate == 16000 and len(audio) == 24000

    def no_read(*a, **k):
        raise AssertionError("read whole before its size was checked")

    monkeypatch.setattr(sf, "read", no_read)
    with pytest.raises(AudioError, match="3.0 s by its header: over 2.0 s") as e:
        load_item_audio(item, cfg)
    assert e.value.reason == TOO_LONG_AUDIO == "too_long"  # validate.TOO_LONG's key


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_an_oversized_webdataset_text_member_is_skipped_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(webdataset, "MAX_TEXT_BYTES", 64)
    wav = io.BytesIO()
    sf.write(wav, np.zeros(1600, np.float32), 16000, format="WAV")
    shard = tmp_path / "s.tar"
    shard.write_bytes(_tar([
        ("a.wav", wav.getvalue()), ("a.txt", b"hello"),
        ("b.wav", wav.getvalue()), ("b.txt", b"x" * 65),
        ("c.wav", wav.getvalue()), ("c.json", b'{"text": "' + b"y" * 64 + b'"}'),
    ]))  # fmt: skip
    items = list(webdataset.read_shard((0, str(shard))))
    assert [(i.id, i.text, i.error) for i in items] == [
        ("a", "hello", None),
        ("b", None, webdataset.OVERSIZED_TEXT),
        ("c", None, webdataset.OVERSIZED_TEXT),
    ]
