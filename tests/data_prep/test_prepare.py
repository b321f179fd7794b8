"""End-to-end tests of data_prep.prepare on a tiny generated corpus with every bad case."""

from __future__ import annotations

import json
import os

import librosa
import numpy as np
import pytest
import soundfile as sf
from array_record.python.array_record_module import ArrayRecordReader

from data_prep import prepare as prep
from data_prep.config import parse_args
from data_prep.readers.common import PrepareError
from data_prep.readers.manifest import MALFORMED, parse_manifest_line
from data_prep.report import EventSummaryFn
from data_prep.runner import pipeline_options
from data_prep.sharding import (
    MAX_SHARDS,
    PSEUDO_SPEAKERS_PER_SHARD,
    default_num_shards,
    group_key,
    place_groups,
)
from data_prep.stats import combine_stats
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer, normalize_text

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
MAX_DURATION = 2.0


def _tone(seconds: float, sample_rate: int, seed: int, channels: int = 1) -> np.ndarray:
    """(N,) or (N, C) float32 sine + noise, well inside [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    x = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    if channels > 1:
        x = np.stack([x * (c + 1) / channels for c in range(channels)], axis=1)
    return x.astype(np.float32)


def _write_int16(path: str, audio: np.ndarray, sample_rate: int) -> None:
    sf.write(path, audio, sample_rate, subtype="PCM_16")


GOOD = {  # id -> (text, seconds)
    "wavs/good0": ("Hello   World", 0.6),
    "wavs/good1": ("the QUICK brown fox", 1.1),
    "wavs/good2": ("jumps over the lazy dog", 0.9),
    "wavs/good3": ("speech recognition", 1.4),
    "wavs/good4": ("jax and beam", 0.5),
    "wavs/good5": ("array record shards", 0.8),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A manifest with six good items, one 8 kHz, one stereo, one of each bad category."""
    root = tmp_path_factory.mktemp("corpus")
    wavs = root / "wavs"
    wavs.mkdir()
    lines = []
    for i, (item_id, (text, seconds)) in enumerate(GOOD.items()):
        name = item_id.split("/")[1] + ".wav"
        _write_int16(str(wavs / name), _tone(seconds, 16000, i), 16000)
        path = str(wavs / name) if i == 0 else f"wavs/{name}"  # One absolute path.
        lines.append(
            {"audio_filepath": path, "text": text, "duration": 99.0, "speaker": f"s{i % 2}"}
        )
    _write_int16(str(wavs / "rate8k.wav"), _tone(1.0, 8000, 10), 8000)
    lines.append({"audio_filepath": "wavs/rate8k.wav", "text": "eight kilo hertz"})
    _write_int16(str(wavs / "stereo.wav"), _tone(0.7, 16000, 11, channels=2), 16000)
    lines.append({"audio_filepath": "wavs/stereo.wav", "text": "two channels", "speaker": "s9"})
    # Bad items, one per category.
    lines.append({"audio_filepath": "wavs/missing.wav", "text": "no file"})
    (wavs / "corrupt.wav").write_bytes(b"RIFF" + bytes(range(200)))
    lines.append({"audio_filepath": "wavs/corrupt.wav", "text": "garbage bytes"})
    sf.write(str(wavs / "empty.wav"), np.zeros((0,), np.int16), 16000, subtype="PCM_16")
    lines.append({"audio_filepath": "wavs/empty.wav", "text": "zero samples"})
    nan = _tone(0.5, 16000, 12)
    nan[100] = np.nan
    sf.write(str(wavs / "nan.wav"), nan, 16000, subtype="FLOAT")
    lines.append({"audio_filepath": "wavs/nan.wav", "text": "not a number"})
    _write_int16(str(wavs / "long.wav"), _tone(MAX_DURATION + 0.5, 16000, 13), 16000)
    lines.append({"audio_filepath": "wavs/long.wav", "text": "far too long"})
    _write_int16(str(wavs / "short.wav"), _tone(0.05, 16000, 14), 16000)
    lines.append({"audio_filepath": "wavs/short.wav", "text": "too short"})
    _write_int16(str(wavs / "blank_text.wav"), _tone(0.5, 16000, 15), 16000)
    lines.append({"audio_filepath": "wavs/blank_text.wav", "text": "  \t "})
    _write_int16(str(wavs / "notext.wav"), _tone(0.5, 16000, 16), 16000)
    lines.append({"audio_filepath": "wavs/notext.wav"})
    lines.append({"audio_filepath": "wavs/good1.wav", "text": "a second entry for good1"})
    text_lines = [json.dumps(entry) for entry in lines]
    text_lines.insert(3, '{"audio_filepath": "wavs/good0.wav", "text": ')  # Line 4: malformed.
    text_lines.insert(5, "")  # A blank line is not an item.
    manifest = root / "manifest.jsonl"
    manifest.write_text("\n".join(text_lines) + "\n")
    return str(manifest)


