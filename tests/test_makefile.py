"""`make demo`'s and `make demo-tts`'s commands, read with `make -n` (nothing runs): every
step reads and writes the corpus and runs that DEMO_DATA, DEMO_RUN, DEMO_TTS_RUN and
DEMO_VOCODER_RUN name, so a second corpus (another natural share, another size) is trained
on, not the default one."""

import re
import shutil
import subprocess

import pytest

from tests.e2e.cli import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_steps_follow_demo_data_and_demo_run(tmp_path):
    data, run = tmp_path / "corpus", tmp_path / "run"
    out = subprocess.run(
        ["make", "-n", "demo", f"DEMO_DATA={data}", f"DEMO_RUN={run}", "DEMO_NATURAL_SHARE=0.25"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commands = re.sub(r"\\\n\s*", " ", out)  # one line per command
    train = [c for c in commands.splitlines() if "-m jaxspeech.train" in c]
    assert len(train) == 1 and f"--config.data.dir={data}/shards" in train[0], train
    assert f"--workdir {run}" in train[0]
    evaluate = [c for c in commands.splitlines() if "-m jaxspeech.evaluate" in c]
    assert len(evaluate) == 2
    assert all(f"--data {data}/shards" in c and f"--workdir {run}" in c for c in evaluate)
    synth = [c for c in commands.splitlines() if "-m data_prep.demo.synth" in c]
    # Synthesized, then checked before training (a corpus of another share is refused).
    assert len(synth) == 2 and "--check" in synth[1] and "--check" not in synth[0]
    assert all(f"--output {data}/raw" in c and "--natural_share 0.25" in c for c in synth)
    assert commands.index(synth[1]) < commands.index(train[0])


def _commands(*args: str) -> list[str]:
    """`make -n ARGS`'s commands, one line each (a recursive make's included: make runs
    the lines that call $(MAKE) even with -n, passing -n on)."""
    out = subprocess.run(
        ["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return re.sub(r" *\\\n\s*", " ", out).splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_tts_steps(tmp_path):
    data, run, tts_run = tmp_path / "corpus", tmp_path / "run", tmp_path / "tts"
    voc = tmp_path / "vocoder"
    args = ["demo-tts", f"DEMO_DATA={data}", f"DEMO_RUN={run}", f"DEMO_TTS_RUN={tts_run}"]
    args.append(f"DEMO_VOCODER_RUN={voc}")
    # No recognizer run yet: `make demo` trains it first, then the synthesizer and the
    # vocoder train.
    commands = _commands(*args)
    train = [c for c in commands if "-m jaxspeech.train" in c]
    assert len(train) == 3 and "--config configs/demo.py" in train[0], train
    assert f"--workdir {run}" in train[0]
    # The corpus: a stale one (no phonemes, no tts_heldout split) is named in one line,
    # then tts_heldout is prepared with its phonemes required.
    check = [c for c in commands if f"{data}/shards/train/phonemes.json" in c]
    assert len(check) == 1 and f"rm -rf {data}" in check[0]
    prepare = [c for c in commands if "-m data_prep.prepare" in c and "tts_heldout" in c]
    assert len(prepare) == 1 and "--require_phonemes" in prepare[0]
    assert f"--input {data}/raw/tts_heldout/manifest.jsonl" in prepare[0]
    assert f"--output {data}/shards" in prepare[0] and "--split tts_heldout" in prepare[0]
    # A recognizer run exists: reused, only the synthesizer and the vocoder train.
    run.mkdir()
    (run / "config.json").write_text("{}")
    commands = _commands(*args, "DEMO_TTS_CONFIG=configs/tts.py:tiny")
    train = [c for c in commands if "-m jaxspeech.train" in c]
    assert len(train) == 2 and "--config configs/tts.py:tiny" in train[0], train
    assert f"--workdir {tts_run}" in train[0] and f"--config.data.dir={data}/shards" in train[0]
    assert "--config configs/vocoder.py" in train[1] and f"--workdir {voc}" in train[1]
    assert f"--config.data.dir={data}/shards" in train[1]
    # Between them, the synthesizer's teacher-forced frames of half the train split, which
    # the vocoder learns from; DEMO_GTA_UTTERANCES=0: the recordings' log-mel alone.
    gta = [c for c in commands if "-m jaxspeech.synthesize" in c]
    assert len(gta) == 1 and commands.index(train[0]) < commands.index(gta[0])
    assert commands.index(gta[0]) < commands.index(train[1])
    store = f"{tts_run}/gta-train.npz"
    assert f"--workdir {tts_run} --data {data}/shards --gta_split train" in gta[0]
    assert f"--gta_max_utterances 4725 --output {store}" in gta[0]
    assert train[1].endswith(f"--config.vocoder.gta_mels={store}")
    plain = _commands(*args, "DEMO_GTA_UTTERANCES=0")
    assert not any("jaxspeech.synthesize" in c or "gta_mels" in c for c in plain)
    evaluate = [c for c in commands if "-m jaxspeech.evaluate" in c]
    assert len(evaluate) == 1 and evaluate[0].endswith(
        f" -m jaxspeech.evaluate --workdir {tts_run} --data {data}/shards "
        f"--split tts_heldout --asr_workdir {run} --vocoder_workdir {voc}"
    )
    assert not any("no recognizer run" in c or "configs/demo.py" in c for c in commands)
    # The corpus's settings are checked before the synthesizer trains on it.
    check = [c for c in commands if "-m data_prep.demo.synth --check" in c]
    assert len(check) == 1 and f"--output {data}/raw" in check[0]
    assert commands.index(check[0]) < commands.index(train[0])
