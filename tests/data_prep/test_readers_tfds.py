"""The TFDS reader of data_prep: a locally built TFDS dataset end to end, its reader and
loader without the pipeline, and its errors (split from test_readers.py by format)."""

from __future__ import annotations

import numpy as np
import pytest

from data_prep.config import parse_args
from data_prep.readers.audio import load_item_audio
from data_prep.readers.common import (
    MISSING_AUDIO,
    AudioError,
    PrepareError,
)
from data_prep.readers.tfds import read_tfds_chunk, tfds_audio_to_float, tfds_source
from jaxspeech.data import records
from tests.data_prep.test_prepare import _tone
from tests.data_prep.test_readers import _check_totals, _prepare, _records, _skipped

TFDS_UTTS = [  # (id, text, speaker_id, seconds)
    ("lib-0", "first utterance", 7, 0.5),
    ("lib-1", "second utterance", 7, 0.8),
    ("lib-2", "third one", 9, 0.6),
]


def _build_tfds(data_dir: str) -> None:
    """Two tiny array_record datasets built without TensorFlow.

    tiny_speech: int16 (N,) audio, text, speaker_id, id; "train" has the TFDS_UTTS plus one
    transcript that is not UTF-8, "dev" one more utterance. tiny_stereo: float32 (N, 2) audio
    and text only.
    """
    import tensorflow_datasets as tfds

    features = {
        "tiny_speech": {
            "audio": tfds.features.Tensor(shape=(None,), dtype=np.int16),
            "text": tfds.features.Text(),
            "speaker_id": tfds.features.Scalar(dtype=np.int64),
            "id": tfds.features.Text(),
        },
        "tiny_stereo": {
            "audio": tfds.features.Tensor(shape=(None, 2), dtype=np.float32),
            "text": tfds.features.Text(),
        },
    }

    def speech(split: str):
        utts = TFDS_UTTS if split == "train" else [("dev-0", "a dev utterance", 3, 0.4)]
        for i, (utt, text, speaker, seconds) in enumerate(utts):
            audio = records.to_int16(_tone(seconds, 16000, i))
            yield utt, {"audio": audio, "text": text, "speaker_id": speaker, "id": utt}
        if split == "train":
            audio = records.to_int16(_tone(0.5, 16000, 5))
            yield "bad", {"audio": audio, "text": b"\xff\xfe", "speaker_id": 1, "id": "lib-bad"}

    def stereo(split: str):
        for i in range(2):
            yield i, {"audio": _tone(0.3, 8000, i, channels=2), "text": f"stereo {i}"}

    for name, generate in (("tiny_speech", speech), ("tiny_stereo", stereo)):

        class Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
            VERSION = tfds.core.Version("1.0.0")
            # No code directory: TFDS would look for one (for download checksums) through
            # importlib_resources, which is not installed.
            code_path = None

            def _info(self):
                return tfds.core.DatasetInfo(
                    builder=self, features=tfds.features.FeaturesDict(features[self.name])
                )

            def _split_generators(self, dl_manager):
                splits = ("train", "dev") if self.name == "tiny_speech" else ("train",)
                return {split: self._generate_examples(split) for split in splits}

            def _generate_examples(self, split):
                return generate(split)  # noqa: B023 (built right here, in this iteration)

        Builder.name = name
        Builder(data_dir=data_dir, file_format="array_record").download_and_prepare()


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory) -> str:
    pytest.importorskip("tensorflow_datasets")
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    _build_tfds(data_dir)
    return data_dir


