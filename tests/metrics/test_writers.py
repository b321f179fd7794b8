"""MetricWriter events read back from disk.

TensorBoard itself is not installed, so the event file is parsed here: a
TFRecord stream (u64 length, u32 masked CRC, payload, u32 masked CRC) of
`Event` protos, decoded with tensorboardX's own generated protobuf classes.
"""

import glob
import io
import os
import struct

import jax
import numpy as np
import pytest
import soundfile as sf
from tensorboardX.crc32c import crc32c
from tensorboardX.proto.event_pb2 import Event

from jaxspeech.metrics.images import spectrogram_image
from jaxspeech.metrics.writers import MetricWriter


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(logdir: str) -> list[Event]:
    """All Event protos of the (single) event file in logdir, CRCs checked."""
    (path,) = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    return read_event_file(path)


def read_event_file(path: str) -> list[Event]:
    """All Event protos of one event file, CRCs checked."""
    events = []
    with open(path, "rb") as f:
        while header := f.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            assert struct.unpack("<I", header[8:])[0] == _masked_crc(header[:8])
            payload = f.read(length)
            assert struct.unpack("<I", f.read(4))[0] == _masked_crc(payload)
            events.append(Event.FromString(payload))
    return events


def summary_values(events: list[Event]) -> list[tuple[int, object]]:
    return [(e.step, v) for e in events if e.HasField("summary") for v in e.summary.value]


def test_writer_image_text_scalars_read_back(tmp_path):
    Image = pytest.importorskip("PIL.Image")  # tensorboardX encodes images with Pillow
    logdir = str(tmp_path / "tb")
    feats = np.zeros((6, 4), np.float32)
    feats[:, 0] = 1.0
    img = spectrogram_image(feats, lo=0.0, hi=1.0)  # (4, 6, 3)

    w = MetricWriter(logdir)
    w.scalars(3, {"train/loss": 1.25})
    w.image(3, "eval/spectrogram", img)
    w.text(3, "eval/samples", "| ref | hyp |\n|---|---|\n| a cat | a cap |")
    w.close()

    values = summary_values(read_events(logdir))
    by_tag = {v.tag: (step, v) for step, v in values}
    assert set(by_tag) == {"train/loss", "eval/spectrogram", "eval/samples/text_summary"}

    step, v = by_tag["train/loss"]
    assert step == 3 and v.simple_value == pytest.approx(1.25)

    step, v = by_tag["eval/spectrogram"]
    assert step == 3
    assert (v.image.height, v.image.width, v.image.colorspace) == (4, 6, 3)
    decoded = np.asarray(Image.open(io.BytesIO(v.image.encoded_image_string)).convert("RGB"))
    np.testing.assert_array_equal(decoded, img)  # PNG is lossless: exact pixels back

    step, v = by_tag["eval/samples/text_summary"]
    assert step == 3
    assert v.metadata.plugin_data.plugin_name == "text"
    assert v.tensor.string_val[0].decode() == "| ref | hyp |\n|---|---|\n| a cat | a cap |"


def test_writer_audio_reads_back_as_a_wav_at_its_rate(tmp_path):
    logdir = str(tmp_path / "tb")
    wave = 0.5 * np.sin(2 * np.pi * 440 * np.arange(1600) / 16000).astype(np.float32)
    wave[0] = 1.7  # louder than full scale: clipped, not refused
    w = MetricWriter(logdir)
    w.audio(7, "synthesis/dev/u1", wave, 16000)
    with pytest.raises(ValueError, match="finite"):
        w.audio(7, "bad", np.full(4, np.nan, np.float32), 16000)
    w.close()
    ((step, v),) = summary_values(read_events(logdir))
    assert step == 7 and v.tag == "synthesis/dev/u1"
    assert (v.audio.sample_rate, v.audio.length_frames, v.audio.num_channels) == (16000, 1600, 1)
    back, sr = sf.read(io.BytesIO(v.audio.encoded_audio_string), dtype="float32")
    assert sr == 16000 and back[0] == pytest.approx(1.0, abs=1e-4)
    np.testing.assert_allclose(back[1:], wave[1:], atol=1e-4)


def test_writer_image_rejects_non_uint8(tmp_path):
    w = MetricWriter(str(tmp_path))
    with pytest.raises(ValueError, match="uint8"):
        w.image(0, "x", np.zeros((2, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        w.image(0, "x", np.zeros((2, 2), np.uint8))
    w.close()


def test_writer_is_noop_off_process_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    logdir = tmp_path / "tb"
    w = MetricWriter(str(logdir))
    w.scalars(0, {"a": 1.0})
    w.image(0, "img", np.zeros((2, 2, 3), np.uint8))
    w.text(0, "txt", "hello")
    w.flush()
    w.close()
    assert not logdir.exists()
