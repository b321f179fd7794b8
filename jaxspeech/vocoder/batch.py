"""Vocoder batches: a split's records -> fixed-length audio segments (training) or whole
utterances (evaluation), on the recognizer's plan (`BatchPlan`) and shard reader. Any
prepared split serves: only the audio is read (no phonemes, no transcripts).

Host-local batches (B rows of this process) hold:
  audio (B, S) float32, audio_len (B,) int32: S = the segment length in training (one
    random window of each utterance per epoch, drawn from `default_rng([seed, epoch, 5,
    record])`, so a resumed run reads the same windows; an utterance shorter than a
    segment is the whole utterance, zero-padded, its padding masked by audio_len), or the
    bucket's samples in evaluation (whole utterances, zero-padded);
  weight (B,) float32 (0 for padding rows), corrupt (B,) int32;
plus the host values of `jaxspeech.data.pipeline` ("faults", "read_retries", "id").
The log-mel the vocoder inverts is computed from the audio on the device
(`jaxspeech.vocoder.objective`), with the run's own front end. A training run given a
synthesizer's ground-truth-aligned frames (`config.vocoder.gta_mels`, a frame store that
`jaxspeech.tts.gta` writes) learns from those instead where the store has the utterance:
its window then starts on a frame (a multiple of the hop), and the batch also holds
  gta_mel (B, 1 + S // hop, M) float32: the store's raw log-mel frames of the window (0
    past the utterance's), gta (B,) float32: 1 where the row has them, else 0 (the device
    uses the audio's own log-mel for that row).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.frame_store import FrameStore
from jaxspeech.data.plan import BucketSpec, PlannedBatch

SEGMENT_STREAM = 5  # the window draws' tag: apart from the plan's 1|2|3 and augmentation's 4


def empty_vocoder_batch(rows: int, samples: int) -> dict[str, np.ndarray]:
    """A host batch of `rows` padding rows (weight 0, no valid sample)."""
    return {
        "audio": np.zeros((rows, samples), np.float32),
        "audio_len": np.zeros((rows,), np.int32),
        "weight": np.zeros((rows,), np.float32),
        "corrupt": np.zeros((rows,), np.int32),
    }


def segment(audio: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """A random window of `samples` of (S,) `audio`, or all of it when it is shorter."""
    if len(audio) <= samples:
        return audio
    start = int(rng.integers(0, len(audio) - samples + 1))
    return audio[start : start + samples]


def aligned_segment(
    audio: np.ndarray, frames: np.ndarray, samples: int, hop: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A random window of `samples` of (S,) `audio` that starts on a frame, and the (T,
    M) `frames` of the utterance from that frame on (frame k is centred on sample k *
    hop, as the front end's): (window, frames[k:]). All of both when the audio is
    shorter than a window."""
    if len(audio) <= samples:
        return audio, frames
    k = int(rng.integers(0, (len(audio) - samples) // hop + 1))
    return audio[k * hop : k * hop + samples], frames[k:]


class LoadVocoderBatch(pipeline_lib.LoadBatch):
    """Reads and pads one host-local vocoder batch (see the module docstring).
    `segment_samples`: the training window; 0: whole utterances at the bucket's width."""

    def __init__(
        self,
        shard_paths: Sequence[str],
        shard_num_records: Sequence[int],
        spec: BucketSpec,
        segment_samples: int,
        seed: int,
        *,
        with_text: bool = False,
        records_in_paths: np.ndarray | None = None,
        retry: reader_lib.RetryPolicy = reader_lib.DEFAULT_RETRY,
        gta: FrameStore | None = None,
        hop: int = 160,
        n_mels: int = 80,
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
        self.segment_samples, self.seed = int(segment_samples), int(seed)
        self.gta, self.hop, self.n_mels = gta, int(hop), int(n_mels)

    HOST_TEXT = False  # with_text: the rows' ids only

    def empty(self, planned: PlannedBatch) -> dict:
        width = self.segment_samples or self.spec.num_samples(planned.bucket)
        out = empty_vocoder_batch(len(planned.indices), width)
        if self.gta is not None:
            frames = 1 + width // self.hop
            out["gta_mel"] = np.zeros((len(planned.indices), frames, self.n_mels), np.float32)
            out["gta"] = np.zeros((len(planned.indices),), np.float32)
        return out

    def fill(self, out: dict, row: int, rec: dict, planned: PlannedBatch) -> str:
        """Puts one readable record into row `row` of `out`: a random window of it in
        training, all of it in evaluation."""
        audio = reader_lib.audio_float32(rec)
        frames = None if self.gta is None else self.gta.get(rec["id"])
        if self.segment_samples:
            record = int(planned.indices[row])
            rng = np.random.default_rng([self.seed, planned.epoch, SEGMENT_STREAM, record])
            if frames is None:
                audio = segment(audio, self.segment_samples, rng)
            else:
                audio, frames = aligned_segment(audio, frames, self.segment_samples, self.hop, rng)
                n = min(len(frames), out["gta_mel"].shape[1])
                out["gta_mel"][row, :n] = frames[:n]
                out["gta"][row] = 1.0
        else:
            pipeline_lib.check_fits(rec, audio, out["audio"].shape[1])
        out["audio"][row, : len(audio)] = audio
        out["audio_len"][row] = len(audio)
        out["weight"][row] = 1.0
        return ""


def segment_spec(index: records.SplitIndex, batch_size: int, multiple_of: int) -> BucketSpec:
    """One bucket up to the split's longest utterance (none is left out: each gives one
    window per epoch) with `batch_size` rows, rounded up to a multiple of `multiple_of`."""
    longest = float(np.max(index.durations)) if len(index.durations) else 1.0
    rows = multiple_of * -(-int(batch_size) // multiple_of)
    bound = np.ceil(longest * 100.0) / 100.0 + 0.01  # above the longest's rounded samples
    return BucketSpec((float(bound),), (rows,), (0,), index.sample_rate)


def make_vocoder_pipeline(
    *,
    data_dir: str,
    split: str,
    spec: BucketSpec | None,
    segment_samples: int,
    batch_size: int,
    multiple_of: int = 1,
    with_ids: bool | None = None,
    gta: FrameStore | None = None,
    hop: int = 160,
    n_mels: int = 80,
    **loading,
) -> pipeline_lib.Pipeline:
    """`pipeline.split_pipeline` over `data_dir/split` with the vocoder's loader. Training:
    shuffled, epoch-repeated segments of `segment_samples`, `batch_size` global rows (a
    multiple of `multiple_of`: `segment_spec`), with the `gta` store's frames (`n_mels`
    bins, `hop` samples apart) where it has the utterance; else one ordered pass of whole
    utterances in the buckets of `spec`. Batches carry "id" lists when `with_ids`
    (default: for evaluation only). `loading`: `pipeline.Loading`'s fields (seed and train
    at least; `config.build.loader_settings` gives a run's).

    Raises: what `pipeline.split_pipeline` raises (an unprepared split, a damaged shard,
    settings that do not fit the split).
    """
    settings = pipeline_lib.Loading(**loading)
    train = settings.train
    if train:
        spec = functools.partial(segment_spec, batch_size=batch_size, multiple_of=multiple_of)
    assert spec is not None, "evaluation needs the buckets"

    def load(spec: BucketSpec, paths: list[str], counts: list[int], in_paths) -> LoadVocoderBatch:
        return LoadVocoderBatch(
            paths,
            counts,
            spec,
            segment_samples if train else 0,
            settings.seed,
            with_text=not train if with_ids is None else with_ids,
            records_in_paths=in_paths,
            retry=settings.retry,
            gta=gta if train else None,
            hop=hop,
            n_mels=n_mels,
        )

    return pipeline_lib.split_pipeline(data_dir, split, spec, settings, load)
