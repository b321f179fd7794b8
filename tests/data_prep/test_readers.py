"""The librispeech, kaldi and tfds readers: tiny generated inputs with every bad case, each
prepared end to end in-process; plus the pure parsing helpers."""

from __future__ import annotations

import dataclasses
import io
import os
import struct

import numpy as np
import pytest
import soundfile as sf
from array_record.python.array_record_module import ArrayRecordReader

from data_prep import prepare as prep
from data_prep.config import parse_args
from data_prep.readers.audio import cut_segment, load_file_segment, load_item_audio
from data_prep.readers.common import (
    MISSING_TRANSCRIPT,
    SEGMENT_OUT_OF_RANGE,
    UNDECODABLE_AUDIO,
    AudioError,
    Item,
    PrepareError,
)
from data_prep.readers.kaldi import (
    DUPLICATE_WAV_SCP,
    MALFORMED_WAV_SCP,
    NO_SEGMENTS_ENTRY,
    NO_WAV_SCP_ENTRY,
    PIPE_FAILED,
    PIPE_NOT_ALLOWED,
    PIPE_NOT_IN_FORMAT,
    UNSUPPORTED_WAV_SCP,
    KaldiAudio,
    KaldiText,
    fix_streamed_wav,
    kaldi_items,
    load_pipe_audio,
    parse_segments_value,
    parse_wav_scp_value,
)
from data_prep.readers.librispeech import MALFORMED_TRANSCRIPT, read_librispeech_chapter
from data_prep.readers.textfiles import parse_transcript_line, split_key
from jaxspeech.data import records
from tests.data_prep.test_prepare import IN_MEMORY, _tone

# tensorflow-datasets 4.9.10 calls a protobuf API that protobuf deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning")


def _write(path, audio: np.ndarray, sample_rate: int) -> str:
    sf.write(str(path), audio, sample_rate, subtype="PCM_16")
    return str(path)


def _int16(path: str) -> np.ndarray:
    """The file's samples as int16, (N,) or (N, C)."""
    return sf.read(path, dtype="int16")[0]


def _prepare(fmt: str, input_path: str, output: str, *extra: str, split: str = "train") -> dict:
    argv = ["prepare", "--format", fmt, "--input", input_path, "--output", output]
    return prep.prepare([*argv, "--split", split, "--num_shards", "2", *IN_MEMORY, *extra])


def _records(output: str, split: str = "train") -> dict[str, dict]:
    out = {}
    for path in records.read_split_index(output, split).shard_paths:
        reader = ArrayRecordReader(path)
        for data in reader.read_all():
            rec = records.decode_record(data)
            out[rec["id"]] = rec
        reader.close()
    return out


def _skipped(report: dict) -> dict[str, tuple[int, list[str]]]:
    return {k: (v["count"], v["examples"]) for k, v in report["skipped"].items()}


def _check_totals(report: dict) -> None:
    skipped = sum(v["count"] for v in report["skipped"].values())
    assert report["num_input"] == report["num_written"] + skipped


# =============================================================================================
# LibriSpeech
# =============================================================================================

LIBRI_GOOD = {  # id -> (transcript, seconds)
    "19-198-0000": ("NORTHANGER ABBEY", 0.6),
    "19-198-0001": ("THIS LITTLE WORK WAS FINISHED", 0.9),
    "19-227-0000": ("CHAPTER ONE", 0.5),
    "26-495-0000": ("THE SECOND SPEAKER", 0.7),
    "26-495-0001": ("READS ANOTHER LINE", 0.4),
}


