"""A synthetic host batch as the input pipeline delivers it, for timing a train step.

B full-length utterances of S seconds of 16 kHz noise (every row is real audio, so B x S
is the audio of one step), labels drawn uniformly from [1, vocab) at 3-5 tokens per second
per utterance (4 on average, BPE-500 read speech), padded with 0 to the width the input
pipeline gives an S-second bucket. Used by benchmarks/train_step.py.
"""

from __future__ import annotations

import math

import numpy as np

VOCAB = 500  # BPE-500, as configs/conformer.py expects
SAMPLE_RATE = 16000
TOKENS_PER_SECOND = (3.0, 5.0)  # uniform per utterance: 4 tokens/s on average


def make_batch(
    batch: int,
    seconds: float,
    *,
    label_width: int,
    vocab: int = VOCAB,
    sample_rate: int = SAMPLE_RATE,
    tokens_per_second: tuple[float, float] = TOKENS_PER_SECOND,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A host batch as the input pipeline delivers it: B full-length utterances of
    `seconds` of noise, labels in [1, vocab) at tokens_per_second (uniform per row),
    padded with 0 to label_width."""
    rng = np.random.default_rng(seed)
    samples = int(round(seconds * sample_rate))
    rates = rng.uniform(*tokens_per_second, batch)
    label_len = np.clip(np.round(rates * seconds), 1, label_width).astype(np.int32)
    labels = rng.integers(1, vocab, (batch, label_width)).astype(np.int32)
    labels[np.arange(label_width)[None, :] >= label_len[:, None]] = 0
    return {
        "audio": (0.1 * rng.standard_normal((batch, samples))).astype(np.float32),
        "audio_len": np.full(batch, samples, np.int32),
        "labels": labels,
        "label_len": label_len,
        "weight": np.ones(batch, np.float32),
        "label_overflow": np.zeros(batch, np.int32),
        "corrupt": np.zeros(batch, np.int32),
    }


def label_width(seconds: float, max_tokens_per_second: float) -> int:
    """Label padding of an S-second bucket (jaxspeech.data.pipeline.make_bucket_spec)."""
    return int(math.ceil(seconds * max_tokens_per_second))
