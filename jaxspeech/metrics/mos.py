"""Automatic MOS estimates of speech: DNSMOS (Reddy et al., 2021-2022), no reference needed.

Two ONNX networks that Microsoft trained on crowd-sourced listening tests of the Deep
Noise Suppression Challenges' clips (noisy speech and noise suppressors' outputs), shipped
in the `speechmos` wheel (MIT licence) and run here through onnxruntime:

- P.808: one overall MOS (ITU-T P.808 ratings), from a 120-band log-mel spectrogram;
- P.835: speech quality SIG, background-noise quality BAK and overall quality OVRL (ITU-T
  P.835 ratings), from the raw 16 kHz waveform, each mapped through the published
  (non-personalized) calibration polynomial.

Both score 9.01 s windows at a 1 s hop and a clip's score is the mean over its windows,
exactly as the package's reference (`speechmos.dnsmos.run`) does; `Dnsmos.score` equals
that function to float tolerance (tests/metrics/test_mos.py). Scores lie on a 1-5 scale.

DNSMOS is a proxy: it was fitted to human opinions of real recorded speech in real noise.
Formant-synthesized speech (espeak-ng, the demo corpus) and vocoder artefacts are outside
that distribution; compare systems by it, do not read its values as listeners' MOS.

    scorer = Dnsmos()                       # loads both networks once
    s = scorer.score(wave, sample_rate)     # MosScores(sig=..., bak=..., ovrl=..., p808=...)
    rows = scorer.score_batch([w1, w2], sample_rate)
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
from collections.abc import Sequence

import librosa
import numpy as np

SAMPLE_RATE = 16000  # both networks were trained at 16 kHz only
WINDOW_SECONDS = 9.01
WINDOW = 144160  # samples of one window: 9.01 s at 16 kHz, the P.835 network's input length
HOP = SAMPLE_RATE  # windows start every second

# The networks inside the installed `speechmos` package (its package data: no download).
MODEL_PACKAGE = "speechmos"
P835_MODEL = "dnsmos_models/sig_bak_ovr.onnx"
P808_MODEL = "dnsmos_models/model_v8.onnx"

# The P.808 network's front end: a 120-band power mel spectrogram of a window less its last
# 10 ms (900 frames of 10 ms), in dB relative to the window's own maximum, mapped by
# (dB + 40) / 40. An n_fft of 321 (not 320) and librosa's defaults otherwise (centred Hann
# frames, zero padding, Slaney mel scale) are what the network was trained on.
MEL_BANDS, MEL_N_FFT, MEL_HOP = 120, 321, 160

# Calibration of the P.835 network's raw outputs to the P.835 MOS scale: the published
# non-personalized polynomials (DNS Challenge's DNSMOS P.835 script), highest power first.
P835_CALIBRATION = {
    "sig": (-0.08397278, 1.22083953, 0.0052439),
    "bak": (-0.13166888, 1.60915514, -0.39604546),
    "ovrl": (-0.06766283, 1.11546468, 0.04602535),
}
MEASURES = ("sig", "bak", "ovrl", "p808")


@dataclasses.dataclass(frozen=True)
class MosScores:
    """One clip's DNSMOS: P.835 `sig`, `bak`, `ovrl` and P.808 `p808` (1-5 scale, means
    over `windows` windows of 9.01 s); `clipped`: samples outside [-1, 1] that were
    clipped to it before scoring (see `prepare`)."""

    sig: float
    bak: float
    ovrl: float
    p808: float
    windows: int
    clipped: int

    def as_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def prepare(audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, int]:
    """A float waveform checked and made into the networks' input.

    Args:
      audio: (S,) float waveform, nominally in [-1, 1].
      sample_rate: its rate in Hz; other than 16 kHz, it is resampled to 16 kHz (soxr,
        high quality, through librosa: what the reference's file path, librosa.load, does).

    Returns:
      ((S16,) float32 waveform at 16 kHz, the number of input samples outside [-1, 1]).
      Such samples are clipped to [-1, 1], where the reference refuses the whole clip: a
      vocoder's overshoot should lower its score (as it would sound once written to a
      16-bit WAV), not drop the utterance; the count says how often it happened.

    Raises:
      ValueError: an empty, non-1-D, non-float or non-finite `audio`, or a sample rate
        that is not a positive integer (one line each).
    """
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"DNSMOS: audio must be 1-D (one mono clip), got shape {audio.shape}")
    if audio.size == 0:
        raise ValueError("DNSMOS: audio is empty")
    if not np.issubdtype(audio.dtype, np.floating):
        # Integer PCM would be clipped to +-1 wholesale: refuse it rather than score noise.
        raise ValueError(f"DNSMOS: audio must be a float waveform in [-1, 1], got {audio.dtype}")
    if not np.all(np.isfinite(audio)):
        raise ValueError(f"DNSMOS: audio has {int(np.sum(~np.isfinite(audio)))} non-finite samples")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
        raise ValueError(f"DNSMOS: sample_rate must be an integer, got {sample_rate!r}")
    if sample_rate <= 0:
        raise ValueError(f"DNSMOS: sample_rate must be positive, got {sample_rate}")
    clipped = int(np.sum(np.abs(audio) > 1.0))
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    if sample_rate != SAMPLE_RATE:
        # librosa's resampler (soxr, high quality, length rounded up): the one the reference's
        # file loader uses, so a file and its samples score alike. Lengths matter: a short
        # clip is doubled until it fills a window, and one sample moves every copy.
        audio = librosa.resample(
            audio, orig_sr=int(sample_rate), target_sr=SAMPLE_RATE, res_type="soxr_hq"
        ).astype(np.float32)
    return audio, clipped


def repeat_to_window(audio: np.ndarray) -> np.ndarray:
    """(S,) -> (S * 2**k,): a clip shorter than one window doubled (itself appended to
    itself) until it fills one, as the reference does; longer clips are returned as they
    are. Doubling, not tiling to exactly one window, decides how many windows a short clip
    has (a 4 s clip becomes 16 s: 7 windows), so the same doubling gives the same score."""
    while len(audio) < WINDOW:
        audio = np.concatenate([audio, audio])
    return audio


def window_starts(num_samples: int) -> list[int]:
    """First samples of the 9.01 s windows scored in a clip of `num_samples` >= WINDOW
    samples at 16 kHz: one a second while a whole window fits.

    The reference slices window i as [int(i * 16000), int((i + 9.01) * 16000)) and skips
    a slice shorter than a window. In floating point that end is one sample short for
    some i (7-23, 119-122, ...), so those windows never count in any published DNSMOS
    figure (the DNS Challenge's script and its ports slice the same way); the same windows
    are left out here, so that scores of clips over 16 s stay comparable with them.
    """
    hops = int(np.floor(num_samples / SAMPLE_RATE) - WINDOW_SECONDS) + 1
    return [
        i * HOP for i in range(max(hops, 0)) if int((i + WINDOW_SECONDS) * HOP) - i * HOP == WINDOW
    ]


def p808_features(window: np.ndarray) -> np.ndarray:
    """(WINDOW,) float32 window -> (900, 120) float32 normalized log-mel input of the P.808
    network (the front end described at `MEL_BANDS`)."""
    mel = librosa.feature.melspectrogram(
        y=window[:-MEL_HOP], sr=SAMPLE_RATE, n_fft=MEL_N_FFT, hop_length=MEL_HOP, n_mels=MEL_BANDS
    )
    # dB relative to the window's loudest bin (floored 80 dB below it): the network sees
    # the spectral shape, not the level. A silent window is 0 dB everywhere, not NaN.
    db = librosa.power_to_db(mel, ref=np.max)
    return ((db + 40.0) / 40.0).T.astype(np.float32)


def calibrate(raw: np.ndarray) -> dict[str, np.ndarray]:
    """(W, 3) raw P.835 network outputs (SIG, BAK, OVRL per window) -> {"sig", "bak",
    "ovrl": (W,) calibrated MOS}."""
    return {
        name: np.polyval(np.asarray(P835_CALIBRATION[name]), raw[:, k].astype(np.float64))
        for k, name in enumerate(("sig", "bak", "ovrl"))
    }


def _model_path(name: str) -> str:
    """The file of network `name` inside the installed speechmos package. Only the package
    data is read: speechmos's own modules (they import requests, pandas, tqdm) are not."""
    path = importlib.resources.files(MODEL_PACKAGE) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"DNSMOS: {name} is missing from the installed {MODEL_PACKAGE} package "
            f"(pip install 'speechmos==0.0.1.1')"
        )
    return str(path)


