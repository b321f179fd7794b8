"""Long-form decoding: windows over a stream of blocks, words with times, and the merge of
overlapping windows, against an oracle "model" that reads its labels off the audio."""

import io
import itertools

import numpy as np
import pytest
import soundfile as sf
import soxr

from jaxspeech.decoding.ctc import collapse_with_frames
from jaxspeech.decoding.lm import TokenWords
from jaxspeech.serving import longform
from jaxspeech.serving.progress import FileProgress

PIECES = ["<blank>", "<unk>", "a", "b", "c", "d", " "]
WORDS = TokenWords.from_pieces(PIECES, sentencepiece=False)
SPACE = PIECES.index(" ")
RATE, F = 100, 4  # samples per second and per frame: 40 ms frames


def _blocks(audio: np.ndarray, rng) -> list[np.ndarray]:
    cuts = np.sort(rng.choice(np.arange(1, len(audio)), size=min(7, len(audio) - 1), replace=False))
    return np.split(audio, cuts)


@pytest.mark.parametrize("n,window,hop", [(0, 10, 4), (5, 10, 4), (10, 10, 4), (37, 10, 4),
                                          (40, 10, 10), (41, 10, 3), (100, 16, 15)])  # fmt: skip
def test_windows_cover_the_audio_once_each(n, window, hop):
    audio = np.arange(n, dtype=np.float32) + 1.0
    seg = longform.Segmenter(window, hop, rate=100)  # no pauses: windows only
    got = list(longform.pieces(_blocks(audio, np.random.default_rng(n)) if n else [], seg))
    if n == 0:
        assert got == []
        return
    starts = [p.start for p in got]
    assert starts == list(range(0, hop * len(got), hop))
    assert [p.keep_until is None for p in got] == [False] * (len(got) - 1) + [True]
    for p in got:
        np.testing.assert_array_equal(p.samples, audio[p.start : p.start + window])
    for p in got[:-1]:  # the middle of the overlap with the next window
        assert p.keep_until == pytest.approx((p.start + hop + (window - hop) / 2) / 100)
    assert starts[-1] + window >= n  # the last window reaches the end ...
    assert len(got) == 1 or starts[-2] + window < n  # ... and is needed


def test_pieces_are_cut_in_the_middle_of_pauses():
    rng = np.random.default_rng(0)
    rate = 1000  # 10 samples per energy frame
    speech = [rng.uniform(0.2, 0.9, n) * rng.choice([-1, 1], n) for n in (700, 300, 2500, 400)]
    gaps = [500, 150, 800]  # samples of silence: 0.5 s, 0.15 s (too short), 0.8 s
    parts = [speech[0], np.zeros(gaps[0]), speech[1], np.zeros(gaps[1]), speech[2]]
    audio = np.concatenate(parts + [np.zeros(gaps[2]), speech[3]]).astype(np.float32)
    seg = longform.Segmenter(window=1500, hop=1200, rate=rate, min_pause=250)
    got = list(longform.pieces(_blocks(audio, rng), seg))
    cuts = [p.start for p in got[1:]]
    # The first pause's middle; the 0.15 s gap is no pause; 2.5 s of speech are windows
    # of 1.5 s every 1.2 s; then the middle of the part of the 0.8 s pause that the last
    # of those windows (3350-4850) holds.
    long_end = 700 + 500 + 300 + 150 + 2500
    assert cuts == [950, 2150, 3350, (long_end + 4850) // 2]
    assert got[-1].keep_until is None
    # A piece cut at a pause owns the transcript up to the cut; windows up to the middle
    # of their overlap.
    assert [p.keep_until for p in got[:-1]] == [0.95, 2.3, 3.5, 4.5]
    for p in got:
        np.testing.assert_array_equal(p.samples, audio[p.start : p.start + len(p.samples)])


def test_pieces_are_read_lazily():
    # An endless stream: pieces come one by one, memory stays at a window and a block.
    endless = (np.full(7, i + 1, np.float32) for i in itertools.count())
    seg = longform.Segmenter(20, 15, rate=100, min_pause=25)
    first = list(itertools.islice(longform.pieces(endless, seg), 5))
    assert [p.start for p in first] == [0, 15, 30, 45, 60]
    np.testing.assert_array_equal(first[4].samples, np.repeat(np.arange(9, 13), 7)[4:24])


def test_reading_resamples_and_downmixes_as_one_stream(tmp_path):
    rate_in, rate = 44_100, 16_000
    t = np.arange(int(2.5 * rate_in)) / rate_in
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), 0.5 * np.sin(2 * np.pi * 900 * t)], 1)
    sf.write(tmp_path / "a.wav", stereo, rate_in, subtype="FLOAT")
    blocks = list(longform.read_audio_blocks(str(tmp_path / "a.wav"), rate, block_s=0.3))
    assert len(blocks) > 5
    want = soxr.resample(stereo.mean(1).astype(np.float32), rate_in, rate)
    got = np.concatenate(blocks)
    assert abs(len(got) - len(want)) <= 1
    n = min(len(got), len(want))
    np.testing.assert_allclose(got[:n], want[:n], atol=1e-4)
    # At the model's rate, the samples are the file's.
    sf.write(tmp_path / "b.wav", stereo[:, 0], rate, subtype="FLOAT")
    same = np.concatenate(list(longform.read_audio_blocks(str(tmp_path / "b.wav"), rate, 0.2)))
    np.testing.assert_array_equal(same, stereo[:, 0].astype(np.float32))


