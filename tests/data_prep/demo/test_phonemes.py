"""Phoneme events of the espeak-ng wrapper and their timing in the demo's rendered audio
(jaxspeech/tts/text/espeak.py, phonemes.py, data_prep/demo/synth.render)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_prep.demo import synth
from jaxspeech.tts.text import espeak, phonemes
from jaxspeech.tts.text.phonemes import SILENCE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def test_event_struct_layout_and_parse():
    # speak_lib.h on 64-bit: five ints and an unsigned int before user_data; id at 32.
    assert ctypes.sizeof(espeak.Event) == 40 and espeak.Event.id.offset == 32
    assert espeak.Event.sample.offset == 20 and espeak.Event.audio_position.offset == 16
    events = (espeak.Event * 6)()
    for i, (kind, name, sample) in enumerate(
        [(8, b"", 0), (7, b"h", 264), (1, b"", 300), (7, b"'oU", 4072), (7, b"12345678", 5000)]
    ):
        events[i].type, events[i].sample = kind, sample
        if name:
            events[i].id.string = name
    events[5].type = 0  # espeakEVENT_LIST_TERMINATED; "12345678" has no NUL terminator
    got = espeak.phoneme_events(ctypes.cast(events, ctypes.POINTER(espeak.Event)))
    assert got == [("h", 264), ("'oU", 4072), ("12345678", 5000)]
    assert espeak.phoneme_events(None) == []


def test_phoneme_events_timing_fields(monkeypatch):
    """`sample` is the event's output sample (the finer form of audio_position, in ms)."""
    raw = []
    parse = espeak.phoneme_events

    def spy(events):
        i = 0
        while events[i].type != 0:
            raw.append((events[i].type, events[i].audio_position, events[i].sample))
            i += 1
        return parse(events)

    monkeypatch.setattr(espeak, "phoneme_events", spy)
    tts = espeak.Espeak.get()
    tts.set_voice("en-us", "m3")
    tts.set_prosody(rate=175, pitch=50, pitch_range=50)
    wav, events = tts.synthesize_with_phonemes("Hello there, my friend.", seed=1)
    rate = tts.sample_rate
    phoneme_raw = [r for r in raw if r[0] == 7]
    assert len(phoneme_raw) == len(events) >= 10
    for (_, ms, sample), (_, start) in zip(phoneme_raw, events):
        assert ms == sample * 1000 // rate and start == sample / rate
    names = [n for n, _ in events]
    assert names[:4] == ["h", "@", "l", "'oU"] and names[-1].startswith("_")
    starts = [s for _, s in events]
    assert starts == sorted(starts) and 0 < starts[0] and starts[-1] <= len(wav) / rate


_SCRIPT = """
import hashlib, json, sys
from jaxspeech.tts.text import espeak
mode = sys.argv[1]
if mode == "off":  # the library as it was before phoneme events: initialized without them
    espeak._INITIALIZE_PHONEME_EVENTS = 0
tts = espeak.Espeak.get()
out = []
for i, (voice, variant, text) in enumerate(json.loads(sys.argv[2])):
    tts.set_voice(voice, variant)
    if mode == "all" or (mode == "first" and i == 0):
        wav, events = tts.synthesize_with_phonemes(text, seed=i)
        assert events
    else:
        wav = tts.synthesize(text, seed=i)
    out.append(hashlib.sha256(wav.tobytes()).hexdigest())
if mode == "off":  # the patch took: no events reported
    assert not tts.synthesize_with_phonemes("Hi.")[1]
print(json.dumps(out))
"""


def test_audio_identical_with_and_without_phoneme_events():
    """Each mode in a fresh process (espeak-ng carries state between utterances): phoneme
    events off at initialization (the old wrapper), on and ignored, collected for the
    first utterance only, collected for all. Every utterance is the same in all four."""
    utts = [
        ["en-us", "m3", "Hello there, my friend."],
        ["en-gb-x-rp", "f2", "The quick brown fox jumps over the lazy dog."],
        ["en-us", "klatt", "How are you today?"],
    ]
    digests = {}
    for mode in ("off", "none", "first", "all"):
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT, mode, json.dumps(utts)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        digests[mode] = json.loads(done.stdout)
    assert len(set(digests["off"])) == 3
    assert digests["none"] == digests["first"] == digests["all"] == digests["off"]