@pytest.fixture(scope="module")
def librispeech(tmp_path_factory) -> str:
    """A split with 5 good utterances, a line without flac, a flac without line, a line that is
    not UTF-8 and a line with only an id."""
    root = tmp_path_factory.mktemp("libri") / "LibriSpeech" / "train-clean-100"
    lines: dict[str, list[bytes]] = {}
    for seed, (utt, (text, seconds)) in enumerate(LIBRI_GOOD.items()):
        spk, chapter, _ = utt.split("-")
        chapter_dir = root / spk / chapter
        chapter_dir.mkdir(parents=True, exist_ok=True)
        _write(chapter_dir / f"{utt}.flac", _tone(seconds, 16000, seed), 16000)
        lines.setdefault(f"{spk}/{chapter}", []).append(f"{utt} {text}".encode())
    lines["19/198"].append(b"19-198-0003 THIS LINE HAS NO FLAC")  # Line 3.
    lines["19/198"].append(b"\xff\xfe NOT UTF-8")  # Line 4.
    _write(root / "19/198/19-198-0002.flac", _tone(0.5, 16000, 7), 16000)  # No transcript line.
    _write(root / "26/495/26-495-0002.flac", _tone(0.5, 16000, 8), 16000)
    lines["26/495"].append(b"26-495-0002")  # An id without transcript.
    for chapter, chapter_lines in lines.items():
        spk, ch = chapter.split("/")
        (root / chapter / f"{spk}-{ch}.trans.txt").write_bytes(b"\n".join(chapter_lines) + b"\n")
    (root / "README.TXT").write_text("a stray file next to the speakers is ignored")
    return str(root)


def test_librispeech_end_to_end(librispeech, tmp_path):
    out = str(tmp_path / "out")
    report = _prepare("librispeech", librispeech, out)
    assert _skipped(report) == {
        "empty_transcript": (1, ["26-495-0002"]),
        "malformed_transcript_line": (1, ["19-198.trans.txt:4"]),
        "missing_audio": (1, ["19-198-0003"]),
        "missing_transcript": (1, ["19-198-0002"]),
    }
    assert report["num_input"] == 9 and report["num_written"] == len(LIBRI_GOOD)
    _check_totals(report)
    recs = _records(out)
    assert sorted(recs) == sorted(LIBRI_GOOD)
    for utt, (text, _) in LIBRI_GOOD.items():
        spk, chapter, _ = utt.split("-")
        rec = recs[utt]
        assert rec["text"] == text and rec["speaker"] == spk
        source = _int16(os.path.join(librispeech, spk, chapter, f"{utt}.flac"))
        np.testing.assert_array_equal(rec["audio"], source)


def test_librispeech_clear_errors(librispeech, tmp_path):
    with pytest.raises(PrepareError, match="LibriSpeech directory not found"):
        _prepare("librispeech", str(tmp_path / "nope"), str(tmp_path / "o"))
    # The parent of the split directory: its "chapters" are speaker directories.
    with pytest.raises(PrepareError, match="not a LibriSpeech split directory"):
        _prepare("librispeech", os.path.dirname(librispeech), str(tmp_path / "o"))


def test_read_librispeech_chapter_directly(librispeech):
    items = list(read_librispeech_chapter(os.path.join(librispeech, "19", "198")))
    assert [(i.id, i.error, i.position) for i in items] == [
        ("19-198-0000", None, 1),
        ("19-198-0001", None, 2),
        ("19-198-0003", None, 3),
        ("19-198.trans.txt:4", MALFORMED_TRANSCRIPT, 4),
        ("19-198-0002", MISSING_TRANSCRIPT, 0),
    ]
    assert {i.speaker for i in items} == {"19"}
    assert items[2].audio_path == os.path.join(librispeech, "19", "198", "19-198-0003.flac")


# =============================================================================================
# Kaldi
# =============================================================================================


