"""Text-to-speech batches: a split's records with phonemes -> padded host arrays for the
synthesizer's step, on the recognizer's plan (`BatchPlan`) and shard reader.

A record for text-to-speech carries `phonemes` (space-separated tokens) and
`phoneme_ends` (the second each one ends at; `jaxspeech.data.records`). Host-local batches
(B rows of this process) hold:
  audio (B, S) float32, audio_len (B,) int32: the waveform, from which the step computes
    the mel and energy targets with the recognizer's front end (on device);
  tokens (B, N) int32: phoneme ids (`PhonemeTable`; 0 = padding), token_len (B,) int32;
  durations (B, N) int32: frames per phoneme (`frame_durations`: they add up to the
    utterance's T = 1 + S // hop frames exactly);
  speaker (B,) int32: the row's speaker id (`speaker_ids`);
  pitch (B, T) float32: frame F0 in Hz, 0 where unvoiced (`frame_f0`), T of the bucket;
  weight (B,) float32, label_overflow (B,) int32 (more phonemes than the bucket's N: a
    counted skip), corrupt (B,) int32;
plus the host values of `jaxspeech.data.pipeline` ("faults", "read_retries", "id").
A record that cannot be read, or has no phonemes, or phonemes that do not fit its audio
(`phoneme_problem`), is a padding row marked `corrupt` with its reason in "faults": the
trainer reports it once and counts it against data.max_corrupt_fraction.

F0: `librosa.yin` on the front end's centred frames, a frame voiced where YIN's cumulative
mean normalized difference dips below `VOICING_THRESHOLD` (YIN's own aperiodicity). The
loader computes it for every row of every epoch: 2.5 ms per second of espeak-ng speech on
one core (yin 1.2 ms, the voicing 1.3 ms), against 91 ms for `librosa.pyin`, whose HMM
decides voicing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import librosa
import numpy as np

from jaxspeech.audio.features import num_frames
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.data.plan import BucketSpec, PlannedBatch
from jaxspeech.metrics.speech import F0_MAX_HZ, F0_MIN_HZ

PAD, UNK = "<pad>", "<unk>"  # ids 0 and 1 of every phoneme table
# A frame is voiced when the minimum of YIN's cumulative mean normalized difference over
# the F0 range is below this. Measured against pyin's voicing decisions on 6 espeak-ng
# utterances (2 voices): agreement 88-97% at 0.6 (85-96% at 0.5, 85-98% at 0.7); YIN's
# trough threshold 0.1 agreed on 24-49% (it leaves most voiced speech "aperiodic").
VOICING_THRESHOLD = 0.6
# How far the last phoneme end may lie from the audio's duration: data_prep's own
# tolerance (data_prep.phoneme_fields.END_TOLERANCE_S), past which timing and audio differ.
END_TOLERANCE_S = 0.05


# ---------------------------------------------------------------- tables
@dataclasses.dataclass(frozen=True)
class PhonemeTable:
    """Phoneme <-> id: "<pad>" 0, "<unk>" 1 (a phoneme the train split never had), then
    the train split's phonemes, sorted (so every run of a corpus numbers them alike)."""

    tokens: tuple[str, ...]

    @classmethod
    def from_inventory(cls, phonemes: Sequence[str]) -> PhonemeTable:
        return cls((PAD, UNK, *sorted(set(phonemes) - {PAD, UNK})))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def encode(self, phonemes: Sequence[str]) -> np.ndarray:
        """(K,) int32 ids of `phonemes` (UNK for a phoneme not in the table)."""
        index = self._index()
        return np.array([index.get(p, 1) for p in phonemes], np.int32)

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_ids")
        if cached is None:
            cached = {t: i for i, t in enumerate(self.tokens)}
            object.__setattr__(self, "_ids", cached)
        return cached


def speaker_ids(speakers: Sequence[str]) -> dict[str, int]:
    """{speaker: id} of the train split's speakers, sorted: id i is row i of the model's
    speaker table."""
    return {s: i for i, s in enumerate(sorted(set(speakers)))}


# ---------------------------------------------------------------- one record
def phoneme_problem(rec: dict) -> str | None:
    """Why a decoded record cannot train the synthesizer (None: it can): no phoneme
    fields, or fields that do not fit each other or the audio."""
    if "phonemes" not in rec:
        return "no phonemes/phoneme_ends (not text-to-speech data)"
    tokens, ends = rec["phonemes"].split(" "), rec["phoneme_ends"]
    if len(tokens) != len(ends):
        return f"{len(tokens)} phonemes but {len(ends)} phoneme_ends"
    if not all(isinstance(e, int | float) and math.isfinite(e) and e >= 0 for e in ends):
        return "phoneme_ends are not all finite seconds >= 0"
    if any(b < a for a, b in zip(ends, ends[1:])):
        return "phoneme_ends decrease"
    duration = len(rec["audio"]) / rec["sample_rate"]
    if abs(ends[-1] - duration) > END_TOLERANCE_S:
        return f"the last phoneme ends at {ends[-1]:.3f} s but the audio lasts {duration:.3f} s"
    return None