def test_align_maps_trim_and_edge_silences():
    events = [("_", 0.0), ("h", 0.012), ("@", 0.06), ("l", 0.12), ("'oU", 0.2), ("_:", 0.6)]
    events += [("_", 0.7)]
    # Speech kept from 0.05 s to 0.65 s of espeak-ng's output; lead 0.1 s, trail 0.2 s.
    a = phonemes.align(events, speech_start_s=0.05, speech_s=0.6, lead_s=0.1, duration_s=0.9)
    # "_" and "h" began before the kept speech: clipped to its start (h lasts until @).
    assert a.phonemes == (SILENCE, "h", "@", "l", "'oU", SILENCE)
    np.testing.assert_allclose(a.ends, [0.1, 0.11, 0.17, 0.25, 0.65, 0.9], atol=1e-12)
    assert a.ends[-1] == 0.9


def test_align_merges_pauses_and_drops_empty_ones():
    events = [("a", 0.1), ("_:", 0.2), ("_", 0.3), ("b", 0.3), ("_", 0.4), ("c", 0.4)]
    events += [("x y", 0.5), ("", 0.55), ("_", 0.6)]
    a = phonemes.align(events, speech_start_s=0.0, speech_s=0.7, lead_s=0.05, duration_s=0.8)
    # "_:" and "_" merge; the zero-length "_" at 0.4 goes; whitespace has a stand-in; the
    # empty mnemonic is no phoneme; the closing "_" merges with the trail.
    assert a.phonemes == (SILENCE, "a", SILENCE, "b", "c", "x\u2423y", SILENCE)
    np.testing.assert_allclose(a.ends, [0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.8])
    fields = phonemes.manifest_fields(a)
    assert fields["phonemes"] == "_ a _ b c x\u2423y _" and fields["phoneme_ends"][-1] == 0.8


def test_manifest_fields_round_but_keep_the_exact_duration():
    a = phonemes.Alignment((SILENCE, "a", SILENCE), (0.123456, 0.5000004, 1.23456789))
    assert phonemes.manifest_fields(a) == {
        "phonemes": "_ a _",
        "phoneme_ends": [0.1235, 0.5, 1.23456789],
    }


@pytest.fixture(scope="module")
def rendered():
    """Three planned utterances rendered in this process: (utterance, samples, alignment)."""
    tts = espeak.Espeak.get()
    plan = synth.plan_corpus(0.001, 0)
    return [(u, *synth.render(u, tts)) for u in (plan[0], plan[3], plan[-1])]


def test_rendered_phonemes_cover_the_audio(rendered):
    for utt, samples, a in rendered:
        duration = len(samples) / synth.SAMPLE_RATE
        ends = np.asarray(a.ends)
        assert len(a.phonemes) == len(ends) >= 5
        assert a.phonemes[0] == a.phonemes[-1] == SILENCE
        assert not any(" " in p or not p for p in a.phonemes)
        assert np.all(np.diff(ends) >= 0) and ends[-1] == duration
        # The lead silence starts the utterance at 0 and lasts at least the planned lead;
        # the trail silence starts at most the planned trail before the end.
        assert ends[0] >= round(utt.lead_s * 16000) / 16000
        assert ends[-2] <= duration - round(utt.trail_s * 16000) / 16000 + 1e-9
        fields = phonemes.manifest_fields(a)
        assert len(fields["phonemes"].split(" ")) == len(fields["phoneme_ends"])


def _segment_rms(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """RMS of x between consecutive sample bounds (0 for an empty segment)."""
    return np.array(
        [np.sqrt(np.mean(x[a:b] ** 2)) if b > a else 0.0 for a, b in zip(bounds, bounds[1:])]
    )


def test_rendered_silences_are_quiet(rendered):
    """A rough alignment check: the edge silences hold only the noise floor, far below
    the speech between them, and every vowel lasting 20 ms or more is far above it."""
    for _, samples, a in rendered:
        x = samples.astype(np.float64) / 32768.0
        bounds = np.round(np.concatenate([[0.0], a.ends]) * synth.SAMPLE_RATE).astype(int)
        rms = _segment_rms(x, bounds)
        speech = float(np.sqrt(np.mean(x[bounds[1] : bounds[-2]] ** 2)))
        assert rms[0] < 0.05 * speech and rms[-1] < 0.05 * speech
        vowels = [
            rms[i]
            for i, p in enumerate(a.phonemes)
            if p.lstrip("',")[:1] in set("aeiouAEIOUV@03") and bounds[i + 1] - bounds[i] >= 320
        ]
        assert vowels and min(vowels) > 10 * rms[0]