@pytest.fixture(scope="module")
def kaldi_plain(tmp_path_factory) -> str:
    """A data directory without segments: plain paths (one relative to the directory it is
    prepared from), pipes, an archive offset, and one of each missing/malformed/duplicate."""
    root = tmp_path_factory.mktemp("kaldi_plain")
    wavs = root / "wavs"
    wavs.mkdir()
    a = _write(wavs / "a.wav", _tone(0.6, 16000, 1), 16000)
    b = _write(wavs / "b.wav", _tone(0.8, 16000, 2), 16000)
    c = _write(wavs / "c.wav", _tone(0.5, 16000, 3, channels=2), 16000)
    p = _write(wavs / "p.wav", _tone(0.7, 16000, 4), 16000)
    t = _write(wavs / "t.wav", _tone(0.4, 16000, 5), 16000)
    data = root / "data" / "train"
    data.mkdir(parents=True)
    assert a.startswith(str(root))
    (data / "wav.scp").write_bytes(
        b"\n".join(
            [
                b"uA wavs/a.wav",  # Relative: to the current directory (the recipe's).
                f"uB {b}".encode(),
                f"uC {c}".encode(),
                f"uP cat {p} |".encode(),
                b"uF false |",
                f"uK {root}/raw.ark:1234".encode(),
                f"uT {t}".encode(),
                f"uB {b}".encode(),  # Line 8: a second entry for uB.
                b"\xff\xfe wavs/x.wav",  # Line 9: no usable id.
                b"uM",  # An id without audio.
                f"uI cat {p} ; touch {root}/injected |".encode(),  # Refused: shell syntax.
                f"uQ cat {p} | cat |".encode(),  # Two stages, connected without a shell.
                b"",
            ]
        )
        + b"\n"
    )
    (data / "text").write_text(
        "uA hello a\nuB bee\nuC sea\nuP the pipe\nuF a failing pipe\nuK archive\n"
        "uN no audio entry\nuM malformed wav entry\nuA a second text line\n"
        "uI an injection\nuQ two stages\n"
    )
    (data / "utt2spk").write_text("uA s1\nuB s1\nuC s2\nuP s2\nuX\n")  # Line 5: malformed.
    return str(root)


def _kaldi_plain_run(kaldi_plain: str, out: str, *extra: str) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(kaldi_plain)  # wav.scp's relative paths are relative to the recipe directory.
        return _prepare("kaldi", "data/train", out, *extra)


KALDI_PLAIN_SKIPPED = {
    "duplicate_id": (1, ["uA"]),
    "duplicate_wav_scp_entry": (1, ["wav.scp:8"]),
    "malformed_utt2spk_line": (1, ["utt2spk:5"]),
    "malformed_wav_scp_line": (2, ["uM", "wav.scp:9"]),
    "missing_transcript": (1, ["uT"]),
    "no_wav_scp_entry": (1, ["uN"]),
    "unsupported_wav_scp_entry": (1, ["uK"]),
}


def _check_kaldi_plain_records(kaldi_plain: str, recs: dict[str, dict]) -> None:
    wavs = os.path.join(kaldi_plain, "wavs")
    assert recs["uA"]["text"] == "hello a" and recs["uA"]["speaker"] == "s1"
    np.testing.assert_array_equal(recs["uA"]["audio"], _int16(os.path.join(wavs, "a.wav")))
    np.testing.assert_array_equal(recs["uB"]["audio"], _int16(os.path.join(wavs, "b.wav")))
    stereo = sf.read(os.path.join(wavs, "c.wav"), dtype="float32")[0]
    np.testing.assert_array_equal(recs["uC"]["audio"], records.to_int16(stereo.mean(1)))
    assert recs["uC"]["speaker"] == "s2"


def test_kaldi_without_segments_pipes_refused(kaldi_plain, tmp_path):
    out = str(tmp_path / "out")
    report = _kaldi_plain_run(kaldi_plain, out)
    refused = (4, ["uF", "uI", "uP", "uQ"])
    assert _skipped(report) == {**KALDI_PLAIN_SKIPPED, "pipe_not_allowed": refused}
    assert report["num_input"] == 15 and report["num_written"] == 3
    _check_totals(report)
    recs = _records(out)
    assert sorted(recs) == ["uA", "uB", "uC"]
    _check_kaldi_plain_records(kaldi_plain, recs)


