"""`python -m jaxspeech.evaluate` on a synthesizer's run (jaxspeech/tts/evaluation.py):
the session's tiny run (tests/tts/conftest.py, copied) evaluated once through the CLI on
its dev split and on a split with a voice it never learned; PESQ called right; a split
without phonemes refused with one line; the recognizer on waveforms in memory
(jaxspeech/evaluation/recognize.py) with a tiny in-process model. A real recognizer run's
CER on synthesized vs. real speech: tests/e2e/test_tts_intelligibility.py."""

from __future__ import annotations

import glob
import json
import math
import shutil

import jax
import numpy as np
import pytest
import soundfile as sf

from configs import demo, tts
from jaxspeech.audio import features
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.audio.griffin_lim import griffin_lim
from jaxspeech.config import build
from jaxspeech.data.tokenizer import train_char_tokenizer
from jaxspeech.evaluation.recognize import WaveRecognizer
from jaxspeech.metrics.speech import Reference
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import loading
from jaxspeech.tts import scores as tts_scores
from tests.e2e.cli import run_module
from tests.metrics.test_writers import read_event_file, summary_values
from tests.tts import corpus

STEP = tts.get_config("tiny").train.num_steps


@pytest.fixture(scope="module")
def data(tts_corpus, tmp_path_factory):
    """dev of the session's corpus, "held": one utterance of each of two train voices and
    of a stranger's, and "plain": a split prepared without phonemes."""
    root = tmp_path_factory.mktemp("tts-eval-data")
    shutil.copytree(tts_corpus / "dev", root / "dev")
    voices = {"low": 110.0, "mid": 160.0, "stranger": 300.0}
    corpus.write_split(str(root), "held", 1, seed=5, speakers=voices)
    corpus.write_split(str(root), "plain", 1, seed=6, phonemes=False)
    return root


@pytest.fixture(scope="module")
def evaluated(tts_tiny_run, data, tmp_path_factory):
    """(run copy, the CLI's finished process) of one evaluation of dev and held (without
    DNSMOS: 3 s of CPU an utterance; tests/tts/test_vocoder_training.py takes it)."""
    run = tmp_path_factory.mktemp("tts-eval") / "run"
    shutil.copytree(tts_tiny_run[0], run)
    args = ["--workdir", str(run), "--data", str(data), "--split", "dev,held"]
    args += ["--mos_utterances", "0"]
    return run, run_module("jaxspeech.evaluate", *args)


def test_the_cli_writes_scores_rows_and_samples(evaluated):
    run, proc = evaluated
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [p["split"] for p in printed] == ["dev", "held"]
    with open(run / "eval" / f"dev-step{STEP}-synthesis.json") as f:
        dev = json.load(f)
    assert dev == printed[0] | {"examples": []} and dev["step"] == STEP
    assert dev["num_utts"] == 6 and dev["skipped"] == 0 and dev["task"] == "tts"
    # Measured after 40 steps of the tiny model (at one frame a decoder position): MCD-DTW
    # 70.8 dB (its in-loop mel-domain MCD: 73.6), PESQ 1.10, F0 RMSE 85 Hz, voicing error
    # 0.42: it does not speak yet (test_the_vocoder_floor_scores_well: what the measures
    # give good speech). Finite numbers are what is checked; F0 RMSE needs frames voiced in
    # both, which the tiny model at two frames a position may not voice at all: then no
    # utterance counts and every row says why.
    for key in ("mcd_db", "pesq", "voicing_error"):
        assert math.isfinite(dev[key]), (key, dev)
    assert dev["f0_rmse_hz"] is None or math.isfinite(dev["f0_rmse_hz"]), dev
    assert dev["mcd_utterances"] == 6 and dev["pesq_utterances"] >= 1
    assert dev["dnsmos_utterances"] == 0 and dev["dnsmos_ovrl"] is None and "real" not in dev
    assert 1.0 <= dev["pesq"] <= 4.65 and dev["mcd_db"] > 0
    rows = [
        json.loads(line) for line in open(run / "eval" / f"dev-step{STEP}-synthesis-utts.jsonl")
    ]
    assert [r["id"] for r in rows] == sorted(
        f"dev-{s}-{i:02d}" for s in corpus.SPEAKER_F0 for i in range(2)
    )
    for r in rows:
        assert r["text"] and r["speaker"] in corpus.SPEAKER_F0 and math.isfinite(r["mcd_db"])
        assert r["synthesized_seconds"] > 0 and not r["truncated"]
        assert r["pesq"] is not None or "pesq" in r["unscored"]
        assert r["f0_rmse_hz"] is not None or "f0_rmse_hz" in r["unscored"]
    assert dev["f0_utterances"] == sum(r["f0_rmse_hz"] is not None for r in rows)
    samples = sorted(glob.glob(str(run / "eval" / "samples" / f"dev-step{STEP}-*.wav")))
    assert len(samples) == 4
    audio, sr = sf.read(samples[0])
    assert sr == 16000 and len(audio) > 1600 and np.abs(audio).max() > 0.01


