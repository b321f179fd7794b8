"""The vocoder through the one trainer (config.task = "vocoder"; configs/vocoder.py:tiny is a
Vocos, 10 steps of mel L1 alone, then 10 against the discriminators): a tiny run learns (its mel
L1 falls) and checkpoints both models with their optimizers, a run resumed from its
mid-way checkpoint ends with the uninterrupted run's parameters, the synthesizer's
evaluation scores its speech with both vocoders (one CLI process), and what the vocoder
cannot do is refused in one line: another front end than the synthesizer's, settings its
step does not support.

The session's tiny corpus, tiny synthesizer and tiny vocoder run (tests/tts/conftest.py)
are shared; runs are copied before they are changed."""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest
import soundfile as sf

from configs import tts, vocoder
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.common.errors import UserError
from jaxspeech.config import validate
from jaxspeech.metrics.mos import Dnsmos
from jaxspeech.vocoder.inference import check_vocoder_run
from tests.e2e.cli import run_module, session_overrides

STEPS = vocoder.get_config("tiny").train.num_steps
TTS_STEP = tts.get_config("tiny").train.num_steps


def _meta(run, step: int) -> dict:
    with open(os.path.join(run, "checkpoints", str(step), "meta", "metadata")) as f:
        return json.load(f)


def test_a_tiny_vocoder_run_learns_and_is_compared_with_griffin_lim(vocoder_tiny_run):
    run, out = vocoder_tiny_run
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    mel = [r["train/loss_mel"] for r in rows if "train/loss_mel" in r]
    # Measured with the HiFi-GAN tiny variant before Vocos: log-mel L1 5.19 over steps 1-5,
    # 3.19 over steps 16-20 (the tiny Vocos's figures: not measured yet).
    assert len(mel) == STEPS // 5 and mel[-1] < 0.75 * mel[0], mel
    disc = [r["train/loss_disc"] for r in rows if "train/loss_disc" in r]
    # Steps 1-10 of the mel L1 alone (vocoder.adversarial_start): the discriminators rest.
    assert disc[:2] == [0.0, 0.0] and all(np.isfinite(d) and d > 0 for d in disc[2:]), disc
    with open(run / "eval" / f"dev-step{STEPS}.json") as f:
        dev = json.load(f)
    assert dev["num_utts"] == 6 and dev["skipped"] == 0 and dev["compared_utterances"] == 2
    # Measured (HiFi-GAN tiny): 3.62 (Griffin-Lim from the same mels: 0.15); silence is ~10.
    assert 0 < dev["mel_l1"] < 6 and dev["griffin_lim_mel_l1"] < dev["mel_l1_compared"]
    assert np.isfinite(dev["griffin_lim_mcd_dtw_db"])
    utts = [json.loads(line) for line in open(run / "eval" / f"dev-step{STEPS}-utts.jsonl")]
    assert len(utts) == 6 and sum("griffin_lim_mel_l1" in u for u in utts) == 2
    assert f"eval dev at step {STEPS}: log-mel L1 " in out and "Griffin-Lim mel L1" in out
    events = [json.loads(line) for line in open(run / "events.jsonl")]
    assert events[-1]["event"] == "finished" and events[-1]["mel_l1"] == dev["mel_l1"]
    assert _meta(run, STEPS)["config"]["task"] == "vocoder"
    # Both models and both optimizers in the checkpoint, each under its own key.
    for item in ("model", "train"):
        with open(run / "checkpoints" / str(STEPS) / item / "_METADATA") as f:
            text = f.read()
        assert '"generator"' in text and '"discriminator"' in text, item
    audio, sr = sf.read(run / "samples" / f"step{STEPS}.wav")
    assert sr == 16000 and len(audio) > 1000 and np.abs(audio).max() > 0


def test_resume_continues_to_the_same_parameters(vocoder_tiny_run, tts_corpus, tmp_path):
    """Stopped at its mid-way checkpoint and rerun: the same parameters of both models,
    bit for bit, as the uninterrupted run (segments, order and step are functions of
    (seed, step); both optimizers' states and the loader's position are restored)."""
    run, _ = vocoder_tiny_run
    resumed = tmp_path / "run"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    args = ["--config", "configs/vocoder.py:tiny", "--workdir", str(resumed)]
    quick = ["--config.train.eval_at_end=False", "--config.monitor.samples_every=0"]
    data = f"--config.data.dir={tts_corpus}"
    out = run_module("jaxspeech.train", *args, data, *session_overrides(), *quick).stdout
    assert f"resumed from step {STEPS // 2}" in out
    want = _meta(run, STEPS)["params_fingerprint"]
    assert _meta(resumed, STEPS)["params_fingerprint"] == want


