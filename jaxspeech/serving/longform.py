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


def read_audio_blocks(path: str, rate: int, block_s: float = 30.0) -> Iterator[np.ndarray]:
    """The mono float32 samples of an audio file at `rate` Hz, in blocks of about
    `block_s` seconds (any libsndfile format; more channels are averaged; another rate is
    resampled as one stream, so blocks join without edge effects).

    Raises:
      FileNotFoundError / soundfile.LibsndfileError: a missing or undecodable file.
    """
    import soundfile as sf
    import soxr

    with sf.SoundFile(path) as f:
        file_rate = int(f.samplerate)
        stream = None if file_rate == rate else soxr.ResampleStream(file_rate, rate, 1, "float32")
        size = max(1, int(block_s * file_rate))
        while True:
            block = f.read(size, dtype="float32", always_2d=True)
            last = len(block) < size
            mono = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
            out = stream.resample_chunk(mono, last=last) if stream else mono
            if len(out):
                yield np.ascontiguousarray(out, np.float32)
            if last:
                return


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
        frame = self.rate // 100
        n = len(audio) // frame
        need = -(-self.min_pause // frame) if self.min_pause else 0
        if not need or n <= need:
            return None
        power = np.mean(np.square(audio[: n * frame].reshape(n, frame), dtype=np.float64), 1)
        db = 10 * np.log10(power + 1e-12)
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
) -> list[Word]:
    """The words of the whole audio (blocks at `rate` Hz). Pieces are padded to a quarter,
    a half or all of `window_s` (three compiled shapes) and decoded `batch` at a time.

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
    out: list[Word] = []
    queues: dict[int, list[tuple[Piece, float]]] = {w: [] for w in widths}

    def flush(width: int) -> None:
        group = queues[width]
        audio = np.zeros((batch, width), np.float32)
        lens = np.full(batch, width, np.int32)  # unused rows: decoded, then ignored
        for row, (piece, _) in enumerate(group):
            audio[row, : len(piece.samples)], lens[row] = piece.samples, len(piece.samples)
        for (piece, lo), (labels, frames) in zip(group, decode(audio, lens)):
            hi = math.inf if piece.keep_until is None else piece.keep_until
            found = words_from_labels(labels, frames, words, frame_s, piece.start / rate)
            out.extend(keep_between(found, lo, hi))
        group.clear()

    lo = -math.inf
    for piece in pieces(blocks, seg):
        width = next(w for w in widths if w >= len(piece.samples))
        queues[width].append((piece, lo))
        lo = math.inf if piece.keep_until is None else piece.keep_until
        if len(queues[width]) == batch:
            flush(width)
    for width in widths:
        if queues[width]:
            flush(width)
    return sorted(out, key=lambda w: w.start)