def test_an_unknown_voice_is_skipped_and_counted(evaluated):
    run, _ = evaluated
    with open(run / "eval" / f"held-step{STEP}-synthesis.json") as f:
        held = json.load(f)
    assert held["num_utts"] == 2 and held["skipped"] == 1
    assert held["skipped_reasons"] == {"unknown speaker": 1}
    (skip,) = held["skipped_examples"]
    assert skip["id"] == "held-stranger-00" and "'stranger'" in skip["detail"]


def test_tensorboard_has_audio_images_and_means(evaluated):
    run, _ = evaluated
    values = []
    for path in glob.glob(str(run / "tensorboard" / "events.out.tfevents.*")):
        values += summary_values(read_event_file(path))
    tags = {v.tag: (step, v) for step, v in values if v.tag.startswith("synthesis/")}
    step, audio = tags["synthesis/dev/dev-high-00"]
    assert step == STEP and audio.audio.sample_rate == 16000 and audio.audio.length_frames > 0
    assert "synthesis/dev/dev-high-00/mel_real_aligned_predicted" in tags
    assert math.isfinite(tags["synthesis/dev/mcd_db"][1].simple_value)
    assert {"synthesis/held/held-low-00", "synthesis/held/mcd_db"} <= set(tags)


def test_a_split_without_phonemes_is_one_line_exit_2(tts_tiny_run, data):
    proc = run_module(
        "jaxspeech.evaluate", "--workdir", str(tts_tiny_run[0]), "--data", str(data),
        "--split", "plain", check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "plain has no phoneme fields" in line


# ---------------------------------------------------------------- PESQ
def _speech(seconds: float, seed: int) -> np.ndarray:
    """Tiny-corpus utterances end to end: voiced harmonics, noise and pauses."""
    rng, parts = np.random.default_rng(seed), []
    while sum(map(len, parts)) < seconds * corpus.SR:
        parts.append(corpus.utterance(rng, 140.0)[0].astype(np.float32) / 32768.0)
    return np.concatenate(parts)


def test_pesq_of_a_recording_against_itself_is_high_and_against_noise_low():
    ref = _speech(3.0, seed=0)
    same = tts_scores.pesq_wb(ref, ref, 16000)
    noise = 0.1 * np.random.default_rng(1).standard_normal(len(ref)).astype(np.float32)
    assert same > 4.4  # wide-band PESQ tops out at 4.64
    assert tts_scores.pesq_wb(ref, noise, 16000) < 1.5
    assert tts_scores.pesq_wb(ref, ref + 0.3 * noise, 16000) < same
    # Another rate is resampled to 16 kHz (the only rate wide-band PESQ knows).
    import soxr

    ref22 = soxr.resample(ref, 16000, 22050)
    assert tts_scores.pesq_wb(ref22, ref22, 22050) > 4.0
    with pytest.raises(ValueError, match="PESQ"):
        tts_scores.pesq_wb(np.zeros(16000, np.float32), np.zeros(16000, np.float32), 16000)


def test_the_vocoder_floor_scores_well():
    """A recording's own log-mel through Griffin-Lim (a perfect synthesizer's output, in
    step with the recording) scores far better than the tiny model or noise. Measured:
    MCD-DTW 8.2 dB, PESQ 3.38, F0 RMSE 0.65 Hz, voicing error 0.09 (noise: 84.5 dB, PESQ
    1.03, no frame voiced in both)."""
    ref = _speech(1.0, seed=2)
    cfg = LogMelConfig()
    vocoded = griffin_lim(features.reference_log_mel(ref, cfg), cfg)[: len(ref)]
    got = tts_scores.score_utterance(ref, vocoded, vocoded, 16000)
    assert got["mcd_db"] < 12 and got["pesq"] > 2.0, got
    assert got["f0_rmse_hz"] < 10 and got["voicing_error"] < 0.2, got
    assert "unscored" not in got
    noise = 0.05 * np.random.default_rng(0).standard_normal(len(ref)).astype(np.float32)
    # One analysed reference for two "vocoders" (as the evaluation scores its vocoders):
    # the same rows as from the waveform.
    reference = Reference(ref, 16000)
    assert tts_scores.score_utterance(reference, vocoded, vocoded, 16000) == got
    bad = tts_scores.score_utterance(reference, noise, noise, 16000)
    assert bad == tts_scores.score_utterance(ref, noise, noise, 16000)
    assert bad["mcd_db"] > got["mcd_db"] + 20 and bad["pesq"] < 1.5
    assert bad["f0_rmse_hz"] is None and "f0_rmse_hz" in bad["unscored"]
    with pytest.raises(ValueError, match="reference at 16000 Hz"):
        tts_scores.score_utterance(reference, noise, noise, 22050)
    # DNSMOS is scored apart (in the evaluation's own thread) and added to the row: its
    # values fill the row's None, its reason joins the row's other ones.
    row = dict(bad)
    tts_scores.add_dnsmos(row, dict.fromkeys(tts_scores.DNSMOS, 3.0))
    assert row == bad | dict.fromkeys(tts_scores.DNSMOS, 3.0)
    unscorable = dict.fromkeys(tts_scores.DNSMOS) | {"unscored": {"dnsmos": "empty"}}
    tts_scores.add_dnsmos(row, unscorable)
    assert row["unscored"] == bad["unscored"] | {"dnsmos": "empty"}
    assert all(row[k] is None for k in tts_scores.DNSMOS)
    assert "dnsmos" not in bad["unscored"]  # the row added to is a copy: bad's own is kept


# ---------------------------------------------------------------- the recognizer on waves
@pytest.fixture(scope="module")
def recognizer(tmp_path_factory):
    """configs/demo.py:tiny's recognizer, freshly initialized, on one device."""
    config = demo.get_config("tiny")
    tokenizer = train_char_tokenizer(["a cat sat on the mat"])
    tok_dir = str(tmp_path_factory.mktemp("tokenizer"))
    tokenizer.save(tok_dir)
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    with rules.axis_rules(build.rules_from_config(config)):
        spec = build.abstract_model(config, tokenizer.vocab_size, mesh)
        params = build.init_params(config, tokenizer.vocab_size, spec, seed=0)
    ones = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), spec.model_vars)  # mean, std
    model_vars = jax.device_put(ones, spec.var_shardings)
    run = loading.Run(config, tok_dir, tokenizer, 0, spec, params, model_vars)
    return WaveRecognizer(run, config, rows=2)


def test_the_recognizer_transcribes_each_wave_in_its_own_row(recognizer):
    rng = np.random.default_rng(0)
    waves = [_speech(d, seed=i) for i, d in enumerate((0.4, 1.3, 0.7))]
    waves[1] += 0.05 * rng.standard_normal(len(waves[1])).astype(np.float32)
    hyps = recognizer.transcribe(waves, 16000)  # two batches of 2 rows, one padding row
    assert len(hyps) == 3 and all(isinstance(h, str) for h in hyps)
    assert recognizer.transcribe(waves[::-1], 16000) == hyps[::-1]
    # Alone, padded to the same width (the same program): the same hypothesis.
    assert recognizer.transcribe([waves[2]], 16000, seconds=1.3) == [hyps[2]]
    assert len(recognizer.transcribe(waves, 8000)) == 3  # resampled to the run's rate
    counts = ErrorCounts()
    row = recognizer.score(counts, "a cat", "a cap")
    assert row["char_errors"] == 1 and counts.utterances == 1