def _run(manifest: str, output: str, *extra: str, split: str = "train") -> dict:
    argv = ["prepare", "--format", "manifest", "--input", manifest, "--output", output]
    return prep.prepare([*argv, "--split", split, "--max_duration", str(MAX_DURATION), *extra])


def _read_split(output: str, split: str) -> list[dict]:
    index = records.read_split_index(output, split)
    out = []
    for path in index.shard_paths:
        reader = ArrayRecordReader(path)
        out.extend(records.decode_record(b) for b in reader.read_all())
        reader.close()
    return out


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> str:
    output = str(tmp_path_factory.mktemp("out"))
    _run(corpus, output, "--num_shards", "2", *IN_MEMORY)
    return output


def test_report_counts_and_examples(prepared):
    with open(os.path.join(prepared, "train", "prep_report.json")) as f:
        report = json.load(f)
    assert report["skipped"] == {
        "duplicate_id": {"count": 1, "examples": ["wavs/good1"]},
        "empty_transcript": {"count": 2, "examples": ["wavs/blank_text", "wavs/notext"]},
        "malformed_manifest_line": {"count": 1, "examples": ["manifest.jsonl:4"]},
        "missing_audio": {"count": 1, "examples": ["wavs/missing"]},
        "non_finite_samples": {"count": 1, "examples": ["wavs/nan"]},
        "too_long": {"count": 1, "examples": ["wavs/long"]},
        "too_short": {"count": 1, "examples": ["wavs/short"]},
        "undecodable_audio": {"count": 1, "examples": ["wavs/corrupt"]},
        "zero_length": {"count": 1, "examples": ["wavs/empty"]},
    }
    assert report["resampled"] == {"count": 1, "examples": ["wavs/rate8k"]}
    assert report["downmixed"] == {"count": 1, "examples": ["wavs/stereo"]}
    assert report["num_written"] == len(GOOD) + 2
    skipped = sum(entry["count"] for entry in report["skipped"].values())
    assert report["num_input"] == 18 == report["num_written"] + skipped
    assert report["num_shards"] == 2
    assert report["split"] == "train" and report["format"] == "manifest"
    # An ASR split: no item has phonemes, so no inventory and no skip for them.
    assert report["phonemes"] is None
    assert not os.path.exists(os.path.join(prepared, "train", "phonemes.json"))
    assert report["hours_written"] == pytest.approx(
        (sum(s for _, s in GOOD.values()) + 1.0 + 0.7) / 3600, rel=1e-4
    )


def _source_audio(corpus: str, item_id: str) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(
        os.path.join(os.path.dirname(corpus), item_id + ".wav"), dtype="float32", always_2d=True
    )
    return audio, rate


def test_records_equal_sources(corpus, prepared):
    recs = {r["id"]: r for r in _read_split(prepared, "train")}
    assert sorted(recs) == sorted([*GOOD, "wavs/rate8k", "wavs/stereo"])
    for item_id, (text, _) in GOOD.items():
        rec = recs[item_id]
        source, _ = _source_audio(corpus, item_id)
        expected = sf.read(os.path.join(os.path.dirname(corpus), item_id + ".wav"), dtype="int16")[
            0
        ]
        np.testing.assert_array_equal(rec["audio"], expected)
        assert rec["text"] == text  # Raw, not normalized.
        assert rec["sample_rate"] == 16000
        assert rec["duration"] == pytest.approx(source.shape[0] / 16000)
    assert recs["wavs/good0"]["speaker"] == "s0" and recs["wavs/good1"]["speaker"] == "s1"
    assert recs["wavs/rate8k"]["speaker"] == "unknown"
    source_8k, rate = _source_audio(corpus, "wavs/rate8k")
    assert rate == 8000 and abs(recs["wavs/rate8k"]["audio"].size - 2 * source_8k.shape[0]) <= 1
    stereo, _ = _source_audio(corpus, "wavs/stereo")
    np.testing.assert_array_equal(recs["wavs/stereo"]["audio"], records.to_int16(stereo.mean(1)))


