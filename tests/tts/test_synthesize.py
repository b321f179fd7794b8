"""`python -m jaxspeech.synthesize` (jaxspeech/synthesize.py, jaxspeech/tts/synthesis.py,
jaxspeech/tts/frontend.py) on the session's tiny runs (tests/tts/conftest.py; read, never
changed), its `main` called in process with a flag set of its own: WAV files from a
sentence with Griffin-Lim, with the vocoder run and from an exported artifact (the same
speech as the run's), a text file's sentences and their manifest, every input mistake as
one line and exit 2 before anything is written, and the espeak-ng front end against the
demo corpus's own rendering of the same sentence.

The tiny corpus's phonemes are not espeak-ng's (tests/tts/corpus.py), so its sentences
are given as phonemes (--front_end phonemes); the espeak-ng front end is checked on its
own, and refusing a sentence whose phonemes the run lacks."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
from absl import flags

from data_prep.demo import synth
from jaxspeech import synthesize
from jaxspeech.common import cli
from jaxspeech.common.errors import UserError
from jaxspeech.tts import artifact as tts_artifact
from jaxspeech.tts import frontend, synthesis
from jaxspeech.tts.batch import PhonemeTable
from jaxspeech.tts.text import espeak

SR, HOP = 16000, 160
SENTENCE = "_ a m i s u _"


def run_main(args: list[str], capsys) -> tuple[int, str, str]:
    """`synthesize.main` on `args` as the command line runs it: (exit code, stdout,
    stderr)."""
    fv = flags.FlagValues()
    synthesize.define_flags(fv)
    code = 0
    try:
        argv = cli.parse_flags(["synthesize", *args], fv, doc="")
        synthesize.main(argv, fv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def read_wav(path) -> np.ndarray:
    audio, rate = sf.read(str(path), dtype="float32")
    assert rate == SR and audio.ndim == 1 and len(audio) % HOP == 0
    assert np.isfinite(audio).all() and np.sqrt(np.mean(audio**2)) > 1e-3  # not silent
    return audio


@pytest.fixture(scope="module")
def synthesizer(tts_tiny_run):
    """The tiny run, loaded once for the module's in-process calls."""
    return synthesis.from_run(str(tts_tiny_run[0]))


def speak(synth, path, **kwargs) -> np.ndarray:
    """SENTENCE as speaker "low" into the WAV `path`, read back and checked."""
    result = synthesis.synthesize_to_files(
        synth, [(1, SENTENCE)], "low", str(path), front_end="phonemes", **kwargs
    )
    assert result["files"] == [str(path)] and result["manifest"] is None
    return read_wav(path)


def test_the_command_writes_a_wav_of_a_sentence(tts_tiny_run, tmp_path, capsys):
    path = tmp_path / "out.wav"
    args = [f"--workdir={tts_tiny_run[0]}", "--front_end=phonemes", f"--text={SENTENCE}"]
    code, out, err = run_main([*args, "--speaker=low", f"--output={path}"], capsys)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["files"] == [str(path)] and result["vocoder"] == "griffin_lim"
    assert "synthesized 1 sentence(s)" in err
    assert len(read_wav(path)) == round(result["seconds"] * SR)


def test_the_vocoder_run_and_the_artifact(synthesizer, vocoder_tiny_run, tmp_path):
    """The tiny vocoder run speaks the same frames as Griffin-Lim, other samples;
    the exported artifact (StableHLO) speaks as the run."""
    griffin = speak(synthesizer, tmp_path / "gl.wav")
    neural_synth = synthesis.with_vocoder_run(synthesizer, str(vocoder_tiny_run[0]))
    neural = speak(neural_synth, tmp_path / "neural.wav")
    assert len(neural) == len(griffin) and not np.allclose(neural, griffin, atol=1e-2)
    out = tmp_path / "artifact"
    tts_artifact.export_tts_run(synthesizer.source, str(out))
    exported = synthesis.from_artifact(str(out))
    assert exported.max_frames == synthesizer.max_frames and exported.vocoder is None
    assert exported.speakers == synthesizer.speakers and exported.table == synthesizer.table
    # 16-bit samples of the same log-mel up to float rounding, through Griffin-Lim
    np.testing.assert_allclose(speak(exported, tmp_path / "exported.wav"), griffin, atol=2e-3)


def test_a_text_file_writes_one_wav_per_line_and_a_manifest(synthesizer, tmp_path, monkeypatch):
    text = tmp_path / "sentences.txt"
    text.write_text("_ a m i _\n\n_ s u _\n  _ m a s _  \n", encoding="utf-8")
    lines, blank = synthesis.read_lines(None, str(text))
    assert blank == 1
    out_dir, progress = tmp_path / "out", io.StringIO()
    monkeypatch.setattr(synthesis, "PROGRESS_FROM", 3)
    result = synthesis.synthesize_to_files(
        synthesizer,
        lines,
        "2",
        str(out_dir),
        front_end="phonemes",
        duration_scale=1.5,
        progress=progress,
    )
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "0001.wav",
        "0003.wav",
        "0004.wav",
        "manifest.jsonl",
    ]
    assert result["manifest"] == str(out_dir / "manifest.jsonl") and result["sentences"] == 3
    rows = [json.loads(line) for line in (out_dir / "manifest.jsonl").read_text().splitlines()]
    assert [(r["audio_filepath"], r["line"], r["text"]) for r in rows] == [
        ("0001.wav", 1, "_ a m i _"),
        ("0003.wav", 3, "_ s u _"),
        ("0004.wav", 4, "_ m a s _"),
    ]
    for r in rows:
        audio = read_wav(out_dir / r["audio_filepath"])
        assert r["speaker"] == "mid" and r["duration"] == pytest.approx(len(audio) / SR)
    assert "synthesize [####################] 3/3 sentences 100%" in progress.getvalue()