def test_kaldi_without_segments_pipes_allowed(kaldi_plain, tmp_path):
    out = str(tmp_path / "out")
    report = _kaldi_plain_run(kaldi_plain, out, "--allow_pipes")
    assert _skipped(report) == {
        **KALDI_PLAIN_SKIPPED,
        "pipe_failed": (1, ["uF"]),
        "pipe_shell_syntax": (1, ["uI"]),  # "cat p.wav ; touch injected |": nothing ran
    }
    assert report["num_input"] == 15 and report["num_written"] == 5
    assert not os.path.exists(os.path.join(kaldi_plain, "injected"))
    _check_totals(report)
    recs = _records(out)
    assert sorted(recs) == ["uA", "uB", "uC", "uP", "uQ"]
    _check_kaldi_plain_records(kaldi_plain, recs)
    p = _int16(os.path.join(kaldi_plain, "wavs", "p.wav"))
    np.testing.assert_array_equal(recs["uP"]["audio"], p)
    np.testing.assert_array_equal(recs["uQ"]["audio"], p)
    assert recs["uP"]["speaker"] == "s2" and recs["uP"]["text"] == "the pipe"


REC1_SECONDS, REC2_SECONDS = 3.0, 2.0


@pytest.fixture(scope="module")
def kaldi_segments(tmp_path_factory) -> str:
    """A data directory with segments: a mono and a stereo recording, a segment to the end
    (-1), and one of each bad case."""
    root = tmp_path_factory.mktemp("kaldi_segments")
    rec1 = _write(root / "rec1.wav", _tone(REC1_SECONDS, 16000, 11), 16000)
    rec2 = _write(root / "rec2.flac", _tone(REC2_SECONDS, 16000, 12, channels=2), 16000)
    _write(root / "rec3.wav", _tone(0.5, 16000, 13), 16000)
    (root / "wav.scp").write_text(
        f"rec1 {rec1}\nrec2 {rec2}\nrec3 {root}/rec3.wav\nrec1 {rec1}\n"  # Line 4: duplicate.
    )
    (root / "segments").write_text(
        "s1 rec1 0.0 0.8\n"
        "s2 rec1 0.80 1.9\n"
        "s3 rec1 2.2 -1\n"  # To the end of rec1.
        "s4 rec2 0.25 1.0\n"
        "s5 rec9 0 1\n"  # No such recording.
        "s6 rec1 2.5 4.0\n"  # Past the end of rec1.
        "s7 rec1 abc 1\n"  # Malformed.
        "s1 rec1 0.0 0.5\n"  # Line 8: a second segment for s1.
    )
    (root / "text").write_text("".join(f"s{i} segment {i}\n" for i in range(1, 9)))
    (root / "utt2spk").write_text("s1 A\ns2 A\ns3 B\ns4 C\n")
    return str(root)


def test_kaldi_with_segments(kaldi_segments, tmp_path):
    out = str(tmp_path / "out")
    report = _prepare("kaldi", kaldi_segments, out)
    assert _skipped(report) == {
        "duplicate_segments_entry": (1, ["segments:8"]),
        "duplicate_wav_scp_entry": (1, ["wav.scp:4"]),
        "malformed_segments_line": (1, ["s7"]),
        "no_segments_entry": (1, ["s8"]),
        "no_wav_scp_entry": (1, ["s5"]),
        "segment_out_of_range": (1, ["s6"]),
    }
    assert report["num_input"] == 10 and report["num_written"] == 4
    assert report["downmixed"]["examples"] == ["s4"]
    _check_totals(report)
    recs = _records(out)
    rec1 = _int16(os.path.join(kaldi_segments, "rec1.wav"))
    np.testing.assert_array_equal(recs["s1"]["audio"], rec1[0:12800])
    np.testing.assert_array_equal(recs["s2"]["audio"], rec1[12800:30400])
    np.testing.assert_array_equal(recs["s3"]["audio"], rec1[35200:])
    rec2 = sf.read(os.path.join(kaldi_segments, "rec2.flac"), dtype="float32")[0]
    np.testing.assert_array_equal(recs["s4"]["audio"], records.to_int16(rec2[4000:16000].mean(1)))
    assert [recs[f"s{i}"]["speaker"] for i in range(1, 5)] == ["A", "A", "B", "C"]
    assert recs["s2"]["text"] == "segment 2"


