"""The synthesizer's data: durations from phoneme ends against a numpy loop, F0 against
librosa's YIN, the loader's batch against a numpy re-read of the records, bad records
skipped with their reasons, and the run's tables (a split without phonemes refused in one
line)."""

from __future__ import annotations

import json
import os
import shutil

import librosa
import numpy as np
import pytest

from jaxspeech.common.errors import UserError
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.plan import PAD_INDEX, BucketSpec, PlannedBatch
from jaxspeech.metrics.speech import F0_MAX_HZ, F0_MIN_HZ
from jaxspeech.tts import assets as tts_assets
from jaxspeech.tts import batch as tts_batch
from tests.tts import corpus

SR, HOP = corpus.SR, corpus.HOP


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return corpus.write_corpus(str(tmp_path_factory.mktemp("tts") / "shards"))


# ---------------------------------------------------------------- durations
def _durations_loop(ends, num_samples, sr, hop):
    """Frame t (centred on sample t * hop) belongs to the first phoneme whose end, rounded
    to frames (half up), lies after t; frames past every rounded end go to the last."""
    t_total = 1 + num_samples // hop
    rounded = [int(np.floor(e * sr / hop + 0.5)) for e in ends]
    out = [0] * len(ends)
    for t in range(t_total):
        k = next((k for k, r in enumerate(rounded) if t < min(r, t_total)), len(ends) - 1)
        out[k] += 1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_frame_durations_against_a_loop(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 12))
    num_samples = int(rng.integers(HOP, 40 * HOP))
    duration = num_samples / SR
    ends = np.sort(rng.uniform(0, duration, k))
    ends[-1] = duration
    if seed % 2:  # ends on exact half frames and repeated ends (0-frame phonemes)
        ends = np.sort(np.round(ends * SR / HOP * 2) / 2 * HOP / SR)
        ends[-1] = duration
    got = tts_batch.frame_durations(list(ends), num_samples, SR, HOP)
    assert got.tolist() == _durations_loop(list(ends), num_samples, SR, HOP)
    assert got.sum() == 1 + num_samples // HOP and got.dtype == np.int32 and np.all(got >= 0)


def test_frame_durations_examples():
    # 1000 samples = 7 frames (1 + 1000 // 160); ends 0.02 s = 2 frames, 0.0299 s -> 3.
    assert tts_batch.frame_durations([0.02, 0.0299, 1000 / SR], 1000, SR, HOP).tolist() == [
        2,
        1,
        4,
    ]
    assert tts_batch.frame_durations([1000 / SR], 1000, SR, HOP).tolist() == [7]