def frame_durations(
    ends_s: Sequence[float], num_samples: int, sample_rate: int, hop_length: int
) -> np.ndarray:
    """(K,) phoneme ends in seconds -> (K,) int32 frames per phoneme of the front end's
    T = 1 + num_samples // hop frames, adding up to T exactly.

    Phoneme k owns the frames from its start boundary up to round(end_k * sr / hop)
    (round half up; boundaries clipped to [0, T], non-decreasing), and the last one owns
    every frame to T: frame t's window is centred on sample t * hop, so a boundary rounds
    to the frame whose centre is nearest. A phoneme shorter than half a hop can own 0
    frames (the length regulator gives it none).
    """
    t = int(num_frames(int(num_samples), hop_length))
    bounds = np.floor(np.asarray(ends_s, np.float64) * sample_rate / hop_length + 0.5)
    bounds = np.maximum.accumulate(np.clip(bounds, 0, t)).astype(np.int64)
    bounds[-1] = t
    return np.diff(bounds, prepend=0).astype(np.int32)


def _min_cmndf(frames_lt: np.ndarray, min_period: int, max_period: int) -> np.ndarray:
    """(L, T) frames -> (T,) minimum over periods [min_period, max_period] of YIN's
    cumulative mean normalized difference (the arithmetic of librosa's `yin`)."""
    acf = librosa.autocorrelate(frames_lt, max_size=max_period + 1, axis=0)
    energy = np.cumsum(np.square(frames_lt), axis=0)
    diff = np.zeros((max_period + 1, frames_lt.shape[1]), frames_lt.dtype)
    diff[1:] = 2 * (acf[0:1] - acf[1:]) - energy[:max_period]
    mean = np.cumsum(diff[1:], axis=0) / np.arange(1, max_period + 1)[:, None]
    cmndf = diff[min_period:] / (mean[min_period - 1 :] + np.finfo(diff.dtype).tiny)
    return cmndf.min(axis=0)


