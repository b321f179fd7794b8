"""A synthesizer's intelligibility through `python -m jaxspeech.evaluate --asr_workdir`:
the session's tiny recognizer run (tests/e2e/conftest.py) transcribes the tiny
synthesizer's speech (tests/tts/conftest.py) and the recordings of the same sentences;
its CER on both and their ratio reach the summary and every utterance's row. Neither run
is trained to be good: the plumbing is checked, not the rates."""

from __future__ import annotations

import json
import math
import shutil

from tests.e2e.cli import run_module
from tests.tts import conftest as tts_fixtures

# The text-to-speech tests' session fixtures (tests/tts/conftest.py), here too.
tts_corpus = tts_fixtures.tts_corpus
tts_tiny_run = tts_fixtures.tts_tiny_run


def test_recognizer_rates_on_synthesized_and_real_speech(
    tiny_run,
    tts_tiny_run,
    tts_corpus,
    tmp_path,
):
    run = tmp_path / "tts-run"
    shutil.copytree(tts_tiny_run[0], run)
    proc = run_module(
        "jaxspeech.evaluate", "--workdir", str(run), "--data", str(tts_corpus),
        "--split", "dev", "--asr_workdir", str(tiny_run[0]), "--max_utterances", "3",
        "--mos_utterances", "0",  # DNSMOS: tests/tts/test_vocoder_training.py
    )  # fmt: skip
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(line)
    assert result["num_utts"] == 3 and result["asr_step"] == 8
    assert result["asr_workdir"] == str(tiny_run[0])
    for unit in ("cer", "wer"):
        synthesized, real = result[f"{unit}_synthesized"], result[f"{unit}_real"]
        assert math.isfinite(synthesized) and math.isfinite(real)
        if real > 0:
            assert result[f"{unit}_ratio"] == round(synthesized / real, 4)
    assert "stand-in for MOS" in result["intelligibility_note"]
    step = result["step"]
    rows = [json.loads(r) for r in open(run / "eval" / f"dev-step{step}-synthesis-utts.jsonl")]
    assert len(rows) == 3
    for r in rows:
        assert isinstance(r["hyp_synthesized"], str) and isinstance(r["hyp_real"], str)
        assert 0 <= r["cer_real"] and 0 <= r["cer_synthesized"] and r["ref"]
    assert "  ref: " in proc.stderr  # the examples, as the recognizer's evaluation prints
