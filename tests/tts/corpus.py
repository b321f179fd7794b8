"""A tiny text-to-speech corpus written directly as prepared shards (no espeak-ng, no Beam):
what `data_prep.prepare --require_phonemes` writes, at a size a test trains on in seconds.

Every phoneme has its own length (frames, a little jittered) and sound: voiced ones are
harmonics of the speaker's F0 under a phoneme-specific spectral peak, "s" is noise, "_"
silence. So the synthesizer can learn both what each phoneme sounds like (for each
speaker) and how long it lasts.
"""

from __future__ import annotations

import json
import os

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from data_prep import stats as prep_stats
from jaxspeech.audio import features
from jaxspeech.data import records

SR, HOP = 16000, 160
# phoneme -> (mean frames, spectral peak Hz; 0: noise, None: silence)
PHONEMES = {
    "_": (6, None),
    "a": (9, 800.0),
    "i": (5, 2300.0),
    "u": (7, 400.0),
    "m": (4, 250.0),
    "s": (8, 0.0),
}
SPEAKER_F0 = {"low": 110.0, "mid": 160.0, "high": 230.0}


def _sound(phoneme: str, frames: int, f0: float, rng: np.random.Generator) -> np.ndarray:
    """`frames` hops of one phoneme's audio."""
    n = frames * HOP
    peak = PHONEMES[phoneme][1]
    if peak is None:
        return 0.001 * rng.standard_normal(n)
    if peak == 0.0:
        return 0.05 * rng.standard_normal(n)
    t = np.arange(n) / SR
    out = np.zeros(n)
    for k in range(1, int(4000 // f0)):
        gain = np.exp(-0.5 * ((k * f0 - peak) / 300.0) ** 2) + 0.05 / k
        out += gain * np.sin(2 * np.pi * k * f0 * t)
    return 0.2 * out / np.max(np.abs(out))


def utterance(rng: np.random.Generator, f0: float) -> tuple[np.ndarray, str, list[float]]:
    """(int16 audio, phonemes, phoneme ends) of 3-7 phonemes between silences, at F0 `f0`."""
    inner = [p for p in rng.choice(list(PHONEMES)[1:], int(rng.integers(3, 8)))]
    tokens = ["_", *inner, "_"]
    frames = [max(1, PHONEMES[p][0] + int(rng.integers(-1, 2))) for p in tokens]
    audio = np.concatenate([_sound(p, f, f0, rng) for p, f in zip(tokens, frames)])
    ends = list(np.cumsum(frames) * HOP / SR)
    return records.to_int16(audio.astype(np.float32)), " ".join(tokens), ends


def write_split(
    root: str,
    split: str,
    per_speaker: int,
    seed: int,
    phonemes: bool = True,
    speakers: dict[str, float] = SPEAKER_F0,
) -> None:
    """DIR/<split>: two shards of `per_speaker` utterances of each of `speakers` (name ->
    F0), the index, stats.json and (with `phonemes`) phonemes.json."""
    rng = np.random.default_rng(seed)
    split_dir = os.path.join(root, split)
    os.makedirs(split_dir, exist_ok=True)
    utts = []
    for speaker, f0 in speakers.items():
        for i in range(per_speaker):
            audio, tokens, ends = utterance(rng, f0)
            utts.append((f"{split}-{speaker}-{i:02d}", speaker, audio, tokens, ends))
    shards, durations, counts = [], [], {}
    for s in range(2):
        name = f"{split}-{s:05d}-of-00002.array_record"
        writer = ArrayRecordWriter(os.path.join(split_dir, name), "group_size:1")
        mine = utts[s::2]
        for uid, speaker, audio, tokens, ends in mine:
            extra = {"phonemes": tokens, "phoneme_ends": ends} if phonemes else {}
            writer.write(
                records.encode_record(
                    id=uid, audio=audio, sample_rate=SR, text=tokens, speaker=speaker, **extra
                )
            )
            durations.append(len(audio) / SR)
            for t in tokens.split(" "):
                counts[t] = counts.get(t, 0) + 1
        writer.close()
        seconds = sum(len(u[2]) for u in mine) / SR
        shards.append({"path": name, "num_records": len(mine), "seconds": seconds})
    _write_stats(split_dir, [u[2] for u in utts])
    if phonemes:
        inventory = {
            "utterances": len(utts),
            "utterances_without": 0,
            "num_phonemes": len(counts),
            "phonemes": dict(sorted(counts.items())),
        }
        with open(os.path.join(split_dir, "phonemes.json"), "w") as f:
            json.dump(inventory, f)
    records.write_split_index(split_dir, shards, np.array(durations), {"sample_rate": SR})


def _write_stats(split_dir: str, audios: list[np.ndarray]) -> None:
    """stats.json of the front end's log-mel over `audios` (as data_prep writes it)."""
    cfg = features.LogMelConfig()
    total = None
    for audio in audios:  # data_prep's own statistics of the front end's log-mel
        total = prep_stats.add_stats(total, prep_stats.feature_sums(np.asarray(audio), cfg))
    stats = {"feature": cfg.as_dict(), **prep_stats.stats_to_json(total)}
    with open(os.path.join(split_dir, "stats.json"), "w") as f:
        json.dump(stats, f)


def write_corpus(root: str) -> str:
    """train (8 utterances of each of 3 speakers) and dev (2 of each); returns root."""
    write_split(root, "train", 8, seed=0)
    write_split(root, "dev", 2, seed=1)
    return root
