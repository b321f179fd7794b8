"""Synthesize the multi-speaker English demo corpus with espeak-ng.

    python -m data_prep.demo.synth --output DIR [--hours 3] [--seed 0] [--workers N]
        [--natural_share 0.5] [--tts_heldout 96] [--check]

Writes, for each split in (train, dev, test, tts_heldout):
    DIR/<split>/audio/<split>-<speaker>-<n>.wav   16 kHz mono PCM16
    DIR/<split>/manifest.jsonl                    {"audio_filepath", "text", "duration", "speaker",
                                                   "phonemes", "phoneme_ends"}
and DIR/corpus_info.json (per-split utterances, hours, speakers, distinct words; seed; versions).
"phonemes" are the espeak-ng phoneme mnemonics spoken, space-separated, with "_" for every
pause and for the edge silences (e.g. "_ h @ l 'oU _"); "phoneme_ends" the second each one
ends at in the WAV (rounded to 0.1 ms, non-decreasing, the last exactly "duration"): the
timing espeak-ng reports, mapped through the trimming and edge silences
(`jaxspeech.tts.text.phonemes`). They are what text-to-speech training learns durations from.

Speakers are espeak-ng English accents x voice variants x a base rate/pitch/range. Test and
dev speakers are held out: their variants (timbres) never occur in train, though their
accents do, so held-out error measures generalization to new voices. Sentences come from
one stream of distinct sentences (`data_prep.demo.sentences`), so no text is in two splits.
Training utterances are natural English instead at the rate --natural_share: sentences of
the State of the Union addresses (texts/sotu.txt, see make_texts), each used once, none
equal to a dev or test sentence or to a sentence of the natural-text test splits
(texts/moby_dick.txt); dev and test stay the grammar's, the same for any share.

tts_heldout is the text-to-speech evaluation split (--tts_heldout N utterances, 0: none).
A synthesizer speaks only the voices it was trained on, so the dev and test voices, held
out for the recognizer, cannot evaluate it: it needs sentences it never heard, spoken by
training speakers. The split has N grammar sentences that occur in no other split (nor in
the natural-text test splits), the training speakers taking turns (two each at the default
96), each utterance with its speaker's prosody jittered as in train. It is planned after
everything else (its sentences continue the grammar's stream after train's last, its
prosody draws come from a stream of its own) and rendered in chunks of its own after the
others, so train, dev and test are byte-identical with and without it.

Determinism: everything (sentence, speaker, rate, pitch, gain, silences, noise seed) is
planned in the parent from --seed; workers only render. libespeak-ng carries hidden state
from one utterance to the next within a process, so utterances are rendered in fixed
chunks, each in a fresh process (pool with maxtasksperchild=1): the same seed gives
byte-identical files for any --workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import random
import time
from collections.abc import Iterator, Sequence

import numpy as np
import soundfile as sf
import soxr

from data_prep.demo import corpus_dir, make_texts
from data_prep.demo import sentences as sentences_lib
from jaxspeech.common import files
from jaxspeech.tts.text import demo_speakers as speakers_lib
from jaxspeech.tts.text import espeak, phonemes
from jaxspeech.tts.text.demo_speakers import ACCENTS, SPEAKERS, Speaker  # noqa: F401 (this module's API)

# Bump when anything that changes the audio or transcripts (speakers, planning, rendering)
# changes. The manifests' phoneme fields did not bump it: the audio and transcripts are
# byte-identical to those of version 3 without them, and the version is only checked to
# refuse rebuilding a directory built otherwise; a consumer tells by their presence.
# Neither did the tts_heldout split: train, dev and test are byte-identical with and
# without it, and --tts_heldout is part of the identity (`_identity`) that refuses a
# rebuild over a corpus built with another value.
GENERATOR_VERSION = 3  # 2: 48 train speakers (was 24); 3: natural training sentences
SAMPLE_RATE = 16_000
SPLITS = ("train", "dev", "test")
# The optional text-to-speech evaluation split (module docstring): written when
# --tts_heldout > 0, after the SPLITS.
TTS_SPLIT = "tts_heldout"
DEFAULT_TTS_HELDOUT = 96  # the CLI's: two utterances per training speaker
SPLIT_FRACTIONS = {"train": 0.90, "dev": 0.05, "test": 0.05}
# Utterances rendered per fresh worker process: large enough to amortize the ~0.4 s
# process start, small enough to balance two or more workers. Part of the output's
# identity (espeak-ng state flows between utterances of a chunk): changing it changes
# the audio, so bump GENERATOR_VERSION with it.
CHUNK_SIZE = 96
MAX_EDGE_SILENCE_S = 0.2
# This module's API: the corpus's info file, and the marker of a build in progress.
INFO_FILE, PARTIAL_FILE = corpus_dir.INFO_FILE, corpus_dir.PARTIAL_FILE


# ---------------------------------------------------------------------------------------
# Planning (parent process, deterministic in the seed)
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Utterance:
    """Everything needed to render one utterance, fixed before any audio is made.

    gain_db: peak level in dBFS; lead_s / trail_s: silence kept before / after speech;
    noise_db: RMS of the added noise floor in dBFS; seed: for espeak-ng and the noise.
    """

    utt_id: str
    split: str
    speaker: str
    voice: str
    variant: str
    text: str
    spoken: str
    rate: int
    pitch: int
    pitch_range: int
    gain_db: float
    lead_s: float
    trail_s: float
    noise_db: float
    seed: int

    @property
    def audio_filepath(self) -> str:
        return f"audio/{self.utt_id}.wav"


# A natural sentence whose estimate at its speaker's slowest rate, with the longest edge
# silences, exceeds this is not used: the demo recipe's longest bucket holds 6.25 s.
MAX_NATURAL_S = 6.0


# texts/sotu.txt held 3,000 sentences until it grew to 9,000 (its first 3,000 unchanged):
# each block of this many is shuffled on its own, the first by the stream that also draws
# `choose`, so every corpus the 3,000 could build is byte-identical (GENERATOR_VERSION 3)
# and only larger ones reach the later blocks.
NATURAL_BLOCK = 3000


def natural_order(pool: list, rng: random.Random, seed: int) -> list:
    """`pool` in the seeded order NaturalSentences takes it: block by block (NATURAL_BLOCK),
    the first shuffled by `rng`, each later one by a stream of its own."""
    first = pool[:NATURAL_BLOCK]
    rng.shuffle(first)
    out = first
    for start in range(NATURAL_BLOCK, len(pool), NATURAL_BLOCK):
        block = pool[start : start + NATURAL_BLOCK]
        random.Random(f"jaxspeech-synth-natural-{seed}-{start}").shuffle(block)
        out += block
    return out


class NaturalSentences:
    """The training split's natural sentences in a seeded order, each at most once.

    held_out: transcripts no training sentence may equal (dev, test and the natural-text
    test splits); `skipped` counts the sentences passed over, by reason.
    """

    def __init__(self, seed: int, held_out: set[str], path: str = make_texts.SOTU):
        self._rng = random.Random(f"jaxspeech-synth-natural-{seed}")
        self._pool = iter(natural_order(make_texts.read_sentences(path), self._rng, seed))
        self._held_out = held_out
        self.skipped = {"held_out": 0, "too_long": 0}

    def choose(self, share: float) -> bool:
        """Whether the next training utterance is natural (its own stream: the grammar's
        sentences and the prosody draws are the same for any share)."""
        return self._rng.random() < share

    def next_for(self, rate: int) -> sentences_lib.Sentence:
        """The next sentence that fits MAX_NATURAL_S at `rate` words per minute."""
        for text, spoken in self._pool:
            if text in self._held_out:
                self.skipped["held_out"] += 1
            elif estimate_duration(text, rate) + 2 * MAX_EDGE_SILENCE_S > MAX_NATURAL_S:
                self.skipped["too_long"] += 1
            else:
                return sentences_lib.Sentence(text, spoken)
        raise ValueError(
            "texts/sotu.txt ran out of natural sentences: lower --natural_share or --hours"
        )


# Least-squares fit of speech seconds (edge silences excluded) on characters x 175 / rate,
# over 140 utterances of every speaker rendered with espeak-ng 1.52.
_EST_INTERCEPT_S = 0.04
_EST_S_PER_CHAR = 0.052


def estimate_duration(text: str, rate: int) -> float:
    """Approximate speech seconds espeak-ng needs for `text` at `rate` words per minute.

    Used only to decide how many utterances fill --hours; the manifests carry the
    measured durations.
    """
    return _EST_INTERCEPT_S + _EST_S_PER_CHAR * len(text) * 175.0 / rate


def _utterance(
    split: str, spk: Speaker, number: int, sentence: sentences_lib.Sentence, rng: random.Random
) -> Utterance:
    """Utterance `number` of speaker `spk` in `split`, speaking `sentence`, its prosody,
    level, silences and seed drawn from `rng` (in this order: the plan's stream rests on it).
    """
    # Per-utterance jitter around the speaker's base: about +-10% rate (roughly
    # 145-205 wpm overall), a few steps of pitch and range.
    rate = round(spk.rate * rng.uniform(0.9, 1.1))
    return Utterance(
        utt_id=f"{split}-{spk.name}-{number:05d}",
        split=split,
        speaker=spk.name,
        voice=spk.voice,
        variant=spk.variant,
        text=sentence.text,
        spoken=sentence.spoken,
        rate=rate,
        pitch=min(100, max(0, spk.pitch + rng.randint(-6, 6))),
        pitch_range=min(100, max(0, spk.pitch_range + rng.randint(-10, 10))),
        gain_db=round(rng.uniform(-10.0, -1.0), 2),
        lead_s=round(rng.uniform(0.03, MAX_EDGE_SILENCE_S), 3),
        trail_s=round(rng.uniform(0.03, MAX_EDGE_SILENCE_S), 3),
        noise_db=round(rng.uniform(-80.0, -60.0), 1),
        seed=rng.getrandbits(31),
    )


def plan_corpus(
    hours: float,
    seed: int,
    natural_share: float = 0.0,
    skipped: dict | None = None,
    tts_heldout: int = 0,
) -> list[Utterance]:
    """All utterances of the corpus in manifest order (test, dev, train, tts_heldout).

    Each split gets SPLIT_FRACTIONS[split] * hours of (estimated) audio, and at least one
    utterance per speaker; speakers take turns so each has an equal share. A share
    `natural_share` of the training utterances take their sentence from NaturalSentences
    (the natural sentences passed over are counted into `skipped`, by reason). Then
    `tts_heldout` utterances of the text-to-speech split (`_plan_tts_heldout`), which
    leave every utterance before them as it is without them.
    """
    rng = random.Random(f"jaxspeech-synth-plan-{seed}")
    sentences = sentences_lib.SentenceGenerator(seed)
    plan: list[Utterance] = []
    natural = None
    for split in ("test", "dev", "train"):  # held-out splits first: stable if hours change
        if split == "train" and natural_share > 0:
            held_out = {u.text for u in plan}
            held_out |= {t for t, _ in make_texts.read_sentences(make_texts.MOBY_DICK)}
            natural = NaturalSentences(seed, held_out)
        speakers = [s for s in SPEAKERS if s.split == split]
        target_s = hours * 3600.0 * SPLIT_FRACTIONS[split]
        counts = dict.fromkeys((s.name for s in speakers), 0)
        total_s, i = 0.0, 0
        while total_s < target_s or i < len(speakers):
            spk = speakers[i % len(speakers)]
            i += 1
            counts[spk.name] += 1
            if split == "train" and natural_share > 0 and natural.choose(natural_share):
                sentence = natural.next_for(round(spk.rate * 0.9))
            else:
                sentence = next(sentences)
            utt = _utterance(split, spk, counts[spk.name], sentence, rng)
            plan.append(utt)
            total_s += estimate_duration(utt.text, utt.rate) + utt.lead_s + utt.trail_s
    if natural is not None and skipped is not None:
        skipped.update(natural.skipped)
    return plan + _plan_tts_heldout(tts_heldout, seed, sentences, plan)


def _plan_tts_heldout(
    n: int, seed: int, sentences: Iterator[sentences_lib.Sentence], plan: Sequence[Utterance]
) -> list[Utterance]:
    """The `n` utterances of the tts_heldout split, planned after all of `plan`.

    Nothing drawn for `plan` moves: the sentences continue `sentences` (the grammar's
    stream, which never repeats a sentence, after train drew its last), so the training
    draw neither loses a sentence to this split nor gains one; the prosody comes from a
    random stream of its own. A sentence equal to one of `plan` (a natural training
    sentence can be) or of the natural-text test splits is passed over. The training
    speakers take turns, in SPEAKERS order.
    """
    if n <= 0:
        return []
    rng = random.Random(f"jaxspeech-synth-tts-heldout-{seed}")
    taken = {u.text for u in plan}
    taken |= {t for t, _ in make_texts.read_sentences(make_texts.MOBY_DICK)}
    speakers = [s for s in SPEAKERS if s.split == "train"]
    out = []
    for i in range(n):
        sentence = next(sentences)
        while sentence.text in taken:
            sentence = next(sentences)
        spk = speakers[i % len(speakers)]
        out.append(_utterance(TTS_SPLIT, spk, i // len(speakers) + 1, sentence, rng))
    return out


def _chunks(plan: Sequence[Utterance]) -> list[list[Utterance]]:
    """Fixed render chunks: per split, consecutive runs of at most CHUNK_SIZE.

    tts_heldout's chunks come last and hold only its utterances: each chunk renders in a
    fresh process, so the other splits' chunks, and their audio, are what they are
    without it.
    """
    chunks = []
    for split in (*SPLITS, TTS_SPLIT):
        utts = [u for u in plan if u.split == split]
        chunks += [utts[i : i + CHUNK_SIZE] for i in range(0, len(utts), CHUNK_SIZE)]
    return chunks


# ---------------------------------------------------------------------------------------
# Rendering (worker processes)
# ---------------------------------------------------------------------------------------


def render(utt: Utterance, tts: espeak.Espeak) -> tuple[np.ndarray, phonemes.Alignment]:
    """Synthesize, resample to 16 kHz, set edge silences, level and noise floor.

    Returns:
      ((N,) int16 samples at SAMPLE_RATE, the phonemes spoken and the second each ends at
      in those samples: see `jaxspeech.tts.text.phonemes.align`).
    """
    tts.set_voice(utt.voice, utt.variant)
    tts.set_prosody(utt.rate, utt.pitch, utt.pitch_range)
    raw, events = tts.synthesize_with_phonemes(utt.spoken, seed=utt.seed)
    if raw.size == 0:
        raise RuntimeError(f"espeak-ng produced no audio for {utt.utt_id}: {utt.spoken!r}")
    x = soxr.resample(raw.astype(np.float32) / 32768.0, tts.sample_rate, SAMPLE_RATE, "HQ")
    # Speech bounds: first/last sample above -50 dB re peak (low enough to keep soft
    # fricative onsets and releases) plus a 10 ms guard; what lies outside is replaced by
    # exactly the planned silences.
    peak = float(np.max(np.abs(x)))
    loud = np.flatnonzero(np.abs(x) > peak * 10 ** (-50 / 20))
    guard = SAMPLE_RATE // 100
    start, stop = max(0, loud[0] - guard), min(len(x), loud[-1] + 1 + guard)
    speech = x[start:stop] * (10 ** (utt.gain_db / 20) / peak)
    lead, trail = round(utt.lead_s * SAMPLE_RATE), round(utt.trail_s * SAMPLE_RATE)
    y = np.concatenate(
        [np.zeros(lead, np.float32), speech.astype(np.float32), np.zeros(trail, np.float32)]
    )
    # A faint noise floor, so no frame is digital silence (log-mel of zeros is -inf-like
    # and never occurs in real recordings).
    noise = np.random.default_rng(utt.seed).standard_normal(len(y)).astype(np.float32)
    y += noise * np.float32(10 ** (utt.noise_db / 20))
    samples = np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)
    # soxr's one-shot resampling is delay-compensated: output sample i is at i / SAMPLE_RATE
    # seconds of espeak-ng's output, the time base of its events.
    alignment = phonemes.align(
        events,
        speech_start_s=int(start) / SAMPLE_RATE,
        speech_s=int(stop - start) / SAMPLE_RATE,
        lead_s=lead / SAMPLE_RATE,
        duration_s=len(samples) / SAMPLE_RATE,
    )
    return samples, alignment


def _render_chunk(task: tuple[str, list[Utterance]]) -> list[tuple[str, int, dict]]:
    """Worker: render a chunk into OUTPUT/<split>/audio; returns (utt_id, num_samples,
    the manifest's phoneme fields) per utterance."""
    output, utts = task
    tts = espeak.Espeak.get()  # one initialization per worker process
    out = []
    for utt in utts:
        samples, alignment = render(utt, tts)
        path = os.path.join(output, utt.split, utt.audio_filepath)
        sf.write(path, samples, SAMPLE_RATE, subtype="PCM_16", format="WAV")
        out.append((utt.utt_id, len(samples), phonemes.manifest_fields(alignment)))
    return out


# ---------------------------------------------------------------------------------------
# Output directory handling
# ---------------------------------------------------------------------------------------


def _identity(hours: float, seed: int, natural_share: float, tts_heldout: int) -> dict:
    """What makes two builds identical (--workers does not change the output)."""
    return {
        "hours_requested": hours,
        "seed": seed,
        "natural_share": natural_share,
        "tts_heldout": tts_heldout,
        "generator_version": GENERATOR_VERSION,
        "sentences_version": sentences_lib.SENTENCES_VERSION,
    }


# ---------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------


def _words(texts) -> set[str]:
    return {w for t in texts for w in t.split()}


def _render_all(
    output: str, plan: Sequence[Utterance], chunks: list[list[Utterance]], workers: int, t0: float
) -> dict[str, tuple[int, dict]]:
    """Renders every chunk, each in a fresh spawned process, printing progress about ten times.

    Returns:
      {utterance id: (number of samples written, its manifest phoneme fields)}.
    """
    rendered: dict[str, tuple[int, dict]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(workers, len(chunks)), maxtasksperchild=1) as pool:
        done_s, report_every, next_report = 0.0, max(1, len(chunks) // 10), 0
        for k, results in enumerate(pool.imap(_render_chunk, [(output, c) for c in chunks])):
            for utt_id, n, fields in results:
                rendered[utt_id] = (n, fields)
                done_s += n / SAMPLE_RATE
            if k >= next_report or k == len(chunks) - 1:
                next_report = k + report_every
                print(
                    f"  {len(rendered)}/{len(plan)} utterances, {done_s / 3600:.2f} h, "
                    f"{time.monotonic() - t0:.0f} s",
                    flush=True,
                )
    return rendered


def _write_manifest(output: str, split: str, utts: list[Utterance], rendered: dict) -> dict:
    """Writes DIR/<split>/manifest.jsonl; returns the split's corpus_info.json entry."""
    seconds = 0.0
    with files.atomic_open(os.path.join(output, split, "manifest.jsonl")) as f:
        for u in utts:
            num_samples, phoneme_fields = rendered[u.utt_id]
            duration = num_samples / SAMPLE_RATE
            seconds += duration
            row = {
                "audio_filepath": u.audio_filepath,
                "text": u.text,
                "duration": duration,
                "speaker": u.speaker,
                **phoneme_fields,
            }
            f.write(json.dumps(row) + "\n")
    return {
        "utterances": len(utts),
        "hours": round(seconds / 3600, 4),
        "speakers": sorted({u.speaker for u in utts}),
        "distinct_words": len(_words(u.text for u in utts)),
    }


def _print_summary(info: dict, wall: float) -> None:
    """The closing lines: time taken, then per split utterances, hours, speakers, words."""
    print(f"synth_demo: done in {wall:.1f} s")
    for split, s in info["splits"].items():
        print(
            f"  {split:11s} {s['utterances']:6d} utterances {s['hours']:7.3f} h "
            f"{len(s['speakers']):3d} speakers {s['distinct_words']:6d} distinct words"
        )
    print(f"  distinct words overall: {info['distinct_words']}")


def build_corpus(
    output: str,
    hours: float = 3.0,
    seed: int = 0,
    workers: int | None = None,
    natural_share: float = 0.0,
    tts_heldout: int = 0,
) -> dict:
    """Plan, render and describe the corpus in `output`; returns the corpus_info dict.

    tts_heldout: utterances of the text-to-speech split (0 here, so that a library call
    makes the recognizer's corpus only; the CLI's default is DEFAULT_TTS_HELDOUT).
    """
    if not hours > 0:
        raise ValueError(f"--hours must be positive, got {hours}")
    if not 0.0 <= natural_share <= 1.0:
        raise ValueError(f"--natural_share must be in [0, 1], got {natural_share}")
    if tts_heldout < 0:
        raise ValueError(f"--tts_heldout must be >= 0, got {tts_heldout}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    t0 = time.monotonic()
    identity = _identity(hours, seed, natural_share, tts_heldout)
    corpus_dir.prepare_output(output, identity, ours={*SPLITS, TTS_SPLIT})
    files.atomic_json(os.path.join(output, PARTIAL_FILE), identity)

    skipped: dict = {}
    plan = plan_corpus(hours, seed, natural_share, skipped, tts_heldout)
    splits = (*SPLITS, TTS_SPLIT) if tts_heldout else SPLITS
    for split in splits:
        os.makedirs(os.path.join(output, split, "audio"))
    chunks = _chunks(plan)
    print(
        f"synth_demo: {len(plan)} utterances (~{hours:g} h) in {len(chunks)} chunks, "
        f"{min(workers, len(chunks))} workers -> {output}",
        flush=True,
    )
    rendered = _render_all(output, plan, chunks, workers, t0)

    info = {
        "generator": "data_prep.demo.synth",
        **identity,
        "sample_rate": SAMPLE_RATE,
        "splits": {},
        "speakers": speakers_lib.describe(),
    }
    for split in splits:
        utts = [u for u in plan if u.split == split]
        info["splits"][split] = _write_manifest(output, split, utts, rendered)
    info["distinct_words"] = len(_words(u.text for u in plan))
    natural = {t for t, _ in make_texts.read_sentences(make_texts.SOTU)} if natural_share else set()
    info["natural_sentences"] = {
        "source": "data_prep/demo/texts/" + os.path.basename(make_texts.SOTU),
        "used": sum(u.text in natural for u in plan if u.split == "train"),
        "skipped": skipped,
    }
    info["espeak_ng_version"] = espeak.library_version()
    files.atomic_write(os.path.join(output, INFO_FILE), json.dumps(info, indent=2) + "\n")
    os.remove(os.path.join(output, PARTIAL_FILE))

    _print_summary(info, time.monotonic() - t0)
    return info


def main(argv: Sequence[str] | None = None) -> dict:
    """CLI entry point; returns the corpus_info dict (for tests)."""
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.demo.synth", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", required=True, help="corpus directory (created)")
    parser.add_argument("--hours", type=float, default=3.0, help="total hours of audio")
    parser.add_argument("--seed", type=int, default=0, help="seed for all choices")
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: all CPUs)"
    )
    parser.add_argument(
        "--natural_share",
        type=float,
        default=0.0,
        help="share of training utterances with a natural sentence (texts/sotu.txt)",
    )
    parser.add_argument(
        "--tts_heldout",
        type=int,
        default=DEFAULT_TTS_HELDOUT,
        help="utterances of the text-to-speech split: unseen sentences by training "
        "speakers (0: none)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="build nothing: fail unless --output holds a finished corpus of these arguments",
    )
    args = vars(parser.parse_args(argv))
    try:
        if args.pop("check"):
            keys = ("hours", "seed", "natural_share", "tts_heldout")
            identity = _identity(*(args[k] for k in keys))
            return corpus_dir.check_corpus(args["output"], identity)
        return build_corpus(**args)  # the flags are its parameters, by name
    except (FileExistsError, ValueError) as e:
        parser.exit(2, f"synth_demo: error: {e}\n")


if __name__ == "__main__":
    main()
