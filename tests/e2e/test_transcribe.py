"""`jaxspeech.transcribe` on the shared tiny run: a minute of the test split's utterances
in one file (at another rate, in stereo) decoded in overlapping windows, next to a file
that cannot be read; silence and faint noise transcribed to no words; progress lines."""

import io
import json

import numpy as np
import pytest
import soundfile as sf

from jaxspeech.config import build
from jaxspeech.data import reader
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.serving import longform
from jaxspeech.serving import recognizer as transcribe_lib
from tests.e2e.cli import run_module

pytestmark = pytest.mark.slow


def _long_file(shards, path, seconds: float) -> float:
    """The test split's utterances with 0.3 s of silence between them, repeated up to
    `seconds`, written in stereo at 22.05 kHz; returns the duration."""
    import soxr

    recs = reader.read_split_records(str(shards), "test")
    parts, total, pause = [], 0, np.zeros(4800, np.float32)
    while total < seconds * 16000:
        for r in recs:
            parts += [reader.audio_float32(r), pause]
            total += len(parts[-2]) + len(pause)
    audio = soxr.resample(np.concatenate(parts), 16000, 22050)
    sf.write(path, np.stack([audio, audio], 1), 22050)
    return len(audio) / 22050


def _speech_then_silence(shards, path, silence_s: float) -> tuple[float, float]:
    """The test split's first utterance after 1 s of digital silence and before
    `silence_s` more, at 16 kHz; returns where the utterance starts and ends (seconds)."""
    audio = reader.audio_float32(reader.read_split_records(str(shards), "test", [0])[0])
    sf.write(path, np.concatenate([np.zeros(16000), audio, np.zeros(int(silence_s * 16000))]),
             16000)  # fmt: skip
    return 1.0, 1.0 + len(audio) / 16000


def test_transcribe_long_audio_in_windows(corpus, tiny_run, tmp_path):
    """One call (one set of compiled programs) for every file: the long file, two that
    fail, 40 s of silence, 40 s of white noise at -60 dBFS, and speech then silence."""
    _, shards = corpus
    long = tmp_path / "long.wav"
    duration = _long_file(shards, long, 60.0)
    (tmp_path / "broken.wav").write_bytes(b"RIFF....WAVEnot audio")
    noise = np.random.default_rng(0).standard_normal(40 * 16000) * 10 ** (-60 / 20)
    sf.write(tmp_path / "zeros.wav", np.zeros(40 * 16000), 16000)
    sf.write(tmp_path / "noise.flac", noise, 16000)  # PCM16: -60 dBFS is ~30 steps
    speech = _speech_then_silence(shards, tmp_path / "speech.wav", 40.0)
    nan = np.zeros(2 * 16000, np.float32)
    nan[20000] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 16000, subtype="FLOAT")
    names = ["long.wav", "broken.wav", "missing.flac", "zeros.wav", "noise.flac", "speech.wav"]
    names.append("nan.wav")
    config = eval_run.run_eval_config(str(tiny_run[0]))
    results, progress = [], io.StringIO()
    # The tiny model (8 steps) spells a whole utterance as one word of up to 5 s.
    gate = longform.SpeechGate(max_word_s=8.0)
    with rules.axis_rules(build.rules_from_config(config)):
        run = loading.load_run(str(tiny_run[0]))
        failed = transcribe_lib.transcribe_files(
            [str(tmp_path / n) for n in names],
            run,
            config,
            window_s=8.0,
            overlap_s=2.0,
            batch=3,  # rounded up to the mesh's 8 batch shards
            emit=results.append,
            gate=gate,
            progress=progress,
        )
    assert failed == 3
    assert [r["path"] for r in results if "error" in r] == [
        str(tmp_path / "broken.wav"),
        str(tmp_path / "missing.flac"),
        str(tmp_path / "nan.wav"),
    ]
    by_name = {r["path"].rsplit("/", 1)[1]: r for r in results}
    assert by_name["missing.flac"]["error"] == "not found"  # not libsndfile's "System error"
    assert by_name["nan.wav"]["error"].startswith("NaN or infinite samples (the first at 1.250 s)")
    assert by_name["long.wav"]["file_rate"] == 22050 and by_name["speech.wav"]["file_rate"] == 16000
    _check_silence_and_speech(by_name, speech)
    # A progress line for the only file over a minute; plain lines (no terminal).
    lines = progress.getvalue().splitlines()
    assert lines[0].startswith(f"{long} [....................] 0.0/{duration:.1f} s   0% -")
    assert lines[-1].startswith(f"{long} [####################] {duration:.1f}/{duration:.1f}")
    assert all(ln.startswith(str(long)) for ln in lines) and "x real time" in lines[-1]
    got = results[0]
    assert got["seconds"] == pytest.approx(duration, abs=1e-3)
    words = got["words"]  # the tiny model's: few spaces, long made-up words
    assert got["text"] == " ".join(w["word"] for w in words) and words
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and 0 <= starts[0] and words[-1]["end"] <= duration + 0.1
    assert all(w["end"] > w["start"] for w in words)
    assert starts[-1] > duration / 2  # pieces from all over the file made it in


