"""Audio of any length: decoded in pieces (cut at pauses, or overlapping windows where
speech runs on), merged into one transcript with word times.

The audio is read from its file a block at a time, down-mixed and resampled as a stream
(soxr), and cut into pieces (`Segmenter`): in the middle of each pause of `min_pause_s`
or more, and where `window_s` seconds pass without one, into windows that start every
`window_s - overlap_s` seconds. A batch of pieces is decoded at a time (padded to one of
three widths), so neither host nor device memory grows with the audio's length. Every
label gets a time from the encoder frame it was emitted at (for CTC beam search, its
Viterbi alignment), and labels form words.

Merging: each piece keeps the words that start between the end of the previous piece's
share and the end of its own. A piece cut at a pause owns everything up to the cut. Two
overlapping windows share `overlap_s` seconds and are cut in the middle of the overlap: a
word that a window's edge cuts in two starts outside the part of that window that is
kept, as long as words are shorter than half the overlap (2 s overlap: words up to 1 s),
so every word is taken from a window that heard all of it.

Silence (`SpeechGate`): a piece with almost no 10 ms frame as loud as `floor_db` dBFS is
not decoded (its share of the audio is counted as skipped), and a decoded word is checked
against the frames it spans: one that spans mostly silence, or that is longer than
`max_word_s`, is dropped with its reason; the others end where the speech in their span
does, so no word reaches into a silence. Steady noise (`SpeechGate.is_noise`: a piece
whose speech-band level hardly changes, as no speech's does) is not decoded either, and
counted apart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from jaxspeech.decoding.lm import TokenWords

# (audio (B, S) float32, audio_len (B,) int32) -> per row (labels, frames)
WindowDecoder = Callable[[np.ndarray, np.ndarray], list[tuple[list[int], list[int]]]]


@dataclasses.dataclass(frozen=True)
class Word:
    text: str
    start: float  # seconds from the start of the audio
    end: float


class NonFiniteAudio(ValueError):
    """An audio file with NaN or infinite samples (float WAV, FLAC is integer): decoded,
    every feature would be NaN and the transcript empty or garbage."""


def read_audio_blocks(path: str, rate: int, block_s: float = 30.0) -> Iterator[np.ndarray]:
    """The mono float32 samples of an audio file at `rate` Hz, in blocks of about
    `block_s` seconds (any libsndfile format; more channels are averaged; another rate is
    resampled as one stream, so blocks join without edge effects).

    Raises:
      FileNotFoundError / soundfile.LibsndfileError: a missing or undecodable file.
      NonFiniteAudio: a block with a NaN or infinite sample (raised when that block is
        read, so a caller that decoded earlier blocks drops their words).
    """
    import soundfile as sf
    import soxr

    with sf.SoundFile(path) as f:
        file_rate = int(f.samplerate)
        stream = None if file_rate == rate else soxr.ResampleStream(file_rate, rate, 1, "float32")
        size = max(1, int(block_s * file_rate))
        done = 0
        while True:
            block = f.read(size, dtype="float32", always_2d=True)
            last = len(block) < size
            finite = np.isfinite(block).all(axis=1)
            if not finite.all():
                at = (done + int(np.argmin(finite))) / file_rate
                raise NonFiniteAudio(
                    f"{path}: NaN or infinite samples (the first at {at:.3f} s): not audio "
                    "a recognizer can decode"
                )
            done += len(block)
            mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
            out = stream.resample_chunk(mono, last=last) if stream else mono
            if len(out):
                yield np.ascontiguousarray(out, np.float32)
            if last:
                return


def frame_db(audio: np.ndarray, rate: int) -> np.ndarray:
    """audio (S,) -> (S // (rate // 100),) the RMS of each whole 10 ms frame in dBFS (power in
    float64, so quiet float32 audio keeps its level; digital silence: -120)."""
    frame = max(1, rate // 100)
    n = len(audio) // frame
    power = np.mean(np.square(audio[: n * frame].reshape(n, frame), dtype=np.float64), 1)
    return 10 * np.log10(power + 1e-12)


@dataclasses.dataclass(frozen=True)
class Piece:
    """A stretch of audio decoded on its own: its first sample, its samples, and where its
    share of the transcript ends (seconds; None: the rest of the audio). Its share starts
    where the previous piece's ended."""

    start: int
    samples: np.ndarray
    keep_until: float | None