# ---------------------------------------------------------------- pitch
def test_frame_f0_is_yin_on_voiced_frames_and_zero_in_silence():
    rng = np.random.default_rng(0)
    tone = corpus._sound("a", 40, 150.0, rng)
    audio = np.concatenate([corpus._sound("_", 20, 150.0, rng), tone]).astype(np.float32)
    f0 = tts_batch.frame_f0(audio, SR, HOP)
    yin = librosa.yin(
        audio, fmin=F0_MIN_HZ, fmax=F0_MAX_HZ, sr=SR, frame_length=1024, hop_length=HOP
    )
    assert f0.shape == (1 + len(audio) // HOP,)
    voiced = f0 > 0
    np.testing.assert_allclose(f0[voiced], yin[voiced], rtol=1e-5)
    assert not voiced[:15].any()  # silence (its windows reach no tone)
    assert voiced[30:-5].all() and np.all(np.abs(f0[30:-5] - 150.0) < 3.0)
    assert not tts_batch.frame_f0(np.zeros(800, np.float32), SR, HOP).any()


# ---------------------------------------------------------------- the loader
def _loader(data, split="train", **kw):
    index = records.read_split_index(data, split)
    table = tts_batch.PhonemeTable.from_inventory(tts_assets.read_inventory(data, split))
    spec = BucketSpec((2.0,), (6,), (12,), SR)
    speakers = tts_batch.speaker_ids(corpus.SPEAKER_F0)
    load = tts_batch.LoadTtsBatch(
        index.shard_paths, index.shard_num_records, table, speakers, spec, HOP, with_text=True, **kw
    )
    return load, table, speakers


def test_loader_batch_against_a_numpy_reread(data):
    load, table, speakers = _loader(data)
    indices = np.array([3, 0, PAD_INDEX, 7, 12, 5])
    batch = load(PlannedBatch(0, indices, np.ones(6, np.float32), 0))
    recs = reader_lib.read_split_records(data, "train", [3, 0, 7, 12, 5])
    frames = 1 + 2 * SR // HOP
    assert batch["pitch"].shape == (6, frames) and batch["tokens"].shape == (6, 12)
    for row, rec in zip([0, 1, 3, 4, 5], recs):
        audio = np.asarray(rec["audio"], np.float32) / 32768.0
        n, phonemes = len(audio), rec["phonemes"].split(" ")
        np.testing.assert_array_equal(batch["audio"][row, :n], audio)
        assert not batch["audio"][row, n:].any() and batch["audio_len"][row] == n
        ids = [table.tokens.index(p) for p in phonemes]
        assert batch["tokens"][row].tolist() == ids + [0] * (12 - len(ids))
        assert (
            batch["token_len"][row] == len(ids)
            and batch["speaker"][row] == speakers[rec["speaker"]]
        )
        expected = _durations_loop(rec["phoneme_ends"], n, SR, HOP)
        assert batch["durations"][row, : len(ids)].tolist() == expected
        assert batch["durations"][row].sum() == 1 + n // HOP
        np.testing.assert_array_equal(
            batch["pitch"][row, : 1 + n // HOP], tts_batch.frame_f0(audio, SR, HOP)
        )
        assert batch["weight"][row] == 1 and batch["id"][row] == rec["id"]
    assert batch["weight"][2] == 0 and not batch["tokens"][2].any() and batch["faults"] == []


def _write_bad_split(root: str) -> None:
    """Three records: good, without phonemes, with ends that do not fit its audio."""
    from array_record.python.array_record_module import ArrayRecordWriter

    split_dir = os.path.join(root, "bad")
    os.makedirs(split_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    audio, tokens, ends = corpus.utterance(rng, corpus.SPEAKER_F0["low"])
    rows = [
        dict(phonemes=tokens, phoneme_ends=ends),
        {},
        dict(phonemes=tokens, phoneme_ends=[e / 2 for e in ends]),
    ]
    writer = ArrayRecordWriter(os.path.join(split_dir, "bad.array_record"), "group_size:1")
    for i, extra in enumerate(rows):
        writer.write(
            records.encode_record(
                id=f"u{i}", audio=audio, sample_rate=SR, text="t", speaker="low", **extra
            )
        )
    writer.close()
    shards = [{"path": "bad.array_record", "num_records": 3, "seconds": 3 * len(audio) / SR}]
    durations = np.full(3, len(audio) / SR)
    records.write_split_index(split_dir, shards, durations, {"sample_rate": SR})


def test_records_without_phonemes_or_with_mismatched_ends_are_skipped_with_a_reason(data, tmp_path):
    _write_bad_split(str(tmp_path))
    index = records.read_split_index(str(tmp_path), "bad")
    _, table, speakers = _loader(data)
    spec = BucketSpec((2.0,), (4,), (12,), SR)
    load = tts_batch.LoadTtsBatch(index.shard_paths, [3], table, speakers, spec, HOP)
    batch = load(PlannedBatch(0, np.array([0, 1, 2, PAD_INDEX]), np.ones(4, np.float32), 0))
    assert batch["weight"].tolist() == [1, 0, 0, 0] and batch["corrupt"].tolist() == [0, 1, 1, 0]
    reasons = {f["record"]: f["error"] for f in batch["faults"]}
    assert set(reasons) == {1, 2}
    assert "no phonemes/phoneme_ends" in reasons[1]
    assert "the last phoneme ends at" in reasons[2] and "but the audio lasts" in reasons[2]
    assert all(f["shard"].endswith("bad.array_record") for f in batch["faults"])


def test_an_unknown_speaker_is_a_fault_in_training_and_an_error_in_evaluation(data):
    load, _, _ = _loader(data, unknown_speaker="error")
    load.speakers.pop("low")
    with pytest.raises(tts_batch.UnknownSpeaker, match="speaker 'low'"):
        load(PlannedBatch(0, np.arange(6), np.ones(6, np.float32), 0))
    load.unknown_speaker = "fault"
    batch = load(PlannedBatch(0, np.arange(6), np.ones(6, np.float32), 0))
    lows = [f for f in batch["faults"] if "speaker 'low'" in f["error"]]
    assert len(lows) == int(np.sum(batch["corrupt"])) > 0


def test_phonemes_past_the_bucket_are_counted_not_truncated(data):
    index = records.read_split_index(data, "train")
    _, table, speakers = _loader(data)
    spec = BucketSpec((2.0,), (2,), (3,), SR)  # 3 phonemes: every record has more
    load = tts_batch.LoadTtsBatch(
        index.shard_paths, index.shard_num_records, table, speakers, spec, HOP
    )
    batch = load(PlannedBatch(0, np.array([0, 1]), np.ones(2, np.float32), 0))
    assert batch["label_overflow"].tolist() == [1, 1] and not batch["weight"].any()
    assert not batch["tokens"].any() and not batch["durations"].any()


# ---------------------------------------------------------------- tables
def test_phoneme_table_reserves_padding_and_unknown():
    table = tts_batch.PhonemeTable.from_inventory(["s", "a", "_"])
    assert table.tokens == ("<pad>", "<unk>", "_", "a", "s")
    assert table.encode(["a", "zz", "_"]).tolist() == [3, 1, 2]


def test_training_on_a_split_without_phonemes_is_refused_in_one_line(tmp_path):
    from configs import tts
    from jaxspeech import tasks

    corpus.write_split(str(tmp_path / "shards"), "train", 1, seed=0, phonemes=False)
    config = tts.get_config("tiny")
    config.data.dir = str(tmp_path / "shards")
    config.train.compile_cache_dir = ""  # this process's cache stays where it is
    with pytest.raises(UserError) as e:
        tasks.train_and_evaluate(config, str(tmp_path / "run"))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{tmp_path}/shards/train has no phoneme")
    assert "--require_phonemes" in message and "config.task=tts" in message
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_an_eval_split_with_an_unknown_voice_is_refused_at_start_up(data, tmp_path):
    from configs import tts
    from jaxspeech.tts.task import TtsTask

    shutil.copytree(data, tmp_path / "shards")
    corpus.write_split(str(tmp_path / "shards"), "dev", 1, seed=2, speakers={"new": 140.0})
    config = tts.get_config("tiny")
    config.data.dir = str(tmp_path / "shards")
    task = TtsTask(config, mesh=None)
    task.install_assets(str(tmp_path / "run"), False)
    with pytest.raises(UserError) as e:
        task.check_eval_settings()
    message = str(e.value)
    assert "\n" not in message and "/dev has 1 speaker the train split lacks (new)" in message
    assert "speaks only its training voices" in message


def test_installed_tables(data, tmp_path):
    from configs import tts

    config = tts.get_config("tiny")
    config.data.dir = data
    got = tts_assets.install_tts_assets(config, str(tmp_path))
    assert got.table.tokens == ("<pad>", "<unk>", *sorted(corpus.PHONEMES))
    assert got.speakers == {"high": 0, "low": 1, "mid": 2}
    # log F0 of the three voices' voiced frames (110, 160, 230 Hz)
    assert np.log(110) < got.pitch_mean < np.log(230) and 0.1 < got.pitch_std < 0.6
    with open(tmp_path / "assets" / "speakers.json") as f:
        assert json.load(f) == ["high", "low", "mid"]
    again = tts_assets.install_tts_assets(config, str(tmp_path))  # a resume reads them back
    assert again.table == got.table and again.pitch_mean == got.pitch_mean


def test_mel_cepstra_of_log_mel_frames_are_those_of_the_waveform():
    """MCD in evaluation compares log-mel frames (the synthesizer has no waveform): their
    cepstra equal `mel_cepstrum`'s of the audio they came from."""
    from jaxspeech.audio import features
    from jaxspeech.metrics.speech import mel_cepstrum, mel_cepstrum_of_log_mel

    audio, _, _ = corpus.utterance(np.random.default_rng(4), 160.0)
    wave = audio.astype(np.float32) / 32768.0
    log_mel = np.asarray(features.log_mel(wave[None]))[0]
    got, want = mel_cepstrum_of_log_mel(log_mel), mel_cepstrum(wave)
    assert got.shape == want.shape == (1 + len(wave) // HOP, 24)
    np.testing.assert_allclose(got, want, atol=2e-3)