def frame_f0(audio: np.ndarray, sample_rate: int, hop_length: int) -> np.ndarray:
    """(S,) float32 waveform -> (1 + S // hop,) float32 F0 in Hz of the front end's centred
    frames, 0 where unvoiced (`VOICING_THRESHOLD`); YIN over F0_MIN_HZ..F0_MAX_HZ with
    frames of two periods of the lowest F0 (1024 samples at 16 kHz)."""
    frame = 1 << int(math.ceil(math.log2(2.0 * sample_rate / F0_MIN_HZ)))
    t = int(num_frames(len(audio), hop_length))
    if len(audio) == 0 or not np.any(audio):
        return np.zeros((t,), np.float32)
    f0 = librosa.yin(
        audio,
        fmin=F0_MIN_HZ,
        fmax=F0_MAX_HZ,
        sr=sample_rate,
        frame_length=frame,
        hop_length=hop_length,
        center=True,
        pad_mode="constant",
    )
    padded = np.pad(audio, frame // 2)
    frames = librosa.util.frame(padded, frame_length=frame, hop_length=hop_length)
    min_p = int(math.floor(sample_rate / F0_MAX_HZ))
    max_p = min(int(math.ceil(sample_rate / F0_MIN_HZ)), frame - 1)
    voiced = _min_cmndf(frames, min_p, max_p) < VOICING_THRESHOLD
    return np.where(voiced[:t], f0[:t], 0.0).astype(np.float32)


# ---------------------------------------------------------------- batches
def empty_tts_batch(rows: int, samples: int, max_tokens: int, hop_length: int) -> dict:
    """A host batch of `rows` padding rows (weight 0): full-length silent audio whose one
    padding phoneme owns no frame, so every loss term of the row is finite and masked."""
    frames = int(num_frames(samples, hop_length))
    return {
        "audio": np.zeros((rows, samples), np.float32),
        "audio_len": np.full((rows,), samples, np.int32),
        "tokens": np.zeros((rows, max_tokens), np.int32),
        "token_len": np.zeros((rows,), np.int32),
        "durations": np.zeros((rows, max_tokens), np.int32),
        "speaker": np.zeros((rows,), np.int32),
        "pitch": np.zeros((rows, frames), np.float32),
        "weight": np.zeros((rows,), np.float32),
        "label_overflow": np.zeros((rows,), np.int32),
        "corrupt": np.zeros((rows,), np.int32),
    }


class UnknownSpeaker(ValueError):
    """A record's speaker is not in the run's speaker table."""


class LoadTtsBatch(pipeline_lib.LoadBatch):
    """Reads, decodes and pads one host-local text-to-speech batch (no augmentation: the
    targets are the recordings themselves). Picklable, as `LoadBatch` (whose reading and
    fault reports it shares).

    unknown_speaker: "fault" (a training row: reported and skipped like an unreadable
    record) or "error" (evaluation: `UnknownSpeaker`, the model cannot speak that voice).
    """

    def __init__(
        self,
        shard_paths: Sequence[str],
        shard_num_records: Sequence[int],
        table: PhonemeTable,
        speakers: dict[str, int],
        spec: BucketSpec,
        hop_length: int,
        *,
        with_text: bool = False,
        records_in_paths: np.ndarray | None = None,
        retry: reader_lib.RetryPolicy = reader_lib.DEFAULT_RETRY,
        unknown_speaker: str = "fault",
    ):
        super().__init__(
            shard_paths,
            shard_num_records,
            tokenizer_dir="",
            spec=spec,
            with_text=with_text,
            records_in_paths=records_in_paths,
            retry=retry,
        )
        self.table, self.speakers, self.hop = table, dict(speakers), int(hop_length)
        self.unknown_speaker = unknown_speaker

    HOST_TEXT = False  # with_text: the rows' ids only

    def empty(self, planned: PlannedBatch) -> dict:
        bucket = planned.bucket
        b, s = len(planned.indices), self.spec.num_samples(bucket)
        return empty_tts_batch(b, s, self.spec.max_labels[bucket], self.hop)

    def problem(self, rec: dict) -> str | None:
        """`phoneme_problem`, or an unknown speaker (raised under "error")."""
        if rec["speaker"] not in self.speakers:
            what = f"speaker {rec['speaker']!r} of record {rec['id']!r} is not in the run's table"
            if self.unknown_speaker == "error":
                raise UnknownSpeaker(what)
            return what
        return phoneme_problem(rec)

    def fill(self, out: dict, row: int, rec: dict, planned: PlannedBatch) -> str:
        """Puts one good record into row `row` of `out` (skipped if its phonemes overflow)."""
        audio = reader_lib.audio_float32(rec)
        sr, s, n = self.spec.sample_rate, out["audio"].shape[1], out["tokens"].shape[1]
        pipeline_lib.check_fits(rec, audio, s)
        out["audio"][row, : len(audio)] = audio
        out["audio_len"][row] = len(audio)
        out["speaker"][row] = self.speakers[rec["speaker"]]
        tokens = rec["phonemes"].split(" ")
        if len(tokens) > n:  # counted, never truncated (its durations would not add up)
            out["label_overflow"][row] = 1
            return ""
        out["tokens"][row, : len(tokens)] = self.table.encode(tokens)
        out["token_len"][row] = len(tokens)
        out["durations"][row, : len(tokens)] = frame_durations(
            rec["phoneme_ends"], len(audio), sr, self.hop
        )
        f0 = frame_f0(audio, sr, self.hop)
        out["pitch"][row, : len(f0)] = f0
        out["weight"][row] = 1.0
        return ""


def make_tts_pipeline(
    *,
    data_dir: str,
    split: str,
    table: PhonemeTable,
    speakers: dict[str, int],
    spec: BucketSpec,
    hop_length: int,
    with_ids: bool | None = None,
    **loading,
) -> pipeline_lib.Pipeline:
    """`pipeline.split_pipeline` over `data_dir/split` with the text-to-speech loader:
    shuffled and epoch-repeated when training, else one ordered pass whose unknown
    speakers raise `UnknownSpeaker`. Batches carry "id" lists when `with_ids` (default:
    for evaluation only). `loading`: `pipeline.Loading`'s fields (seed and train at least;
    `config.build.loader_settings` gives a run's).

    Raises: what `pipeline.split_pipeline` raises (an unprepared split, a damaged shard,
    settings that do not fit the split).
    """
    settings = pipeline_lib.Loading(**loading)
    train = settings.train

    def load(spec: BucketSpec, paths: list[str], counts: list[int], in_paths) -> LoadTtsBatch:
        return LoadTtsBatch(
            paths,
            counts,
            table,
            speakers,
            spec,
            hop_length,
            with_text=not train if with_ids is None else with_ids,
            records_in_paths=in_paths,
            retry=settings.retry,
            unknown_speaker="fault" if train else "error",
        )

    return pipeline_lib.split_pipeline(data_dir, split, spec, settings, load)