@dataclasses.dataclass(frozen=True)
class Segmenter:
    """How audio is cut into pieces (lengths in samples).

    A pause is `min_pause` or more samples whose 10 ms frames are all quieter than the
    loudest part of the current window (its 95th-percentile frame) by `drop_db`, or
    quieter than `floor_db` dBFS. The audio is cut in the middle of every pause that
    follows speech (so that a piece holds one stretch of speech, as the model's training
    utterances did: a full-context model transcribes an utterance worse with its
    neighbours in view); speech longer than `window` without a pause is cut into
    windows every `hop` samples, overlapping by `window - hop`. `min_pause` 0: windows only.
    """

    window: int
    hop: int
    rate: int
    min_pause: int = 0
    drop_db: float = 35.0
    floor_db: float = -70.0

    def __post_init__(self):
        if not 0 < self.hop <= self.window:
            raise ValueError(f"need 0 < hop <= window, got hop {self.hop}, window {self.window}")

    def first_pause(self, audio: np.ndarray) -> int | None:
        """The sample in the middle of the first pause after speech in `audio`, or None."""
        frame = max(1, self.rate // 100)
        n = len(audio) // frame
        need = -(-self.min_pause // frame) if self.min_pause else 0
        if not need or n <= need:
            return None
        db = frame_db(audio, self.rate)
        silent = db < max(self.floor_db, np.percentile(db, 95) - self.drop_db)
        run = 0
        for i, quiet in enumerate(silent):
            run = run + 1 if quiet else 0
            first = i - run + 1
            # A pause ends at speech or where the audio ends; it must follow speech.
            if run >= need and first > 0 and (i + 1 == n or not silent[i + 1]):
                return (first + (i + 1 - first) // 2) * frame
        return None


def pieces(blocks: Iterable[np.ndarray], seg: Segmenter) -> Iterator[Piece]:
    """The pieces of the concatenated blocks (see `Segmenter`), in order. Keeps at most a
    window, a hop and a block in memory. No audio: no pieces."""
    window, hop = seg.window, seg.hop
    half = (window - hop) / 2 / seg.rate  # windows keep up to the middle of their overlap
    it = iter(blocks)
    buf, buf_start, start, done = np.zeros(0, np.float32), 0, 0, False
    while True:
        while not done and buf_start + len(buf) < start + window + hop:
            try:
                buf = np.concatenate([buf, next(it)])
            except StopIteration:
                done = True
        end = buf_start + len(buf)
        if start >= end:
            return
        span = buf[start - buf_start : start - buf_start + window]
        cut = seg.first_pause(span)
        if cut is not None:
            yield Piece(start, span[:cut].copy(), (start + cut) / seg.rate)
            nxt = start + cut
        elif done and end <= start + window:
            yield Piece(start, span.copy(), None)
            return
        else:
            yield Piece(start, span.copy(), (start + hop) / seg.rate + half)
            nxt = start + hop
        buf, buf_start, start = buf[nxt - buf_start :], nxt, nxt


def words_from_labels(
    labels: list[int], frames: list[int], words: TokenWords, frame_s: float, offset_s: float
) -> list[Word]:
    """Labels with their frames -> words: a word starts at its first label's frame and
    ends one frame after its last label's."""
    out: list[Word] = []
    text, first, last = "", None, None
    for label, frame in zip(labels, frames):
        if words.starts_word[label] and text:
            out.append(Word(text, offset_s + first * frame_s, offset_s + (last + 1) * frame_s))
            text, first = "", None
        piece = words.text[label]
        if piece:
            text += piece
            first = frame if first is None else first
            last = frame
    if text:
        out.append(Word(text, offset_s + first * frame_s, offset_s + (last + 1) * frame_s))
    return out


def keep_between(words: list[Word], lo: float, hi: float) -> list[Word]:
    """The words that start in [lo, hi): a window's share of the merged transcript."""
    return [w for w in words if lo <= w.start < hi]


@dataclasses.dataclass(frozen=True)
class DroppedWord:
    """A decoded word left out of the transcript, and why: "silence" (its span is mostly
    silence) or "too long" (longer than `SpeechGate.max_word_s`)."""

    word: Word
    reason: str


@dataclasses.dataclass(frozen=True)
class SpeechGate:
    """What counts as speech: serving-time settings (`transcribe --silence_db
    --max_word_s`).

    A 10 ms frame is speech when its RMS is `floor_db` dBFS or more. The demo corpus's
    utterances have an RMS of -29 to -17 dBFS and a noise floor of -80 to -60 dBFS: -50
    lies 21 dB under the quietest utterance and 10 dB over the loudest floor. A piece with
    less than `min_speech_s` of speech frames (and not all speech) is not decoded: on
    silence or faint noise a decoder makes words up, and a click is no speech. A decoded
    word is checked against the frames it spans, each counting as speech when it lies
    within `pad_s` of a speech frame (CTC emits a label a few frames after its sound, and
    speech has short quiet stops): a word with at most half of them speech is dropped
    ("silence"), the others start and end at their first and last speech frame; one that
    is then longer than `max_word_s` is dropped ("too long": no word lasts seconds).
    `floor_db` -inf: every frame is speech, only `max_word_s` applies.

    Steady noise: speech turns on and off with its syllables and pauses, so the level of
    its 250-4000 Hz band in 20 ms frames varies by tens of dB; stationary noise's varies by
    a few (`band_spread_db`). A piece of at least `min_noise_s` whose spread is under
    `noise_spread_db` is noise and not decoded (a decoder makes words up in it: ten minutes
    of white noise gave 546). Measured on 53 utterances of the demo synthesizer
    (`data_prep.demo.synth --hours 0.02 --seed 1`, padded with 0.15 s of silence or not):
    stationary white, pink, brown, blue and violet noise (0.5-20 s, -40 to -6 dBFS) spread
    at most 5.9 dB (brown); the utterances, clean or in white, pink or brown noise at 5,
    10 and 15 dB SNR (the demo's noisy split: 15-25), at least 11.0 dB (white, 5 dB). 8
    lies between. 0: off.
    """

    floor_db: float = -50.0
    min_speech_s: float = 0.1
    pad_s: float = 0.1
    max_word_s: float = 3.0
    noise_spread_db: float = 8.0
    min_noise_s: float = 0.5

    def speech(self, audio: np.ndarray, rate: int) -> np.ndarray:
        """audio (S,) -> (ceil(S / frame),) bool: the 10 ms frames at `floor_db` or more (a
        last partial frame padded with zeros)."""
        frame = max(1, rate // 100)
        padded = np.pad(audio, (0, -len(audio) % frame))
        return frame_db(padded, rate) >= self.floor_db

    def is_silent(self, audio: np.ndarray, rate: int) -> bool:
        """Whether `audio` (S,) holds less than `min_speech_s` of speech frames (and is not
        all speech: a piece shorter than that is silent only if some of it is)."""
        speech = self.speech(audio, rate)
        need = math.ceil(self.min_speech_s * rate / max(1, rate // 100) - 1e-9)
        return np.count_nonzero(speech) < min(need, len(speech))

    def is_noise(self, audio: np.ndarray, rate: int) -> bool:
        """Whether `audio` (S,) is steady noise: at least `min_noise_s` long and its
        `band_spread_db` under `noise_spread_db` (shorter pieces, and audio with no
        speech band, are not judged: NaN compares false)."""
        if self.noise_spread_db <= 0 or len(audio) < self.min_noise_s * rate:
            return False
        return band_spread_db(audio, rate) < self.noise_spread_db

    def check_words(
        self, found: list[Word], audio: np.ndarray, rate: int, offset_s: float
    ) -> tuple[list[Word], list[DroppedWord]]:
        """`found`'s words in `audio` (S,) (which starts at `offset_s`): (kept, with their
        times moved in to their speech; dropped, with the times the decoder gave)."""
        frame_s = max(1, rate // 100) / rate
        pad = int(round(self.pad_s / frame_s))
        speech = self.speech(audio, rate)
        # Dilated by `pad` frames each way ("full" and a slice: "same" mode would return
        # the kernel's length for a shorter piece).
        near = np.convolve(speech, np.ones(2 * pad + 1), "full")[pad : pad + len(speech)] > 0.5
        kept, dropped = [], []
        for w in found:
            # The frames the word overlaps; the epsilon keeps a time on a frame's edge
            # from reaching into the next frame through float rounding.
            a = min(max(0, math.floor((w.start - offset_s) / frame_s + 1e-6)), len(near))
            b = min(max(a, math.ceil((w.end - offset_s) / frame_s - 1e-6)), len(near))
            span = near[a:b]
            if 2 * np.count_nonzero(span) <= len(span):  # an empty span too
                dropped.append(DroppedWord(w, "silence"))
                continue
            first, last = a + int(np.argmax(span)), b - int(np.argmax(span[::-1]))
            start = max(w.start, offset_s + first * frame_s)
            end = min(w.end, offset_s + last * frame_s)
            if end - start > self.max_word_s:
                dropped.append(DroppedWord(w, "too long"))
            else:
                kept.append(Word(w.text, start, end))
        return kept, dropped


def band_spread_db(audio: np.ndarray, rate: int, lo: float = 250.0, hi: float = 4000.0) -> float:
    """audio (S,) -> how much its level in the `lo`-`hi` Hz band (speech's formants; above
    the rumble that makes brown noise's level wander) varies over 20 ms Hann-windowed
    frames: the 95th minus the 10th percentile of the frames' band power, in dB. NaN (no
    verdict) for audio shorter than a frame or a rate with no such band."""
    frame = max(2, rate // 50)
    n = len(audio) // frame
    freqs = np.fft.rfftfreq(frame, 1.0 / rate)
    band = (freqs >= lo) & (freqs < min(hi, rate / 2))
    if n == 0 or not band.any():
        return math.nan
    frames = audio[: n * frame].reshape(n, frame).astype(np.float64) * np.hanning(frame)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    db = 10 * np.log10(power[:, band].sum(axis=1) + 1e-12)
    return float(np.percentile(db, 95) - np.percentile(db, 10))


DEFAULT_GATE = SpeechGate()


@dataclasses.dataclass
class Transcript:
    """What `transcribe` found: the words by start, the words it dropped (`SpeechGate`),
    and the seconds of audio whose pieces were silence, or steady noise, and not decoded."""

    words: list[Word]
    dropped: list[DroppedWord]
    skipped_s: float
    noise_s: float = 0.0


def transcribe(
    blocks: Iterable[np.ndarray],
    decode: WindowDecoder,
    words: TokenWords,
    *,
    rate: int,
    frame_samples: int,
    window_s: float = 20.0,
    overlap_s: float = 2.0,
    min_pause_s: float = 0.25,
    batch: int = 8,
    gate: SpeechGate | None = DEFAULT_GATE,
    progress: Callable[[float], None] | None = None,
) -> Transcript:
    """The words of the whole audio (blocks at `rate` Hz). Pieces are padded to a quarter,
    a half or all of `window_s` (three compiled shapes) and decoded `batch` at a time;
    with a `gate`, silent and noise pieces are skipped and words checked. `progress(seconds)` is
    called with the seconds of audio done (decoded or skipped) whenever that grows.

    Raises:
      ValueError: overlap_s not in [0, window_s).
    """
    if not 0 <= overlap_s < window_s:
        raise ValueError(f"need 0 <= overlap_s < window_s, got {overlap_s} and {window_s}")
    window = int(round(window_s * rate))
    seg = Segmenter(
        window, window - int(round(overlap_s * rate)), rate, int(round(min_pause_s * rate))
    )
    widths = sorted({max(1, window // 4), max(1, window // 2), window})
    frame_s = frame_samples / rate
    out = Transcript([], [], 0.0)
    # Per width: (piece, the start and end of its share of the words, its share's seconds)
    queues: dict[int, list[tuple[Piece, float, float, float]]] = {w: [] for w in widths}
    done = [0.0]  # seconds of the audio decoded or skipped: the pieces' shares add up to all

    def advance(seconds: float) -> None:
        done[0] += seconds
        if progress is not None:
            progress(done[0])

    def flush(width: int) -> None:
        group = queues[width]
        audio = np.zeros((batch, width), np.float32)
        lens = np.full(batch, width, np.int32)  # unused rows: decoded, then ignored
        for row, (piece, *_) in enumerate(group):
            audio[row, : len(piece.samples)], lens[row] = piece.samples, len(piece.samples)
        for (piece, lo, hi, _), (labels, frames) in zip(group, decode(audio, lens)):
            found = words_from_labels(labels, frames, words, frame_s, piece.start / rate)
            found = keep_between(found, lo, hi)
            if gate is not None:
                found, dropped = gate.check_words(found, piece.samples, rate, piece.start / rate)
                out.dropped.extend(dropped)
            out.words.extend(found)
        advance(sum(share for *_, share in group))
        group.clear()

    lo, share_start = -math.inf, 0.0
    for piece in pieces(blocks, seg):
        hi = math.inf if piece.keep_until is None else piece.keep_until
        share_end = (piece.start + len(piece.samples)) / rate if hi == math.inf else hi
        if gate is not None and gate.is_silent(piece.samples, rate):
            out.skipped_s += share_end - share_start
            advance(share_end - share_start)
        elif gate is not None and gate.is_noise(piece.samples, rate):
            out.noise_s += share_end - share_start
            advance(share_end - share_start)
        else:
            width = next(w for w in widths if w >= len(piece.samples))
            queues[width].append((piece, lo, hi, share_end - share_start))
            if len(queues[width]) == batch:
                flush(width)
        lo, share_start = hi, share_end
    for width in widths:
        if queues[width]:
            flush(width)
    out.words.sort(key=lambda w: w.start)
    out.dropped.sort(key=lambda d: d.word.start)
    return out