def _check_silence_and_speech(results: dict, speech: tuple[float, float]) -> None:
    """Silence and faint noise: no word, every second skipped undecoded. Speech: its words,
    none reaching into the silence around it further than the gate's 0.1 s pad."""
    for name in ("zeros.wav", "noise.flac"):
        got = results[name]
        assert got["words"] == [] and got["text"] == "" and got["dropped_words"] == []
        assert got["skipped_silence_s"] == got["seconds"] == 40.0
    got = results["speech.wav"]
    assert got["words"] and got["text"] == " ".join(w["word"] for w in got["words"])
    lo, hi = speech
    assert all(lo - 0.1 - 1e-3 <= w["start"] < w["end"] <= hi + 0.1 + 1e-3 for w in got["words"])
    assert got["skipped_silence_s"] > 30.0  # of the 40 s after the speech
    assert all(d["reason"] in ("silence", "too long") for d in got["dropped_words"])


def test_transcribe_command_line_mistakes(tiny_run, tmp_path):
    usage = run_module("jaxspeech.transcribe", "--workdir", str(tiny_run[0]), check=False)
    assert usage.returncode == 2 and "give one or more audio files" in usage.stderr


def test_transcribe_command_line_progress_and_silence(corpus, tiny_run, tmp_path):
    """The command line on speech and a minute of silence: a progress line on stderr
    (stdout: the JSON line alone); with --noprogress none, and in text mode a note on
    stderr of what the speech gate left out."""
    _, shards = corpus
    path = tmp_path / "speech-then-silence.wav"
    lo, hi = _speech_then_silence(shards, path, 62.0)
    args = ("jaxspeech.transcribe", "--workdir", str(tiny_run[0]), "--window_s=8")
    shown = run_module(*args, "--json", "--max_word_s=8", str(path))
    (got,) = [json.loads(line) for line in shown.stdout.splitlines()]
    assert got["words"]
    assert all(lo - 0.101 <= w["start"] < w["end"] <= hi + 0.101 for w in got["words"])
    assert got["skipped_silence_s"] > 55.0
    bars = [ln for ln in shown.stderr.splitlines() if ln.startswith(f"{path} [")]
    total = f"{got['seconds']:.1f}"  # the header's duration: the file is at the model's rate
    assert bars[0] == f"{path} [....................] 0.0/{total} s   0% -"
    assert bars[-1].startswith(f"{path} [####################] {total}/{total} s 100% ")
    assert bars[-1].endswith("x real time")

    quiet = run_module(*args, "--noprogress", str(path))
    assert f"{path} [" not in quiet.stderr and "real time" not in quiet.stderr
    assert quiet.stdout.startswith(f"{path}: ")
    note = f"note: {path}: {got['skipped_silence_s']:.1f} s of silence not decoded"
    assert note in quiet.stderr