def test_words_from_labels_char_and_sentencepiece():
    labels = [SPACE, 2, 3, SPACE, 4, 1, SPACE]
    got = longform.words_from_labels(labels, [0, 2, 3, 5, 7, 9, 12], WORDS, 0.04, 10.0)
    assert [(w.text, round(w.start, 3), round(w.end, 3)) for w in got] == [
        ("ab", 10.08, 10.16),
        ("c<unk>", 10.28, 10.4),
    ]
    spm = TokenWords.from_pieces(
        ["<blank>", "<unk>", "\u2581ab", "c", "\u2581d"], sentencepiece=True
    )
    got = longform.words_from_labels([2, 3, 4], [1, 2, 6], spm, 1.0, 0.0)
    assert [(w.text, w.start, w.end) for w in got] == [("abc", 1.0, 3.0), ("d", 6.0, 7.0)]


def _speech(rng, seconds: float, pauses: bool = False):
    """Frames of labels (the oracle's "audio") and the words they spell with their times:
    words of 1-4 letters held 1-2 frames each (at most 8 frames, 0.32 s), a space between
    words, and 0-5 blank frames around it; with `pauses`, now and then 10-40 blank frames
    (silence: the oracle's blank is 0). A word starts at its first letter's frame and
    ends one frame after the frame where its last letter starts (what a decoder knows)."""
    frames, words = [], []
    while len(frames) * F < seconds * RATE:
        if pauses and rng.random() < 0.15:
            frames += [0] * int(rng.integers(10, 40))  # a pause of 0.4-1.6 s
        frames += [0] * int(rng.integers(0, 6)) + [SPACE] + [0] * int(rng.integers(0, 3))
        text, start = "", len(frames)
        for _ in range(int(rng.integers(1, 5))):
            letter = int(rng.integers(2, 6))
            if frames and frames[-1] == letter:
                frames.append(0)  # CTC needs a blank between two equal labels
                start = start if text else len(frames)
            last = len(frames)
            frames += [letter] * int(rng.integers(1, 3))
            text += PIECES[letter]
        words.append((text, start * F / RATE, (last + 1) * F / RATE))
    return np.repeat(np.array(frames, np.float32), F), words