def test_mistakes_are_one_line_and_exit_2(tts_tiny_run, tmp_path, capsys):
    """Through the command line: each mistake one `error:` line, exit 2, nothing written."""
    run = f"--workdir={tts_tiny_run[0]}"
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    out = tmp_path / "never.wav"
    cases = {
        "unknown speaker 'nobody'": [run, "--text=_ a _", "--speaker=nobody"],
        "empty text: nothing to say": [run, "--text=  ", "--speaker=low"],
        "has no sentence (blank lines only)": [run, f"--text_file={blank}", "--speaker=low"],
        "cannot phonemize 'Hello there.': espeak-ng (voice en-us) gives phonemes": [
            run,
            "--text=Hello there.",
            "--speaker=low",
        ],
        "--artifact: ": [f"--artifact={tmp_path}", "--text=_ a _", "--speaker=low"],
    }
    for message, args in cases.items():
        front = [] if "Hello" in args[1] else ["--front_end=phonemes"]
        code, stdout, err = run_main([*args, *front, f"--output={out}"], capsys)
        assert code == 2, (message, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (message, err)
        assert message in lines[0], (message, err)
        assert not out.exists()


def test_library_mistakes_name_the_problem(synthesizer, tmp_path):
    """The same checks in process (`synthesize_to_files`): ids out of range, characters and
    phonemes the front end cannot give, too many phonemes or too long predicted speech for
    max_frames, a bad duration scale, several sentences into one .wav."""
    frames = synthesizer.max_frames
    out = str(tmp_path / "x.wav")
    cases = [
        ([(1, "_ a _")], "3", {}, "unknown speaker '3'"),
        ([(1, "_ a _")], "-1", {}, "unknown speaker '-1'"),
        ([(1, "_ a b _")], "low", {}, "cannot phonemize '_ a b _': phonemes ['b'] are not in"),
        ([(1, "Hello \u65e5\u672c.")], "low", {"front_end": "espeak"}, "cannot phonemize"),
        ([(1, "42")], "low", {"front_end": "nope"}, "unknown front end 'nope'"),
        ([(7, " ".join(["a"] * (frames + 1)))], "low", {}, f"line 7: {frames + 1} phonemes"),
        ([(3, "_ a _")], "low", {"duration_scale": 1e4}, "1 sentence(s) would run past"),
        ([(1, "_ a _")], "low", {"duration_scale": 0.0}, "--duration_scale must be"),
        ([(1, "_ a _")], "low", {"duration_scale": float("nan")}, "--duration_scale must be"),
        ([(1, "_ a _"), (2, "_ u _")], "low", {}, "is one file but the text has 2 sentences"),
    ]
    for lines, speaker, kwargs, message in cases:
        kwargs = {"front_end": "phonemes"} | kwargs
        with pytest.raises(UserError) as e:
            synthesis.synthesize_to_files(synthesizer, lines, speaker, out, **kwargs)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "x.wav").exists()
    sentence = synthesis.Sentence(1, "_ a _", "_ a _", ["_", "a", "_"])
    with pytest.raises(UserError, match="speaker id 3 is out of range: valid ids are 0 to 2"):
        synthesis.spoken_mels(synthesizer, [sentence], 3, 1.0)


def test_espeak_front_end_phonemizes_as_the_demo_corpus():
    """A sentence through the front end gives the tokens the demo corpus's own rendering
    (`data_prep.demo.synth.render`: espeak-ng, trimmed, resampled, aligned) gives it for
    the same speaker: in two accents whose phonemes differ."""
    text, spoken = frontend.normalized("Dr. Smith paid $15 for 2 apples in 1984, didn't he?")
    assert text == (
        "doctor smith paid fifteen dollars for two apples in nineteen eighty four didn't he"
    )
    tts = espeak.Espeak.get()
    got = {}
    for name in ("us_m2", "sc_m6"):
        speaker = next(s for s in synth.SPEAKERS if s.name == name)
        utt = synth.Utterance(
            f"x-{name}", "x", name, speaker.voice, speaker.variant, text, spoken,
            speaker.rate, speaker.pitch, speaker.pitch_range, -3.0, 0.1, 0.1, -70.0, 7,
        )  # fmt: skip
        _, alignment = synth.render(utt, tts)
        got[name] = frontend.espeak_tokens(spoken, frontend.voice_for(name))
        assert got[name] == list(alignment.phonemes)
        table = PhonemeTable.from_inventory(alignment.phonemes)
        assert frontend.tokens_of(spoken, table, "espeak", frontend.voice_for(name)) == (
            text,
            got[name],
        )
    assert got["us_m2"] != got["sc_m6"]  # the accent decides the phonemes
    assert frontend.voice_for("someone").name == frontend.DEFAULT_VOICE