class Dnsmos:
    """DNSMOS P.808 and P.835 scorer: both onnxruntime sessions, created once.

    Args:
      threads: onnxruntime's intra-op threads per network run; default: the CPUs, up to 4.
        On the 2-core VM a 3 s utterance took 0.85 s with two threads, 1.40 s with one
        (the same scores). The TTS evaluation, which scores in a thread beside its other
        work, gives it one core fewer than the machine has.
    """

    def __init__(self, threads: int | None = None):
        threads = threads or min(os.cpu_count() or 1, 4)
        import onnxruntime as ort  # imported here: only a scorer needs its native library

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1  # the graphs are a chain: no parallel branches
        providers = ["CPUExecutionProvider"]
        self._p835 = ort.InferenceSession(_model_path(P835_MODEL), options, providers=providers)
        self._p808 = ort.InferenceSession(_model_path(P808_MODEL), options, providers=providers)
        self._p835_input = self._p835.get_inputs()[0].name
        self._p808_input = self._p808.get_inputs()[0].name

    def score_windows(self, windows: np.ndarray) -> dict[str, np.ndarray]:
        """(W, WINDOW) float32 16 kHz windows -> {"sig", "bak", "ovrl", "p808": (W,) MOS}.

        One window a run: batching them gains nothing on a CPU (measured) and would hold
        W spectrograms' activations at once."""
        raw = np.concatenate(
            [self._p835.run(None, {self._p835_input: w[None, :]})[0] for w in windows]
        )
        p808 = np.array(
            [
                self._p808.run(None, {self._p808_input: p808_features(w)[None]})[0][0, 0]
                for w in windows
            ],
            np.float64,
        )
        return calibrate(raw) | {"p808": p808}

    def score(self, audio: np.ndarray, sample_rate: int) -> MosScores:
        """DNSMOS of one (S,) float waveform at `sample_rate` Hz (see `prepare` for what is
        resampled, clipped or refused with a ValueError)."""
        return self._score_prepared(*prepare(audio, sample_rate))

    def score_batch(self, clips: Sequence[np.ndarray], sample_rate: int) -> list[MosScores]:
        """`score` of each (S_i,) clip, all at `sample_rate` Hz, in order. Every clip is
        checked before any is scored, so a bad one fails the batch at once, not after
        minutes of scoring; the error names its index."""
        prepared = []
        for i, clip in enumerate(clips):
            try:
                prepared.append(prepare(clip, sample_rate))
            except ValueError as e:
                raise ValueError(f"clip {i}: {e}") from None
        return [self._score_prepared(wave, clipped) for wave, clipped in prepared]

    def _score_prepared(self, wave: np.ndarray, clipped: int) -> MosScores:
        """(S,) float32 16 kHz waveform from `prepare` -> its MosScores."""
        wave = repeat_to_window(wave)
        starts = window_starts(len(wave))
        per_window = self.score_windows(np.stack([wave[s : s + WINDOW] for s in starts]))
        means = {k: float(np.mean(v)) for k, v in per_window.items()}
        return MosScores(**means, windows=len(starts), clipped=clipped)


def mean_scores(scores: Sequence[MosScores]) -> dict[str, float | None]:
    """{"sig", "bak", "ovrl", "p808": mean over `scores` (None if there are none)}."""
    return {
        k: (round(float(np.mean([getattr(s, k) for s in scores])), 4) if scores else None)
        for k in MEASURES
    }