def _shard_ids(index: records.SplitIndex) -> list[list[str]]:
    out = []
    for path in index.shard_paths:
        reader = ArrayRecordReader(path)
        out.append([records.decode_header(b)["id"] for b in reader.read_all()])
        reader.close()
    return out


def test_shards_group_speakers_in_seeded_order(corpus, prepared, tmp_path):
    index = records.read_split_index(prepared, "train")
    assert [os.path.basename(p) for p in index.shard_paths] == [
        "train-00000-of-00002.array_record",
        "train-00001-of-00002.array_record",
    ]
    shard_ids = _shard_ids(index)
    speakers = {r["id"]: r["speaker"] for r in _read_split(prepared, "train")}
    shard_of_speaker = {}
    for shard, ids in enumerate(shard_ids):
        for i in ids:
            if speakers[i] != "unknown":
                assert shard_of_speaker.setdefault(speakers[i], shard) == shard, i
        # Inner shuffle: the seeded permutation of the shard's sorted ids.
        order = np.random.default_rng([0, shard, 2]).permutation(len(ids))
        assert ids == [sorted(ids)[k] for k in order]
    # Longest group first to the lightest shard: s1 (3.3 s) alone; s0 (2.0 s), the
    # speakerless 8 kHz item (1.0 s) and s9 (0.7 s) together.
    seconds = sorted(
        round(float(index.durations[a:b].sum()), 2) for a, b in _ranges(index.shard_num_records)
    )
    assert seconds == [3.3, 3.7]
    # Another seed: the same groups, another shard numbering and order.
    other = str(tmp_path / "seed7")
    _run(corpus, other, "--num_shards", "2", "--seed", "7", "--notrain_tokenizer", *IN_MEMORY)
    other_ids = _shard_ids(records.read_split_index(other, "train"))
    assert sorted(map(sorted, other_ids)) == sorted(map(sorted, shard_ids))
    assert other_ids != shard_ids


def test_place_groups_balances_and_keeps_groups_whole():
    rng = np.random.default_rng(0)
    # 3,000 speakers with long-tailed amounts of audio (samples at 16 kHz).
    sizes = (rng.lognormal(mean=np.log(600), sigma=1.0, size=3000) * 16000).astype(int)
    groups = [(f"speaker:{i}", int(n)) for i, n in enumerate(sizes)]
    placement = place_groups(groups, 40, seed=3)
    assert sorted(placement) == sorted(k for k, _ in groups)
    loads = np.zeros(40)
    for key, n in groups:
        loads[placement[key]] += n
    assert loads.max() / loads.mean() < 1.10 and loads.min() / loads.mean() > 0.90
    assert place_groups(groups[::-1], 40, seed=3) == placement  # Input order is moot.
    assert place_groups(groups, 40, seed=4) != placement


def test_group_key_spreads_speakerless_items():
    assert group_key("spk1", "a", 4) == "speaker:spk1"
    keys = {group_key("unknown", f"utt{i}", 4) for i in range(5000)}
    assert len(keys) == PSEUDO_SPEAKERS_PER_SHARD * 4


