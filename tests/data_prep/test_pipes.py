"""Commands named by data (data_prep/readers/pipes.py): Kaldi recipes' wav.scp pipelines
parse into argument lists and run stage to stage without a shell; shell syntax is refused
before anything runs; a "pipe:" audio path in a format that defines no commands (a NeMo
manifest, a Lhotse file source) is a skipped item even with --allow_pipes. Every injection
is checked by its effect: a sentinel file it would create does not exist."""

from __future__ import annotations

import dataclasses
import json
import shlex

import numpy as np
import pytest
import soundfile as sf

from data_prep.config import parse_args
from data_prep.readers.audio import load_item_audio
from data_prep.readers.common import AudioError
from data_prep.readers.kaldi import PIPE_FAILED, load_pipe_audio
from data_prep.readers.lhotse import audio_source, cut_item
from data_prep.readers.manifest import parse_manifest_line
from data_prep.readers.pipes import (
    PIPE_NOT_IN_FORMAT,
    PIPE_SHELL_SYNTAX,
    PipelineError,
    parse_pipeline,
    run_pipeline,
)


@pytest.mark.parametrize(
    "command, stages",
    [  # wav.scp lines of Kaldi recipes (the "|" already taken off by the reader)
        ("flac -c -d -s /d/x.flac", [["flac", "-c", "-d", "-s", "/d/x.flac"]]),
        ("sox /d/x.wav -t wav -", [["sox", "/d/x.wav", "-t", "wav", "-"]]),
        (
            "sph2pipe -f wav -p -c 1 /d/x.sph",
            [["sph2pipe", "-f", "wav", "-p", "-c", "1", "/d/x.sph"]],
        ),
        (
            "sph2pipe -f wav -p -c 1 /d/x.sph | sox -t wav - -r 8000 -t wav -",
            [
                ["sph2pipe", "-f", "wav", "-p", "-c", "1", "/d/x.sph"],
                ["sox", "-t", "wav", "-", "-r", "8000", "-t", "wav", "-"],
            ],
        ),
        ("cat 'a b.wav'|cat", [["cat", "a b.wav"], ["cat"]]),
        ('cat "a\'b.wav" x\\ y.wav', [["cat", "a'b.wav", "x y.wav"]]),
        ("echo '; | $(x) `y` > * ~'", [["echo", "; | $(x) `y` > * ~"]]),  # quoted: data
        ("echo a#b c~d", [["echo", "a#b", "c~d"]]),  # not at a word's start: plain text
    ],
)
def test_kaldi_pipelines_parse_into_argument_lists(command, stages):
    assert parse_pipeline(command) == stages


@pytest.mark.parametrize(
    "command, why",
    [
        ("cat good.wav ; touch X", "';'"),
        ("cat good.wav && touch X", "'&'"),
        ("cat good.wav & touch X", "'&'"),
        ("cat good.wav || touch X", "'||'"),
        ("cat good.wav > X", "redirection"),
        ("cat < good.wav", "redirection"),
        ("sox x.wav -t wav - 2>/dev/null", "redirection"),
        ("cat $(touch X)", "substitution"),
        ('cat "$(touch X)"', "inside double quotes"),
        ('cat "\\$HOME"', "inside double quotes"),  # sh reads '$': shlex would keep '\\$'
        ('cat "\\`touch X\\`"', "inside double quotes"),
        ("cat `touch X`", "substitution"),
        ("cat $HOME/x.wav", "substitution"),
        ("(cat x.wav)", "subshell"),
        ("cat *.wav", "glob"),
        ("cat ~/x.wav", "home directory"),
        ("cat x.wav # comment", "comment"),
        ("A=1 cat x.wav", "variable assignment"),
        ("cat x.wav\ntouch X", "second line"),
        ("cat 'x.wav", "unbalanced"),
        ("cat x.wav | | cat", "empty command"),
        ("| cat", "empty command"),
        ("", "empty command"),
        ("cat x\x00y", "NUL"),
    ],
)
def test_shell_syntax_is_refused(command, why):
    with pytest.raises(ValueError, match=why):
        parse_pipeline(command)