def oracle(audio: np.ndarray, lens: np.ndarray) -> list:
    """A greedy CTC "model" whose per-frame label is the audio's value at the frame."""
    ids = np.rint(audio[:, ::F]).astype(np.int32)
    return collapse_with_frames(ids, lens // F)


@pytest.mark.parametrize("window_s,overlap_s,batch", [(4.0, 1.0, 1), (4.0, 1.0, 3), (6.0, 2.0, 2)])
def test_overlapping_windows_merge_into_the_whole_transcript(window_s, overlap_s, batch):
    rng = np.random.default_rng(int(window_s * 10 + batch))
    for seconds in (3.0, 31.0, 95.3):
        audio, want = _speech(rng, seconds)
        got = longform.transcribe(
            _blocks(audio, rng), oracle, WORDS, rate=RATE, frame_samples=F,
            window_s=window_s, overlap_s=overlap_s, min_pause_s=0, batch=batch,
        ).words  # fmt: skip
        assert [w.text for w in got] == [w for w, _, _ in want]
        np.testing.assert_allclose([(w.start, w.end) for w in got], [w[1:] for w in want],
                                   atol=1e-9)  # fmt: skip


@pytest.mark.parametrize("min_pause_s", [0.3, 0.6])
def test_pieces_cut_at_pauses_merge_into_the_whole_transcript(min_pause_s):
    rng = np.random.default_rng(7)
    audio, want = _speech(rng, 120.0, pauses=True)
    got = longform.transcribe(
        _blocks(audio, rng), oracle, WORDS, rate=RATE, frame_samples=F,
        window_s=4.0, overlap_s=1.0, min_pause_s=min_pause_s, batch=3,
    ).words  # fmt: skip
    assert [w.text for w in got] == [w for w, _, _ in want]
    # Pieces start mid-pause, off the oracle's frame grid: times move by less than a frame.
    np.testing.assert_allclose([(w.start, w.end) for w in got], [w[1:] for w in want],
                               atol=F / RATE)  # fmt: skip


def test_windows_off_the_frame_grid_keep_every_word():
    # A hop that is not a whole number of frames: times move by less than a frame.
    rng = np.random.default_rng(3)
    audio, want = _speech(rng, 40.0)
    got = longform.transcribe([audio], oracle, WORDS, rate=RATE, frame_samples=F,
                              window_s=4.02, overlap_s=1.0, min_pause_s=0, batch=2)  # fmt: skip
    got = got.words
    assert [w.text for w in got] == [w for w, _, _ in want]
    np.testing.assert_allclose([w.start for w in got], [w[1] for w in want], atol=F / RATE)


def test_bad_overlap():
    with pytest.raises(ValueError, match="overlap_s"):
        longform.transcribe([np.zeros(10)], oracle, WORDS, rate=RATE, frame_samples=F,
                            window_s=2.0, overlap_s=2.0)  # fmt: skip


# The speech gate: silence and faint noise are not decoded, words in silence are dropped.

SR = 16_000  # the model's rate: 160-sample energy frames


def _tone(seconds: float, dbfs: float, rate: int = SR) -> np.ndarray:
    """A 440 Hz sine whose RMS is `dbfs` (a sine's RMS is its peak over sqrt 2)."""
    t = np.arange(int(seconds * rate)) / rate
    return (np.sqrt(2) * 10 ** (dbfs / 20) * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def _noise(seconds: float, dbfs: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * SR)) * 10 ** (dbfs / 20)).astype(np.float32)