def test_the_synthesizer_evaluation_scores_both_vocoders(
    tts_tiny_run, vocoder_tiny_run, tts_corpus, tmp_path
):
    run = tmp_path / "tts"
    shutil.copytree(tts_tiny_run[0], run)
    args = ["--workdir", str(run), "--data", str(tts_corpus), "--split", "dev"]
    voc = ["--vocoder_workdir", str(vocoder_tiny_run[0]), "--max_utterances", "2"]
    voc += ["--mos_utterances", "1"]  # DNSMOS: 3 s of CPU per utterance and system
    proc = run_module("jaxspeech.evaluate", *args, *voc)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["vocoder"] == "griffin_lim" and summary["num_utts"] == 2
    hifigan = summary["hifigan"]
    assert hifigan["vocoder_step"] == STEPS and hifigan["mcd_utterances"] == 2
    assert np.isfinite(hifigan["mcd_db"]) and np.isfinite(summary["mcd_db"])
    assert hifigan["mcd_db"] != summary["mcd_db"]
    # DNSMOS of the first utterance: Griffin-Lim's, the neural vocoder's and the recording's.
    for scored in (summary, hifigan, summary["real"]):
        assert scored["dnsmos_utterances"] == 1, scored
        assert all(1.0 <= scored[k] <= 5.0 for k in ("dnsmos_sig", "dnsmos_ovrl")), scored
    assert summary["real"]["dnsmos_ovrl"] != summary["dnsmos_ovrl"] != hifigan["dnsmos_ovrl"]
    rows = [json.loads(x) for x in open(run / "eval" / f"dev-step{TTS_STEP}-synthesis-utts.jsonl")]
    assert len(rows) == 2
    assert sum("real" in r for r in rows) == 1  # --mos_utterances 1
    for r in rows:  # every measure of each row, for each vocoder
        assert r["mcd_db"] is not None and r["hifigan"]["mcd_db"] is not None, r
        assert set(r["hifigan"]) >= {"pesq", "f0_rmse_hz", "voicing_error"}
    samples = sorted(glob.glob(str(run / "eval" / "samples" / "*.wav")))
    neural = [s for s in samples if s.endswith("-hifigan.wav")]
    assert len(neural) == 2 and len(samples) == 4
    # DNSMOS is scored in a thread of its own and written back into the rows: each
    # vocoder's row holds the score of its own speech, as a scorer of the kept sample (the
    # same speech as 16-bit PCM) finds it.
    scorer, (scored_row,) = Dnsmos(), [r for r in rows if "real" in r]
    for row, suffix in ((scored_row, ""), (scored_row["hifigan"], "-hifigan")):
        (path,) = [s for s in samples if s.endswith(f"{scored_row['id']}{suffix}.wav")]
        wave, sr = sf.read(path, dtype="float32")
        assert abs(scorer.score(wave, sr).ovrl - row["dnsmos_ovrl"]) < 0.01, (path, row)


def test_a_vocoder_of_another_front_end_is_refused_in_one_line(vocoder_tiny_run):
    run, _ = vocoder_tiny_run
    check_vocoder_run(str(run), LogMelConfig(), "TTS")  # the same front end: accepted
    with pytest.raises(UserError) as e:
        check_vocoder_run(str(run), LogMelConfig(hop_length=256, num_mel_bins=64), "TTS")
    msg = str(e.value)
    assert "\n" not in msg and "hop_length 160 vs 256" in msg and "num_mel_bins 80 vs 64" in msg


@pytest.mark.parametrize(
    "variant,key,value,line",
    [
        ("tiny", "train.grad_accum", 2, "task=vocoder needs train.grad_accum=1"),
        ("tiny", "sync.strategy", "bmuf", "task=vocoder needs sync.strategy='allreduce'"),
        ("hifigan", "features.hop_length", 256, "task=vocoder needs features.hop_length=160"),
        ("hifigan", "vocoder.generator_channels", 40, "must be a multiple of 16"),
        ("tiny", "vocoder.generator", "wavenet", "unknown generator 'wavenet'"),
    ],
)
def test_unsupported_settings_are_refused_in_one_line(variant, key, value, line):
    config = vocoder.get_config(variant)
    section, name = key.split(".")
    config[section][name] = value
    found = validate.mistakes(config, devices=8)
    assert len(found) == 1 and line in found[0], found