def test_kaldi_clear_errors(kaldi_segments, tmp_path):
    with pytest.raises(PrepareError, match="Kaldi data directory not found"):
        _prepare("kaldi", str(tmp_path / "nope"), str(tmp_path / "o"))
    (tmp_path / "only_text").mkdir()
    (tmp_path / "only_text" / "text").write_text("u1 hi\n")
    with pytest.raises(PrepareError, match=r"wav.scp not found .*needs text and wav.scp"):
        _prepare("kaldi", str(tmp_path / "only_text"), str(tmp_path / "o"))
    # Only pipes and no --allow_pipes: nothing could be written; say which flag fixes it.
    pipes = tmp_path / "pipes"
    pipes.mkdir()
    (pipes / "wav.scp").write_text("u1 sox a.wav -t wav - |\nu2 flac -c -d -s b.flac |\n")
    (pipes / "text").write_text("u1 one\nu2 two\n")
    with pytest.raises(PrepareError, match="every entry of .*shell command.*--allow_pipes"):
        _prepare("kaldi", str(pipes), str(tmp_path / "o"))


@pytest.mark.parametrize(
    "value, expected",
    [
        ("/d/a.wav", ("/d/a.wav", None)),
        ("a b.wav", ("/base/a b.wav", None)),  # The rest of the line: a name with a space.
        ("gs://bucket/a.flac", ("gs://bucket/a.flac", None)),
        ("sox a.wav -t wav - |", ("pipe:sox a.wav -t wav -", None)),
        ("flac -c -d -s x.flac|", ("pipe:flac -c -d -s x.flac", None)),
        ("  |", ("", MALFORMED_WAV_SCP)),
        ("raw.ark:1234", ("raw.ark:1234", UNSUPPORTED_WAV_SCP)),
        ("-", ("-", UNSUPPORTED_WAV_SCP)),
        ("pipe://x; touch y", ("pipe://x; touch y", PIPE_NOT_IN_FORMAT)),  # A name, no "|".
    ],
)
def test_parse_wav_scp_value(value, expected):
    assert parse_wav_scp_value(value, True, "/base") == expected
    refused = parse_wav_scp_value(value, False, "/base")
    if value.rstrip().endswith("|") and expected[1] is None:
        assert refused == (expected[0], PIPE_NOT_ALLOWED)
    else:
        assert refused == expected


def test_parse_segments_value():
    assert parse_segments_value("rec 1.5 2.25") == ("rec", 1.5, 2.25)
    assert parse_segments_value("rec 0 -1") == ("rec", 0.0, None)
    for bad in ("rec 1", "rec a 2", "rec 2 1", "rec 1 1", "rec -1 2", "rec nan 2", "r 0 1 x"):
        with pytest.raises(ValueError):
            parse_segments_value(bad)


def test_split_key_and_transcript_lines():
    assert split_key(b"  \r") is None
    assert split_key(b"u1\tsome  text \r") == ("u1", b"some  text")
    assert split_key(b"u1") == ("u1", b"")
    assert split_key(b"\xff rest") == (None, b"rest")
    assert parse_transcript_line(b"u1 HELLO WORLD") == ("u1", "HELLO WORLD")
    assert parse_transcript_line(b"u1 \xff") == ("u1", None)


def test_kaldi_items_rules():
    text = [KaldiText(3, "hi"), KaldiText(1, "first")]
    wav = KaldiAudio("wav.scp", 5, "/a.wav")
    dup = KaldiAudio("wav.scp", 9, "/b.wav")
    items = list(kaldi_items("u", text, [dup, wav], [], NO_WAV_SCP_ENTRY))
    assert [(i.id, i.audio_path, i.text, i.error, i.position, i.speaker) for i in items] == [
        ("wav.scp:9", "", None, DUPLICATE_WAV_SCP, 9, "unknown"),
        ("u", "/a.wav", "first", None, 1, "unknown"),  # No utt2spk: no speaker.
        ("u", "/a.wav", "hi", None, 3, "unknown"),  # Skipped downstream as duplicate_id.
    ]
    [only_audio] = kaldi_items("u", [], [wav], [(2, "s")], NO_WAV_SCP_ENTRY)
    assert (only_audio.error, only_audio.speaker) == (MISSING_TRANSCRIPT, "s")
    [no_audio] = kaldi_items("u", text[:1], [], [], NO_SEGMENTS_ENTRY)
    assert (no_audio.error, no_audio.audio_path) == (NO_SEGMENTS_ENTRY, "")
    refused = KaldiAudio("segments", 4, "pipe:x", PIPE_NOT_ALLOWED, 1.0, None)
    [item] = kaldi_items("u", text[:1], [refused], [], NO_SEGMENTS_ENTRY)
    assert (item.error, item.start, item.end) == (PIPE_NOT_ALLOWED, 1.0, None)
    assert list(kaldi_items("u", [], [], [(1, "s")], NO_WAV_SCP_ENTRY)) == []