def test_tfds_end_to_end(tfds_dir, tmp_path):
    out = str(tmp_path / "out")
    rate = ["--tfds_sample_rate", "16000"]  # A Tensor feature has no sample rate.
    report = _prepare("tfds", "tiny_speech", out, "--tfds_data_dir", tfds_dir, *rate)
    assert _skipped(report) == {"malformed_tfds_text": (1, ["lib-bad"])}
    assert report["num_input"] == 4 and report["num_written"] == 3
    _check_totals(report)
    recs = _records(out)
    assert sorted(recs) == [u[0] for u in TFDS_UTTS]
    for i, (utt, text, speaker, seconds) in enumerate(TFDS_UTTS):
        assert recs[utt]["text"] == text and recs[utt]["speaker"] == str(speaker)
        np.testing.assert_array_equal(
            recs[utt]["audio"], records.to_int16(_tone(seconds, 16000, i))
        )
    # Another TFDS split into --split train; no id feature: ids from the split and index.
    out2 = str(tmp_path / "out2")
    _prepare(
        "tfds",
        "tiny_speech:1.0.0",
        out2,
        "--tfds_data_dir",
        tfds_dir,
        "--tfds_split",
        "dev",
        "--tfds_id_key",
        "text",
        "--tfds_speaker_key",
        "text",
        "--notrain_tokenizer",
        *rate,
    )
    [rec] = _records(out2).values()
    assert rec["id"] == rec["speaker"] == rec["text"] == "a dev utterance"


def test_tfds_reader_and_loader_without_pipeline(tfds_dir):
    """Float (N, 2) audio without id/speaker features, read chunk by chunk and loaded."""
    argv = ["p", "--format", "tfds", "--input", "tiny_stereo", "--output", "o", "--split", "train"]
    cfg = parse_args([*argv, "--tfds_data_dir", tfds_dir, "--tfds_sample_rate", "8000"])[0]
    source = tfds_source(cfg)
    assert (source.id_key, source.speaker_key, source.num_records) == (None, None, 2)
    items = list(read_tfds_chunk((0, 2), source))
    assert [(i.id, i.speaker, i.audio_path) for i in items] == [
        ("train-00000000", "unknown", "tfds:0"),
        ("train-00000001", "unknown", "tfds:1"),
    ]
    for item in items:
        audio, rate = load_item_audio(item, cfg)
        seed = int(item.text.split()[1])
        assert rate == 8000
        np.testing.assert_array_equal(audio, _tone(0.3, 8000, seed, channels=2))
    with pytest.raises(AudioError) as e:
        load_item_audio(items[0]._replace(audio_path="tfds:7"), cfg)
    assert e.value.reason == MISSING_AUDIO


def test_tfds_clear_errors(tfds_dir, tmp_path):
    def run(name: str, *extra: str) -> None:
        _prepare("tfds", name, str(tmp_path / "o"), "--tfds_data_dir", tfds_dir, *extra)

    with pytest.raises(PrepareError, match="'no_such_ds' .* not found"):
        run("no_such_ds")
    with pytest.raises(PrepareError, match=r"no split 'test' .*splits: dev, train"):
        run("tiny_speech", "--tfds_split", "test")
    with pytest.raises(PrepareError, match=r"no feature 'wave'.*features: audio, id, spe"):
        run("tiny_speech", "--tfds_audio_key", "wave")
    with pytest.raises(PrepareError, match="no feature 'spk' .--tfds_speaker_key"):
        run("tiny_speech", "--tfds_speaker_key", "spk")  # Explicit: must exist.
    with pytest.raises(PrepareError, match="pass --tfds_sample_rate"):
        run("tiny_stereo")


def test_tfds_audio_to_float():
    i16 = np.array([-32768, 0, 16384], np.int16)
    np.testing.assert_array_equal(tfds_audio_to_float(i16)[:, 0], [-1.0, 0.0, 0.5])
    i32 = np.array([[-(2**31), 2**30]], np.int32)
    np.testing.assert_array_equal(tfds_audio_to_float(i32), [[-1.0, 0.5]])
    f64 = np.zeros((4, 3))
    assert tfds_audio_to_float(f64).dtype == np.float32
    for bad in (np.zeros((2, 2, 2), np.float32), np.zeros(3, np.uint8)):
        with pytest.raises(AudioError):
            tfds_audio_to_float(bad)