@pytest.fixture(scope="module")
def many_speakers(tmp_path_factory) -> str:
    """60 speakers with 1-3 utterances of 0.2-0.6 s each."""
    root = tmp_path_factory.mktemp("speakers")
    rng = np.random.default_rng(1)
    lines = []
    for spk in range(60):
        for utt in range(int(rng.integers(1, 4))):
            name = f"s{spk:02d}_{utt}.wav"
            _write_int16(str(root / name), _tone(float(rng.uniform(0.2, 0.6)), 16000, spk), 16000)
            lines.append({"audio_filepath": name, "text": "some words", "speaker": f"s{spk}"})
    (root / "manifest.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(root / "manifest.jsonl")


def test_equal_duration_shards_by_hours_per_shard(many_speakers, tmp_path):
    out = str(tmp_path / "out")
    hours = 5.0 / 3600  # About 5 s of audio per shard.
    report = _run(
        many_speakers, out, "--hours_per_shard", str(hours), "--notrain_tokenizer", *IN_MEMORY
    )
    index = records.read_split_index(out, "train")
    total = float(index.durations.astype(np.float64).sum())
    assert report["num_shards"] == round(total / 5.0) >= 4
    seconds = np.array([sum(index.durations[a:b]) for a, b in _ranges(index.shard_num_records)])
    assert seconds.max() / seconds.mean() < 1.10 and seconds.min() / seconds.mean() > 0.90
    assert report["shard_hours"]["max"] == pytest.approx(seconds.max() / 3600, rel=1e-5)
    recs = _read_split(out, "train")
    shard_of_record = np.repeat(np.arange(len(seconds)), index.shard_num_records)
    by_speaker: dict[str, set[int]] = {}
    for r, shard in zip(recs, shard_of_record):
        by_speaker.setdefault(r["speaker"], set()).add(int(shard))
    assert len(by_speaker) == 60 and all(len(s) == 1 for s in by_speaker.values())


def _ranges(counts: list[int]) -> list[tuple[int, int]]:
    ends = np.cumsum(counts)
    return [(int(e - c), int(e)) for c, e in zip(counts, ends)]


def test_stats_combine_over_shards_equals_one_pass():
    rng = np.random.default_rng(0)
    feats = [rng.normal(-3.0, 2.0, size=(8, int(n))) for n in rng.integers(1, 50, size=7)]
    per_shard = [
        {"count": f.shape[1], "sum": f.sum(1).tolist(), "sum_sq": (f**2).sum(1).tolist()}
        for f in feats
    ] + [None]  # An empty shard.
    combined = combine_stats(per_shard)
    everything = np.concatenate(feats, axis=1)
    assert combined["count"] == everything.shape[1]
    np.testing.assert_allclose(combined["sum"], everything.sum(1), rtol=1e-12)
    np.testing.assert_allclose(combined["sum_sq"], (everything**2).sum(1), rtol=1e-12)
    assert combine_stats([None, None]) is None


def test_index_and_durations_match_records(prepared):
    index = records.read_split_index(prepared, "train")
    recs = _read_split(prepared, "train")
    assert index.num_records == len(recs) == index.durations.size
    assert index.durations.dtype == np.float32
    np.testing.assert_allclose(index.durations, [r["duration"] for r in recs], rtol=1e-6)
    assert index.seconds == pytest.approx(sum(r["duration"] for r in recs), rel=1e-6)
    assert index.sample_rate == 16000
    assert sum(index.shard_num_records) == index.num_records


def test_stats_equal_one_pass_librosa(prepared):
    with open(os.path.join(prepared, "train", "stats.json")) as f:
        stats = json.load(f)
    assert stats["feature"] == {
        "sample_rate": 16000,
        "n_fft": 512,
        "win_length": 400,
        "hop_length": 160,
        "num_mel_bins": 80,
        "fmin": 0.0,
        "fmax": 8000.0,
        "log_floor": 1e-6,
        "window": "hann",
        "center": True,
    }
    feats = []
    for rec in _read_split(prepared, "train"):
        mel = librosa.feature.melspectrogram(
            y=rec["audio"].astype(np.float32) / 32768,
            sr=16000,
            n_fft=512,
            hop_length=160,
            win_length=400,
            window="hann",
            center=True,
            pad_mode="constant",
            power=2.0,
            n_mels=80,
            fmin=0.0,
            fmax=8000.0,
            htk=False,
            norm="slaney",
        )
        feats.append(np.log(mel + 1e-6).astype(np.float64))
    all_feats = np.concatenate(feats, axis=1)
    assert stats["count"] == all_feats.shape[1]
    np.testing.assert_allclose(stats["sum"], all_feats.sum(1), rtol=1e-6)
    np.testing.assert_allclose(stats["sum_sq"], (all_feats**2).sum(1), rtol=1e-6)


def test_char_tokenizer_saved_for_train(prepared):
    tok = Tokenizer.load(os.path.join(prepared, "tokenizer"))
    texts = [normalize_text(r["text"]) for r in _read_split(prepared, "train")]
    assert tok.kind == "char"
    assert tok.pieces[2:] == sorted(set("".join(texts)))
    for text in texts:
        assert tok.decode(tok.encode(text)) == text


def test_deterministic_idempotent_and_never_mixed(corpus, prepared, tmp_path):
    # Same flags into a fresh directory: byte-identical shards and index.
    again = str(tmp_path / "again")
    _run(corpus, again, "--num_shards", "2", "--notrain_tokenizer", *IN_MEMORY)
    for name in (
        "train-00000-of-00002.array_record",
        "train-00001-of-00002.array_record",
        "index.json",
        "durations.npy",
        "stats.json",
    ):
        with open(os.path.join(prepared, "train", name), "rb") as a:
            with open(os.path.join(again, "train", name), "rb") as b:
                assert a.read() == b.read(), name
    assert not os.path.exists(os.path.join(again, "tokenizer"))  # --notrain_tokenizer.
    # Re-running with another shard count replaces the split; nothing of the old run remains.
    _run(corpus, again, "--num_shards", "3", "--notrain_tokenizer", *IN_MEMORY)
    assert os.listdir(again) == ["train"]  # No staging leftovers.
    assert sorted(
        n for n in os.listdir(os.path.join(again, "train")) if "array_record" not in n
    ) == ["durations.npy", "index.json", "prep_report.json", "stats.json"]
    shard_files = sorted(n for n in os.listdir(os.path.join(again, "train")) if "array_record" in n)
    assert shard_files == [f"train-0000{i}-of-00003.array_record" for i in range(3)]
    assert len(_read_split(again, "train")) == len(GOOD) + 2


def test_default_multiprocess_runner_flac_and_sentencepiece(corpus, tmp_path):
    """The default runner (multi_processing, one worker per CPU), FLAC payloads, a dev split
    (no tokenizer by default), then bpe training forced with --train_tokenizer."""
    out = str(tmp_path / "out")
    report = _run(corpus, out, "--audio_format", "flac", split="dev")
    assert report["num_written"] == len(GOOD) + 2 and report["num_shards"] == 1
    assert not os.path.exists(os.path.join(out, "tokenizer"))
    flac = {r["id"]: r for r in _read_split(out, "dev")}
    pcm_source = sf.read(os.path.join(os.path.dirname(corpus), "wavs/good3.wav"), dtype="int16")[0]
    np.testing.assert_array_equal(flac["wavs/good3"]["audio"], pcm_source)
    _run(
        corpus,
        out,
        "--train_tokenizer",
        "--tokenizer",
        "bpe",
        "--vocab_size",
        "30",
        *IN_MEMORY,
        split="dev",
    )
    tok = Tokenizer.load(os.path.join(out, "tokenizer"))
    assert tok.kind == "sentencepiece" and tok.model_type == "bpe" and tok.vocab_size == 30
    assert tok.decode(tok.encode("the quick brown fox")) == "the quick brown fox"


def test_clear_errors(corpus, tmp_path, capsys):
    with pytest.raises(PrepareError, match="input manifest not found: .*nope.jsonl"):
        _run(str(tmp_path / "nope.jsonl"), str(tmp_path / "o"), *IN_MEMORY)
    with pytest.raises(PrepareError, match="unknown --format 'sphere'"):
        prep.prepare(
            ["p", "--format", "sphere", "--input", corpus, "--output", "o", "--split", "x"]
        )
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(PrepareError, match="not writable"):
        _run(corpus, str(blocker / "sub"), *IN_MEMORY)
    assert (
        prep.main(["p", "--input", str(tmp_path / "nope.jsonl"), "--output", "o", "--split", "x"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: input manifest not found")
    # A tokenizer the corpus cannot support fails clearly but keeps the (good) shards.
    out = str(tmp_path / "vocab")
    with pytest.raises(PrepareError, match="tokenizer was not: .*smaller --vocab_size"):
        _run(corpus, out, "--tokenizer", "unigram", "--vocab_size", "5000", *IN_MEMORY)
    assert records.read_split_index(out, "train").num_records == len(GOOD) + 2
    assert not os.path.exists(os.path.join(out, "tokenizer"))


def test_all_items_skipped_is_an_error(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"audio_filepath": "missing.wav", "text": "x"}\n')
    with pytest.raises(PrepareError, match="no records written"):
        _run(str(manifest), str(tmp_path / "o"), *IN_MEMORY)
    with open(tmp_path / "o" / "train" / "prep_report.json") as f:
        assert json.load(f)["skipped"]["missing_audio"]["count"] == 1


def test_event_summary_keeps_ten_smallest_examples():
    fn = EventSummaryFn()
    ids = [f"u{i:03d}" for i in range(25)]
    halves = [fn.create_accumulator(), fn.create_accumulator()]
    for n, i in enumerate(reversed(ids)):
        halves[n % 2] = fn.add_input(halves[n % 2], ("skipped", "too_long", i))
    out = fn.extract_output(fn.merge_accumulators(halves))
    assert out == {"skipped/too_long": [25, ids[:10]]}


def test_default_num_shards_rule():
    assert default_num_shards(0, 0.0) == 1
    assert default_num_shards(100, 1.4 * 3600) == 1
    assert default_num_shards(10_000, 7.6 * 3600) == 8
    assert default_num_shards(3, 50 * 3600) == 3  # Never more shards than records.
    assert default_num_shards(10**9, 10**7 * 3600) == MAX_SHARDS


def test_parse_args_passes_beam_flags_through():
    cfg, rest = parse_args(
        [
            "p",
            "--input",
            "m",
            "--output",
            "o",
            "--split",
            "dev",
            "--runner",
            "FlinkRunner",
            "--parallelism=4",
            "--fmax",
            "7600",
        ]
    )
    assert rest == ["--runner", "FlinkRunner", "--parallelism=4"]
    assert cfg.feature.fmax == 7600.0 and not cfg.train_tokenizer and cfg.num_shards is None
    options, runner = pipeline_options(rest)
    assert runner is None  # Non-direct runners pass through untouched.
    options, runner = pipeline_options([])
    direct = options.get_all_options()
    assert direct["direct_running_mode"] == "multi_processing"
    assert direct["direct_num_workers"] == (os.cpu_count() or 1) and runner is not None


@pytest.mark.parametrize(
    "line, expected",
    [
        (b'{"audio_filepath": "a/b.wav", "text": "Hi"}', ("a/b", "/m/a/b.wav", "Hi", "unknown")),
        (b'{"audio_filepath": "/m/x/c.flac", "text": "t", "speaker": 7}', ("x/c", None, "t", "7")),
        (b'{"audio_filepath": "/elsewhere/d.wav"}', ("/elsewhere/d", None, None, "unknown")),
        (b'{"id": "u1", "audio_filepath": "e.wav", "text": "t"}', ("u1", None, "t", "unknown")),
        (b"[1, 2]", "malformed"),
        (b'{"text": "no audio path"}', "malformed"),
        (b'{"audio_filepath": "a.wav", "text": 12}', "malformed"),
        (b"\xff\xfe{}", "malformed"),
        (b"  \r", None),
    ],
)
def test_parse_manifest_line(line, expected):
    item = parse_manifest_line(line, 7, "m.jsonl", "/m")
    if expected is None:
        assert item is None
    elif expected == "malformed":
        assert (item.id, item.error) == ("m.jsonl:7", MALFORMED)
    else:
        item_id, path, text, speaker = expected
        assert (item.id, item.text, item.speaker, item.error, item.position) == (
            item_id,
            text,
            speaker,
            None,
            7,
        )
        assert path is None or item.audio_path == path


def test_alphabet_skips_transcripts_with_other_characters(corpus, tmp_path):
    alphabet = "abcdefghijklmnoprstuvwxy'"  # No q, no z: four transcripts have one.
    report = _run(
        corpus, str(tmp_path / "o"), "--alphabet", alphabet, "--notrain_tokenizer", *IN_MEMORY
    )
    assert report["skipped"]["out_of_alphabet"] == {
        "count": 4,
        "examples": ["wavs/empty", "wavs/good1", "wavs/good2", "wavs/rate8k"],
    }
    assert report["num_written"] == len(GOOD) - 1  # good1, good2, rate8k; stereo stays.
    with pytest.raises(PrepareError, match="--alphabet must be lowercase"):
        _run(corpus, str(tmp_path / "o"), "--alphabet", "ABC", *IN_MEMORY)
