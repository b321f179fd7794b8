"""`jaxspeech.transcribe` on the shared tiny run: a minute of the test split's utterances
in one file (at another rate, in stereo) decoded in overlapping windows, next to a file
that cannot be read."""

import numpy as np
import pytest
import soundfile as sf

from jaxspeech.config import build
from jaxspeech.data import reader
from jaxspeech.evaluation import run as eval_run
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.serving import transcribe as transcribe_lib
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


def test_transcribe_long_audio_in_windows(corpus, tiny_run, tmp_path):
    _, shards = corpus
    long = tmp_path / "long.wav"
    duration = _long_file(shards, long, 60.0)
    (tmp_path / "broken.wav").write_bytes(b"RIFF....WAVEnot audio")
    config = eval_run.run_eval_config(str(tiny_run[0]))
    results = []
    with rules.axis_rules(build.rules_from_config(config)):
        run = loading.load_run(str(tiny_run[0]))
        failed = transcribe_lib.transcribe_files(
            [str(long), str(tmp_path / "broken.wav"), str(tmp_path / "missing.flac")],
            run,
            config,
            window_s=8.0,
            overlap_s=2.0,
            batch=3,  # rounded up to the mesh's 8 batch shards
            emit=results.append,
        )
    assert failed == 2
    assert [r["path"] for r in results if "error" in r] == [
        str(tmp_path / "broken.wav"),
        str(tmp_path / "missing.flac"),
    ]
    got = results[0]
    assert got["seconds"] == pytest.approx(duration, abs=1e-3)
    words = got["words"]  # the tiny model's: few spaces, long made-up words
    assert got["text"] == " ".join(w["word"] for w in words) and words
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and 0 <= starts[0] and words[-1]["end"] <= duration + 0.1
    assert all(w["end"] > w["start"] for w in words)
    assert starts[-1] > duration / 2  # pieces from all over the file made it in


def test_transcribe_command_line_mistakes(tiny_run, tmp_path):
    usage = run_module("jaxspeech.transcribe", "--workdir", str(tiny_run[0]), check=False)
    assert usage.returncode == 2 and "give one or more audio files" in usage.stderr
