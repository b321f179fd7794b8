"""DNSMOS (jaxspeech.metrics.mos) against the speechmos package's own reference function,
on silence, white noise and a sentence of the demo's synthesizer (espeak-ng)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from jaxspeech.metrics import mos

SR = mos.SAMPLE_RATE


@pytest.fixture(scope="module")
def scorer() -> mos.Dnsmos:
    return mos.Dnsmos()


@pytest.fixture(scope="module")
def speech() -> tuple[np.ndarray, int]:
    """A 2.6 s sentence of espeak-ng (the demo corpus's voice) at its own 22,050 Hz: float
    in [-1, 1] as a WAV reader returns it."""
    from jaxspeech.tts.text import espeak

    tts = espeak.Espeak.get()
    tts.set_voice("en-us")
    said = tts.synthesize("the quick brown fox jumps over the lazy dog")
    return said.astype(np.float32) / 32768.0, tts.sample_rate


@pytest.fixture(scope="module")
def scores(scorer, speech) -> dict[str, mos.MosScores]:
    """Silence, white noise (both 9.5 s: one window each) and the sentence, scored once."""
    rng = np.random.default_rng(0)
    silence = np.zeros(int(9.5 * SR), np.float32)
    noise = (0.1 * rng.standard_normal(int(9.5 * SR))).astype(np.float32)
    return {
        "silence": scorer.score(silence, SR),
        "noise": scorer.score(noise, SR),
        "speech": scorer.score(*speech),
    }


def test_silence_noise_and_speech_score_in_order(scores):
    """Speech is rated above silence, and silence above white noise, in overall quality
    (P.835 OVRL) and speech quality (SIG); noise has the worst background (BAK); P.808
    ranks speech first. Measured: OVRL 2.74 / 1.84 / 1.10 (speech / silence / noise)."""
    speech, silence, noise = scores["speech"], scores["silence"], scores["noise"]
    for k in ("ovrl", "sig"):
        assert getattr(speech, k) > getattr(silence, k) + 0.4 > getattr(noise, k) + 0.8, k
    assert min(speech.bak, silence.bak) > noise.bak + 1.5
    assert speech.p808 > max(silence.p808, noise.p808) + 1.0
    for s in scores.values():
        assert all(1.0 <= getattr(s, k) <= 5.0 for k in mos.MEASURES)
        assert s.clipped == 0


def _reference(sample, sample_rate: int = SR) -> dict[str, float]:
    from speechmos import dnsmos

    out = dnsmos.run(sample, sample_rate)
    return {k: float(out[f"{k}_mos"]) for k in mos.MEASURES if k != "ovrl"} | {
        "ovrl": float(out["ovrl_mos"])
    }


def _close(ours: mos.MosScores, ref: dict[str, float]) -> None:
    # P.808's reference mean is over float32 values, ours over float64: 1e-6 apart.
    assert {k: getattr(ours, k) for k in mos.MEASURES} == pytest.approx(ref, abs=1e-5)


def test_equals_reference_on_a_short_clip_at_22_khz(scores, speech, tmp_path):
    """The 2.6 s sentence at 22,050 Hz: resampled to 16 kHz as the reference's file path
    resamples (librosa.load), doubled twice to 10.5 s (one window) as the reference does."""
    audio, rate = speech
    path = tmp_path / "speech.wav"
    sf.write(path, np.round(audio * 32768.0).astype(np.int16), rate)  # exactly `audio` again
    _close(scores["speech"], _reference(str(path)))


def test_equals_reference_on_a_long_clip(scorer, speech):
    """17.5 s of speech over noise at 16 kHz: windows 0-6, the reference's float slicing
    dropping the 8th (`window_starts`)."""
    import soxr

    audio, rate = speech
    voice = soxr.resample(audio, rate, SR, "HQ")
    rng = np.random.default_rng(1)
    clip = np.resize(voice, int(17.5 * SR)) + 0.01 * rng.standard_normal(int(17.5 * SR))
    clip = clip.astype(np.float32)
    ours = scorer.score(clip, SR)
    assert ours.windows == 7
    _close(ours, _reference(clip))


def test_window_starts():
    assert mos.window_starts(mos.WINDOW) == [0]
    assert mos.window_starts(10 * SR - 1) == [0]
    assert mos.window_starts(11 * SR) == [0, SR]
    # 17.5 s: 8 hops, the 8th (start 7 s) dropped as the reference drops it.
    assert mos.window_starts(int(17.5 * SR)) == [i * SR for i in range(7)]
    assert len(mos.window_starts(40 * SR)) == 31 - 17  # windows 7-23 all dropped
    assert len(mos.repeat_to_window(np.ones(4 * SR, np.float32))) == 16 * SR


def test_out_of_range_audio_is_clipped_and_counted():
    x = np.array([0.5, 1.5, -2.0, -1.0, 1.0], np.float32)
    wave, clipped = mos.prepare(x, SR)
    assert clipped == 2
    np.testing.assert_array_equal(wave, [0.5, 1.0, -1.0, -1.0, 1.0])
    assert mos.prepare(np.zeros(441, np.float64), 44100)[0].shape == (160,)


@pytest.mark.parametrize(
    "audio, rate, message",
    [
        (np.zeros(0, np.float32), SR, "audio is empty"),
        (np.zeros((2, SR), np.float32), SR, r"must be 1-D .* shape \(2, 16000\)"),
        (np.array([0.0, np.nan, np.inf], np.float32), SR, "2 non-finite samples"),
        (np.zeros(SR, np.int16), SR, "float waveform in \\[-1, 1\\], got int16"),
        (np.zeros(SR, np.float32), 0, "sample_rate must be positive, got 0"),
        (np.zeros(SR, np.float32), 16000.0, "sample_rate must be an integer"),
    ],
)
def test_bad_input_is_one_line(scorer, audio, rate, message):
    with pytest.raises(ValueError, match=message) as e:
        scorer.score(audio, rate)
    assert "\n" not in str(e.value) and str(e.value).startswith("DNSMOS: ")
    if rate == SR and isinstance(rate, int):  # a batch names the clip at fault
        with pytest.raises(ValueError, match=f"^clip 1: DNSMOS: .*{message}"):
            scorer.score_batch([np.zeros(SR, np.float32), audio], rate)


def test_mean_scores():
    a = mos.MosScores(sig=3.0, bak=4.0, ovrl=2.0, p808=3.5, windows=1, clipped=0)
    b = mos.MosScores(sig=2.0, bak=3.0, ovrl=1.0, p808=2.5, windows=4, clipped=3)
    assert mos.mean_scores([a, b]) == {"sig": 2.5, "bak": 3.5, "ovrl": 1.5, "p808": 3.0}
    assert mos.mean_scores([]) == dict.fromkeys(mos.MEASURES)
    assert a.as_dict()["windows"] == 1


def test_the_tts_scores_of_a_clip_dnsmos_cannot_take(scorer):
    """The TTS evaluation's rows (jaxspeech.tts.scores): an empty synthesis is unscored
    with the reason, and the split's means count only the scored rows."""
    from jaxspeech.tts import scores as tts_scores

    row = tts_scores.dnsmos_scores(scorer, np.zeros(0, np.float32), SR)
    assert row == dict.fromkeys(tts_scores.DNSMOS) | {
        "unscored": {"dnsmos": "DNSMOS: audio is empty"}
    }
    rows = [row, dict(zip(tts_scores.DNSMOS, (3.0, 4.0, 2.5, 3.5)))]
    assert tts_scores.summarize(rows, tts_scores.DNSMOS) == {
        "dnsmos_sig": 3.0,
        "dnsmos_bak": 4.0,
        "dnsmos_ovrl": 2.5,
        "dnsmos_p808": 3.5,
        "dnsmos_utterances": 1,
    }
