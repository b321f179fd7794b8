"""Synthesize the demo's natural-text test splits: sentences that no grammar produced
(data_prep/demo/texts/moby_dick.txt), spoken by espeak-ng voices that no split of
`data_prep.demo.synth` uses, clean and with noise.

    python -m data_prep.demo.natural --output DIR [--utterances 100] [--seed 0]

Writes, as the demo synthesizer writes its splits:
    DIR/test_natural_clean/{manifest.jsonl,audio/*.wav}
    DIR/test_natural_noisy/{manifest.jsonl,audio/*.wav}
The two hold the same sentences in the same voices; each noisy file is its clean twin with
white or brown noise added at an SNR drawn from 15-25 dB (the manifest rows of the noisy
split carry `snr_db` and `noise`; both carry the synthesizer's `phonemes` and
`phoneme_ends`). The sentences' source is used by no training split of
the demo, so the splits measure what the issue of natural speech asks: speech unlike the
demo grammar, from unseen voices, with and without noise. Planning is deterministic in
--seed; rendering is data_prep.demo.synth's (byte-identical for any --workers).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Sequence

import numpy as np
import soundfile as sf

from data_prep.demo import make_texts, synth
from jaxspeech.audio import augment
from jaxspeech.common import files

CLEAN, NOISY = "test_natural_clean", "test_natural_noisy"
SNR_DB = (15.0, 25.0)
NOISES = {"white": 0.0, "brown": 2.0}  # 1/f^exponent
# espeak-ng variants that synth.SPEAKERS leaves out and that are ordinary voices (no echo,
# flutter or robot timbre), one per accent: (accent, variant, rate, pitch, pitch range).
VOICES = (
    ("gb", "adam", 170, 48, 56),
    ("us", "boris", 176, 45, 52),
    ("rp", "pedro", 166, 50, 60),
    ("sc", "rob", 172, 47, 50),
    ("cb", "iven2", 168, 52, 58),
    ("lan", "klatt3", 178, 49, 54),
    ("wm", "mike2", 164, 46, 62),
    ("ny", "Gene2", 174, 55, 66),
)


def plan(sentences: Sequence[tuple[str, str]], utterances: int, seed: int) -> list:
    """The clean split's utterances: `utterances` distinct sentences, voices in turn, with
    the demo synthesizer's per-utterance jitter of rate, pitch, level and silences."""
    if not 0 < utterances <= len(sentences):
        raise ValueError(f"--utterances must be in 1..{len(sentences)}, got {utterances}")
    rng = random.Random(f"jaxspeech-natural-{seed}")
    chosen = rng.sample(list(sentences), utterances)
    out = []
    for i, (text, spoken) in enumerate(chosen):
        accent, variant, rate, pitch, pitch_range = VOICES[i % len(VOICES)]
        name = f"nat_{accent}_{variant.lower()}"
        out.append(
            synth.Utterance(
                utt_id=f"{CLEAN}-{name}-{i // len(VOICES) + 1:05d}",
                split=CLEAN,
                speaker=name,
                voice=synth.ACCENTS[accent],
                variant=variant,
                text=text,
                spoken=spoken,
                rate=round(rate * rng.uniform(0.9, 1.1)),
                pitch=min(100, max(0, pitch + rng.randint(-6, 6))),
                pitch_range=min(100, max(0, pitch_range + rng.randint(-10, 10))),
                gain_db=round(rng.uniform(-10.0, -1.0), 2),
                lead_s=round(rng.uniform(0.03, synth.MAX_EDGE_SILENCE_S), 3),
                trail_s=round(rng.uniform(0.03, synth.MAX_EDGE_SILENCE_S), 3),
                noise_db=round(rng.uniform(-80.0, -60.0), 1),
                seed=rng.getrandbits(31),
            )
        )
    return out


def add_noise(clean: np.ndarray, seed: int) -> tuple[np.ndarray, float, str]:
    """(noisy int16 samples, SNR dB, noise name): white or brown noise at an SNR drawn from
    SNR_DB, relative to the whole clean utterance's power."""
    rng = np.random.default_rng(seed)
    name = sorted(NOISES)[int(rng.integers(len(NOISES)))]
    snr = round(float(rng.uniform(*SNR_DB)), 2)
    x = clean.astype(np.float32) / 32768.0
    noise = augment.colored_noise(rng, len(x), NOISES[name])
    y = augment.mix_at_snr(x, noise, snr)
    return np.clip(np.round(y * 32768.0), -32768, 32767).astype(np.int16), snr, name


def build(output: str, utterances: int = 100, seed: int = 0, workers: int | None = None) -> dict:
    """Plan, render and write both splits into `output`; returns {split: utterances}."""
    for split in (CLEAN, NOISY):
        if os.path.exists(os.path.join(output, split)):
            raise FileExistsError(f"{os.path.join(output, split)} exists; remove it first")
    utts = plan(make_texts.read_sentences(make_texts.MOBY_DICK), utterances, seed)
    for split in (CLEAN, NOISY):
        os.makedirs(os.path.join(output, split, "audio"))
    t0 = time.monotonic()
    chunks = [utts[i : i + synth.CHUNK_SIZE] for i in range(0, len(utts), synth.CHUNK_SIZE)]
    rendered = synth._render_all(output, utts, chunks, workers or os.cpu_count() or 1, t0)
    rows = {CLEAN: [], NOISY: []}
    for u in utts:
        clean, _ = sf.read(os.path.join(output, CLEAN, u.audio_filepath), dtype="int16")
        noisy, snr, noise = add_noise(clean, u.seed + 1)
        path = u.audio_filepath.replace(CLEAN, NOISY)
        sf.write(os.path.join(output, NOISY, path), noisy, synth.SAMPLE_RATE, subtype="PCM_16")
        num_samples, phoneme_fields = rendered[u.utt_id]
        row = {"text": u.text, "duration": num_samples / synth.SAMPLE_RATE}
        row["speaker"] = u.speaker
        row.update(phoneme_fields)  # the noisy twin has the clean one's timing
        rows[CLEAN].append({"audio_filepath": u.audio_filepath, **row})
        rows[NOISY].append({"audio_filepath": path, **row, "snr_db": snr, "noise": noise})
    for split, split_rows in rows.items():
        lines = "".join(json.dumps(r) + "\n" for r in split_rows)
        files.atomic_write(os.path.join(output, split, "manifest.jsonl"), lines)
    print(f"natural: {len(utts)} utterances x 2 splits in {time.monotonic() - t0:.0f} s")
    return {split: len(r) for split, r in rows.items()}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.demo.natural", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", required=True, help="directory of the two splits")
    parser.add_argument("--utterances", type=int, default=100, help="utterances per split")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        return build(args.output, args.utterances, args.seed, args.workers)
    except (FileExistsError, ValueError) as e:
        parser.exit(2, f"natural: error: {e}\n")


if __name__ == "__main__":
    main()