def test_frame_levels_are_the_rms_of_10ms_frames_in_dbfs():
    audio = np.concatenate([np.zeros(1000), _noise(1.0, -60), _tone(0.5, -20), _noise(0.3, -40)])
    audio = np.concatenate([audio, np.full(77, 0.5)]).astype(np.float32)  # a partial frame
    frames = audio[: len(audio) // 160 * 160].astype(np.float64).reshape(-1, 160)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = rms > 0  # digital silence: -120 dBFS instead of -inf
    want = 20 * np.log10(np.where(loud, rms, 1.0))
    got = longform.frame_db(audio, SR)
    assert got.shape == want.shape == (len(audio) // 160,)
    np.testing.assert_allclose(got[loud], want[loud], atol=1e-3)
    assert np.all(got[:6] == -120.0)
    assert np.median(got[7:100]) == pytest.approx(-60, abs=0.5)  # white noise at -60 dBFS
    gate = longform.SpeechGate()  # -50 dBFS
    speech = gate.speech(audio, SR)  # with the last partial frame, zero-padded
    assert len(speech) == len(got) + 1 and speech[-1]
    np.testing.assert_array_equal(speech[:-1], got >= -50.0)
    assert longform.SpeechGate(floor_db=-np.inf).speech(np.zeros(480, np.float32), SR).all()


@pytest.mark.parametrize(
    "audio,silent",
    [
        (np.zeros(30 * SR, np.float32), True),
        (_noise(30.0, -60), True),  # the demo corpus's loudest noise floor
        (_noise(30.0, -40), False),  # noise over the gate: decoded
        (np.concatenate([np.zeros(SR), _tone(0.05, -20), np.zeros(SR)]), True),  # a click
        (np.concatenate([np.zeros(10 * SR), _tone(0.15, -30), np.zeros(10 * SR)]), False),
    ],
)
def test_the_gate_finds_pieces_without_speech(audio, silent):
    assert longform.SpeechGate().is_silent(audio, SR) == silent


def test_words_in_silence_are_dropped_and_the_others_end_at_their_speech():
    # 1 s silence, 1 s speech (1.0-2.0 s), 2 s silence, 5 s speech (4.0-9.0 s).
    audio = np.concatenate([np.zeros(SR), _tone(1.0, -25), np.zeros(2 * SR), _tone(5.0, -25)])
    W = longform.Word
    found = [
        W("lead", 0.2, 0.6),  # silence only
        W("early", 0.7, 1.5),  # starts in silence: moved in to 0.9 (the gate's 0.1 s pad)
        W("late", 1.5, 2.4),  # runs into silence: ends at 2.1; 0.6 of its 0.9 s are speech
        W("tail", 1.6, 3.2),  # mostly silence: 0.5 of its 1.6 s
        W("long", 4.1, 8.5),  # 4.4 s: longer than max_word_s
        W("ok", 5.0, 5.3),
    ]
    gate = longform.SpeechGate(max_word_s=3.0)
    kept, dropped = gate.check_words(found, audio, SR, offset_s=100.0)  # times in the file
    assert kept == [] and [d.reason for d in dropped] == ["silence"] * 6  # not in `audio`
    shifted = [W(w.text, w.start + 100.0, w.end + 100.0) for w in found]
    kept, dropped = gate.check_words(shifted, audio, SR, offset_s=100.0)
    assert [(w.text, round(w.start - 100, 3), round(w.end - 100, 3)) for w in kept] == [
        ("early", 0.9, 1.5),
        ("late", 1.5, 2.1),
        ("ok", 5.0, 5.3),
    ]
    assert [(d.word.text, d.reason) for d in dropped] == [
        ("lead", "silence"),
        ("tail", "silence"),
        ("long", "too long"),
    ]
    assert dropped[0].word == shifted[0]  # reported with the decoder's times


def test_silent_pieces_are_not_decoded_and_are_counted():
    # Speech, 30 s of digital silence, 20 s of noise under the gate, speech: the oracle's
    # labels are its audio, scaled up 10x so the faint noise rounds to blank.
    rng = np.random.default_rng(5)
    first, want1 = _speech(rng, 6.0)
    second, want2 = _speech(rng, 5.0)
    quiet = np.concatenate([np.zeros(30 * RATE), 1e-3 * rng.standard_normal(20 * RATE)])
    audio = np.concatenate([first, quiet, second]).astype(np.float32)
    decoded_rows, seen = [], []

    def decode(batch, lens):
        decoded_rows.extend(batch[i, : lens[i]] for i in range(len(lens)))
        return oracle(batch, lens)

    got = longform.transcribe(
        _blocks(audio, rng), decode, WORDS, rate=RATE, frame_samples=F,
        window_s=4.0, overlap_s=1.0, min_pause_s=0, batch=2, progress=seen.append,
    )  # fmt: skip
    shift = len(first) / RATE + 50.0
    want = want1 + [(w, s + shift, e + shift) for w, s, e in want2]
    assert [w.text for w in got.words] == [w for w, _, _ in want] and got.dropped == []
    # The windows wholly in the quiet 50 s are skipped: those start every 3 s, share 3 s.
    assert 40.0 <= got.skipped_s <= 50.0 and got.skipped_s % 3.0 == pytest.approx(0, abs=1e-9)
    assert len(decoded_rows) < len(audio) / RATE / 3 - 10
    # Progress: seconds done grow to the whole audio, skipped pieces included.
    assert seen == sorted(seen) and seen[-1] == pytest.approx(len(audio) / RATE)
    ungated = longform.transcribe([audio], decode, WORDS, rate=RATE, frame_samples=F,
                                  window_s=4.0, overlap_s=1.0, min_pause_s=0,
                                  gate=None)  # fmt: skip
    assert ungated.words == got.words and ungated.skipped_s == 0.0


class _Clock:
    """A clock the test moves."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_in_a_log_is_a_line_per_tenth_or_every_10s():
    clock, out = _Clock(), _Stream(tty=False)
    bar = FileProgress("a.wav", 7200.0, out, tty=False, clock=clock)
    assert out.getvalue() == "a.wav [....................] 0.0/7200.0 s   0% -\n"  # at once
    for done in range(60, 7201, 60):  # a minute of audio every 2 s: 30x real time
        clock.now += 2.0
        bar.update(float(done))
    bar.close()
    lines = out.getvalue().splitlines()
    # 240 s of wall time: a line at least every 10 s, and at each of the 10 tenths.
    assert 24 <= len(lines) <= 24 + 10 + 1 and "\r" not in out.getvalue()
    assert lines[-1] == "a.wav [####################] 7200.0/7200.0 s 100% 30.0x real time"
    assert "a.wav [##########..........] 3600.0/7200.0 s  50% 30.0x real time" in lines


def test_progress_on_a_terminal_is_redrawn_in_place():
    clock, out = _Clock(), _Stream(tty=True)
    bar = FileProgress("b.flac", 90.0, out, tty=True, clock=clock)
    for done in (1.0, 2.0, 45.0):
        clock.now += 1.0
        bar.update(done)
    bar.update(46.0)  # at once after the last: not drawn (at most 5 times a second)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n") and text.count("\n") == 1
    assert (
        text.split("\r")[-1] == "b.flac [##########..........] 46.0/90.0 s  51% 15.3x real time\n"
    )


def test_a_gate_at_minus_inf_lets_everything_through():
    off = longform.SpeechGate(floor_db=-np.inf)
    assert not off.is_silent(np.zeros(SR // 20, np.float32), SR)  # shorter than 0.1 s
    assert longform.SpeechGate().is_silent(np.zeros(SR // 20, np.float32), SR)
    assert not longform.SpeechGate().is_silent(_tone(0.05, -20), SR)  # all of it speech
    word = longform.Word("x", 0.5, 2.0)
    assert off.check_words([word], np.zeros(3 * SR, np.float32), SR, 0.0) == ([word], [])


def _espeak_speech() -> np.ndarray:
    """A sentence of the demo's synthesizer (espeak-ng), at SR, at -20 dBFS RMS."""
    from jaxspeech.tts.text import espeak

    tts = espeak.Espeak.get()
    tts.set_voice("en-us")
    said = tts.synthesize("the quick brown fox jumps over the lazy dog near the river bank")
    audio = soxr.resample(said.astype(np.float32) / 32768.0, tts.sample_rate, SR)
    return (audio * 0.1 / np.sqrt(np.mean(audio**2))).astype(np.float32)


def test_steady_noise_of_any_colour_is_noise_and_speech_in_noise_is_not():
    """The gate's steady-noise criterion (`SpeechGate.is_noise`): white to violet noise at
    any level is noise; speech, clean or in white or brown noise down to 5 dB SNR (the
    demo's noisy split: 15-25 dB), is not; pieces under 0.5 s are not judged."""
    from jaxspeech.audio import augment

    gate, rng = longform.SpeechGate(), np.random.default_rng(3)
    for exponent in (-2.0, -1.0, 0.0, 1.0, 2.0):  # violet, blue, white, pink, brown
        for seconds, dbfs in ((0.6, -40.0), (20.0, -6.0)):
            noise = augment.colored_noise(rng, int(seconds * SR), exponent)
            noise = noise * 10 ** (dbfs / 20) / np.sqrt(np.mean(noise**2))
            assert gate.is_noise(noise.astype(np.float32), SR), (exponent, seconds, dbfs)
    speech = _espeak_speech()
    assert longform.band_spread_db(speech, SR) > 30.0
    assert not gate.is_noise(speech, SR)
    for exponent in (0.0, 2.0):
        for snr in (15.0, 5.0):
            noise = augment.colored_noise(rng, len(speech), exponent)
            noisy = augment.mix_at_snr(speech, noise, snr).astype(np.float32)
            assert longform.band_spread_db(noisy, SR) > 2 * gate.noise_spread_db - 5, snr
            assert not gate.is_noise(noisy, SR)
    assert not gate.is_noise(_noise(0.4, -20), SR)  # too short to judge
    assert not longform.SpeechGate(noise_spread_db=0).is_noise(_noise(5.0, -20), SR)  # off


def test_steady_noise_is_not_decoded_and_is_counted():
    """Minutes of white noise once became hundreds of made-up words: now no piece of it
    reaches the decoder, and its seconds are counted as noise, not silence."""
    noise = _noise(60.0, -20)
    calls = []

    def decode(batch, lens):
        calls.append(len(lens))
        return [([], []) for _ in lens]

    got = longform.transcribe([noise], decode, WORDS, rate=SR, frame_samples=640, batch=2)
    assert calls == [] and got.words == [] and got.skipped_s == 0.0
    assert got.noise_s == pytest.approx(60.0)


def test_audio_with_nan_or_inf_samples_is_refused_naming_the_file(tmp_path):
    """A float WAV with a NaN (or inf) sample once transcribed to empty text, exit 0: now
    reading it fails at the block that holds it, naming the file and the time."""
    for bad in (np.nan, np.inf):
        audio = np.zeros(3 * SR, np.float32)
        audio[2 * SR + 160] = bad  # in the third 1 s block
        path = tmp_path / f"{bad}.wav"
        sf.write(path, audio, SR, subtype="FLOAT")
        with pytest.raises(longform.NonFiniteAudio, match=rf"{path}: NaN or infinite .* 2\.010 s"):
            list(longform.read_audio_blocks(str(path), SR, block_s=1.0))


def test_the_command_line_notes_upsampled_audio_and_steady_noise():
    from jaxspeech.transcribe import gate_note, rate_note

    result = {"path": "call.wav", "file_rate": 8000, "words": [], "dropped_words": []}
    note = rate_note(result, 16000)
    assert note.startswith("8000 Hz audio upsampled to the model's 16000 Hz")
    assert "no sound above 4000 Hz" in note
    assert rate_note(dict(result, file_rate=16000), 16000) == ""
    assert rate_note(dict(result, file_rate=44100), 16000) == ""  # downsampled: all there
    noise = dict(result, skipped_silence_s=0.0, skipped_noise_s=600.0)
    assert gate_note(noise).startswith("no speech detected: 600.0 s of steady noise")
    some = dict(noise, words=[{"word": "a"}], skipped_noise_s=2.0)
    assert gate_note(some) == "2.0 s of steady noise not decoded"


def test_transcribe_files_names_missing_and_non_finite_files(tmp_path, monkeypatch):
    """`transcribe_files` with a stand-in decoder (no model): a missing file is "not
    found" (libsndfile said "System error"), a NaN file an error with its time (it gave
    empty text), white noise no speech, and each result carries the file's own rate."""
    import types

    from ml_collections import ConfigDict

    from jaxspeech.data.tokenizer import Tokenizer
    from jaxspeech.serving import recognizer as transcribe_lib

    calls = []

    def decode(batch, lens):
        calls.append(len(lens))
        return [([], []) for _ in lens]

    monkeypatch.setattr(transcribe_lib, "window_decoder", lambda run, config, s: decode)
    monkeypatch.setattr(transcribe_lib, "batch_size", lambda requested, mesh: requested)
    model = types.SimpleNamespace(frame_samples=640)
    monkeypatch.setattr(transcribe_lib, "nnx", types.SimpleNamespace(merge=lambda *a: model))
    tokenizer = Tokenizer(kind="char", vocab=["<blank>", "<unk>", *"ab '"])
    spec = types.SimpleNamespace(mesh=None, graphdef=None)
    run = types.SimpleNamespace(spec=spec, params=None, model_vars=None, tokenizer=tokenizer)
    config = ConfigDict({"features": {"sample_rate": SR}})
    nan = np.zeros(2 * SR, np.float32)
    nan[SR // 2] = np.nan
    sf.write(tmp_path / "nan.wav", nan, SR, subtype="FLOAT")
    sf.write(tmp_path / "noise8k.wav", _noise(10.0, -20)[: 5 * 8000], 8000)
    names = ["missing.wav", "nan.wav", "noise8k.wav"]
    results = []
    failed = transcribe_lib.transcribe_files(
        [str(tmp_path / n) for n in names], run, config, window_s=4.0, overlap_s=1.0,
        batch=2, emit=results.append,
    )  # fmt: skip
    assert failed == 2 and calls == []
    assert results[0] == {"path": str(tmp_path / "missing.wav"), "error": "not found"}
    assert results[1]["error"].startswith("NaN or infinite samples (the first at 0.500 s)")
    noise = results[2]
    assert noise["text"] == "" and noise["file_rate"] == 8000
    assert noise["skipped_noise_s"] == pytest.approx(5.0, abs=0.01)