@pytest.fixture()
def wav(tmp_path):
    path = tmp_path / "good.wav"
    sf.write(str(path), np.linspace(-0.5, 0.5, 800), 8000, subtype="PCM_16")
    return str(path)


def _cfg(allow_pipes: bool = True):
    cfg = parse_args(["p", "--input", "i", "--output", "o", "--split", "s"])[0]
    return dataclasses.replace(cfg, allow_pipes=allow_pipes)


def test_pipelines_run_stage_to_stage_without_a_shell(wav, tmp_path):
    want = open(wav, "rb").read()
    assert run_pipeline(parse_pipeline(f"cat {wav} | cat | cat"), 30.0) == want
    audio, rate = load_pipe_audio(f"cat {wav} | cat")
    np.testing.assert_array_equal(audio, sf.read(wav, dtype="float32", always_2d=True)[0])
    assert rate == 8000
    # A stage the next one stops reading from ends by SIGPIPE, as in a shell: not a failure.
    assert run_pipeline([["yes"], ["head", "-c", "6"]], 30.0) == b"y\ny\ny\n"
    # Shell syntax inside quotes reaches the program as an argument; no shell reads it.
    sentinel = tmp_path / "X"
    with pytest.raises(AudioError, match="exited with 1") as e:
        load_pipe_audio(f"cat {wav} '; touch {sentinel}'")
    assert e.value.reason == PIPE_FAILED and not sentinel.exists()
    with pytest.raises(PipelineError, match="cannot run 'no-such-program-jaxspeech'"):
        run_pipeline([["cat", wav], ["no-such-program-jaxspeech"]], 30.0)
    with pytest.raises(PipelineError, match="'false' exited with 1"):  # a middle stage
        run_pipeline([["cat", wav], ["false"], ["cat"]], 30.0)
    with pytest.raises(PipelineError, match="timed out"):
        run_pipeline([["sleep", "5"], ["cat"]], 0.2)


def test_injections_run_nothing(wav, tmp_path):
    """The issue's strings, through every reader that sees them, with --allow_pipes: no
    sentinel file appears and each item has its skip reason."""
    sentinel = tmp_path / "X"
    touch = shlex.quote(str(sentinel))
    # A NeMo manifest's audio path (the case): not a command in that format.
    for path, reason in (
        (f"pipe:// ; touch {touch} ; cat {wav}", PIPE_NOT_IN_FORMAT),
        (f"pipe:touch {touch}", "missing_audio"),  # a relative name: a file beside the manifest
    ):
        line = json.dumps({"audio_filepath": path, "text": "hi"}).encode()
        item = parse_manifest_line(line, 1, "m.jsonl", str(tmp_path))
        with pytest.raises(AudioError) as e:
            load_item_audio(item, _cfg())
        assert e.value.reason == reason, path
    # A Lhotse recording: a file source named "pipe:..." is refused by the reader; a
    # command source with shell syntax by the loader.
    recording = {
        "sources": [{"type": "file", "channels": [0], "source": f"pipe:// ; touch {touch}"}]
    }
    assert audio_source(recording, (0,), str(tmp_path)) == PIPE_NOT_IN_FORMAT
    for command in (f"cat {wav}; touch {touch}", f"cat $(touch {touch})", f"cat `touch {touch}`"):
        cut = {
            "id": "c",
            "type": "MonoCut",
            "start": 0.0,
            "duration": 0.1,
            "channel": 0,
            "recording": {
                "id": "r",
                "sources": [{"type": "command", "channels": [0], "source": command}],
            },
            "supervisions": [{"id": "s", "start": 0.0, "duration": 0.1, "text": "hi"}],
        }
        item = cut_item(cut, 1, "cuts.jsonl", str(tmp_path))
        assert item.error is None and item.pipe
        with pytest.raises(AudioError) as e:
            load_item_audio(item, _cfg())
        assert e.value.reason == PIPE_SHELL_SYNTAX, command
    assert not sentinel.exists()