def test_pipe_audio_loading(tmp_path):
    path = _write(tmp_path / "x.wav", _tone(0.3, 8000, 1, channels=2), 8000)
    audio, rate = load_pipe_audio(f"cat {path}")
    assert rate == 8000 and audio.shape == (2400, 2)
    item = Item("u", f"pipe:cat {path}", "t", "s", start=0.1, end=0.2, pipe=True)
    cfg = parse_args(["p", "--input", "i", "--output", "o", "--split", "s"])[0]
    with pytest.raises(AudioError) as e:
        load_item_audio(item, cfg)  # Refused by the loader too, whatever the reader.
    assert e.value.reason == PIPE_NOT_ALLOWED
    allowed = dataclasses.replace(cfg, allow_pipes=True)
    cut, _ = load_item_audio(item, allowed)
    np.testing.assert_array_equal(cut, audio[800:1600])
    with pytest.raises(AudioError) as e:  # A reader that defines no commands: a name.
        load_item_audio(item._replace(pipe=False), allowed)
    assert e.value.reason == PIPE_NOT_IN_FORMAT
    for command, reason in [
        ("sh -c 'echo oops >&2; exit 3'", PIPE_FAILED),  # A shell named: its script is data.
        ("echo not audio", UNDECODABLE_AUDIO),
    ]:
        with pytest.raises(AudioError, match="oops|output of") as e:
            load_pipe_audio(command)
        assert e.value.reason == reason
    with pytest.raises(AudioError, match="timed out") as e:
        load_pipe_audio("sleep 5 | cat", timeout_s=0.2)
    assert e.value.reason == PIPE_FAILED


def test_file_segment_reads_by_seeking_the_same_samples(kaldi_segments):
    for name in ("rec1.wav", "rec2.flac"):
        path = os.path.join(kaldi_segments, name)
        whole = sf.read(path, dtype="float32", always_2d=True)[0]
        seconds = whole.shape[0] / 16000
        for start, end in [(0.25, 1.0), (1.5, None), (0.0, seconds + 0.005)]:  # Within 10 ms.
            audio, rate = load_file_segment(path, start, end)
            assert rate == 16000
            np.testing.assert_array_equal(audio, cut_segment(whole, rate, start, end))
        for start, end in [(seconds, None), (1.0, seconds + 0.02)]:
            with pytest.raises(AudioError) as e:
                load_file_segment(path, start, end)
            assert e.value.reason == SEGMENT_OUT_OF_RANGE
    with pytest.raises(FileNotFoundError):
        load_file_segment(os.path.join(kaldi_segments, "nope.wav"), 0.0, 1.0)


def test_fix_streamed_wav():
    buf = io.BytesIO()
    sf.write(buf, _tone(0.1, 16000, 1), 16000, format="WAV", subtype="PCM_16")
    good = buf.getvalue()
    data_at = good.index(b"data")
    streamed = bytearray(good)
    struct.pack_into("<I", streamed, data_at + 4, 0)  # What a writer that cannot seek leaves.
    struct.pack_into("<I", streamed, 4, 0)
    assert sf.read(io.BytesIO(bytes(streamed)))[0].size == 0  # libsndfile: no samples.
    assert fix_streamed_wav(bytes(streamed)) == good
    assert fix_streamed_wav(good) == good
    assert fix_streamed_wav(b"fLaC...") == b"fLaC..."
