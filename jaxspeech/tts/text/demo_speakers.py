"""The demo corpus's speakers: espeak-ng English accents x voice variants x a base
rate, pitch and pitch range, and the split each belongs to (data_prep/demo/synth.py)."""

from __future__ import annotations

import dataclasses

# espeak-ng English voices bundled with espeakng-loader, by short code used in speaker ids.
# en-shaw (Shavian script) is left out: it is a spelling, not an accent.
ACCENTS = {
    "gb": "en",
    "us": "en-us",
    "rp": "en-gb-x-rp",
    "sc": "en-gb-scotland",
    "cb": "en-029",
    "lan": "en-gb-x-gbclan",
    "wm": "en-gb-x-gbcwmd",
    "ny": "en-us-nyc",
}

# Variants never used, judged from their definitions in espeak-ng-data/voices/!v:
# whisper, whisperf, caleb (voicing near 0: no voiced speech); croak, grandma, grandpa,
# aunty (pitch flutter 12-20: heavy warble); robosoft*, UniRobot, anikaRobot, announcer,
# RicishayMax*, Demonic (robot timbres, echo up to 10 s, extreme roughness); Tweaky,
# kaukovalta, Lee, Jacky, Andy, AnxiousAndy (formants scaled to 9-40% or switched off);
# zac (child pitch 240-390 Hz); Alicia (breathy, echo); fast (a test voice). The rest are
# ordinary voices; the ones below were picked for spread in pitch, formants and synthesis
# method (klatt-based voices: benjamin, edward, edward2, david, Reed, klatt). Also left
# out: Marco and pablo (echo), anika (flutter, intonation 10), sandro (breathy, rough).


@dataclasses.dataclass(frozen=True)
class Speaker:
    """A synthetic speaker: accent x variant x base prosody.

    rate: words per minute; pitch, pitch_range: espeak-ng's 0-100 scale (50 = variant
    default).
    """

    name: str
    accent: str
    variant: str
    rate: int
    pitch: int
    pitch_range: int
    split: str

    @property
    def voice(self) -> str:
        return ACCENTS[self.accent]


def _speakers() -> tuple[Speaker, ...]:
    rows = [
        # train: 8 accents x 3 variants, every variant used once.
        ("gb", "m1", 172, 48, 55),
        ("gb", "f2", 165, 52, 62),
        ("gb", "edward", 178, 45, 50),
        ("us", "m2", 180, 50, 45),
        ("us", "f1", 168, 55, 70),
        ("us", "Gene", 160, 42, 58),
        ("rp", "m4", 170, 47, 52),
        ("rp", "f5", 175, 58, 66),
        ("rp", "john", 163, 40, 48),
        ("sc", "m6", 166, 46, 60),
        ("sc", "steph", 176, 54, 64),
        ("sc", "robert", 182, 44, 46),
        ("cb", "m7", 171, 50, 54),
        ("cb", "belinda", 162, 57, 72),
        ("cb", "paul", 185, 43, 50),
        ("lan", "m8", 169, 52, 56),
        ("lan", "linda", 178, 53, 60),
        ("lan", "quincy", 158, 41, 44),
        ("wm", "Alex", 174, 49, 62),
        ("wm", "Andrea", 164, 56, 58),
        ("wm", "benjamin", 181, 46, 54),
        ("ny", "ed", 176, 51, 57),
        ("ny", "Annie", 167, 44, 52),
        ("ny", "antonio", 173, 48, 64),
        # train, second set: 24 more variants, again each used once. Held-out error is
        # mostly about unseen timbres, so train covers as many ordinary ones as it can.
        ("gb", "Denis", 169, 47, 57),
        ("gb", "steph2", 176, 52, 66),
        ("gb", "klatt", 166, 50, 50),
        ("us", "Diogo", 181, 45, 53),
        ("us", "shelby", 163, 55, 68),
        ("us", "iven3", 174, 48, 47),
        ("rp", "Henrique", 159, 46, 60),
        ("rp", "Michael", 177, 51, 55),
        ("rp", "david", 170, 44, 49),
        ("sc", "Hugo", 184, 49, 58),
        ("sc", "steph3", 167, 56, 70),
        ("sc", "edward2", 172, 42, 51),
        ("cb", "Mario", 165, 48, 61),
        ("cb", "Nguyen", 179, 53, 56),
        ("cb", "norbert", 161, 45, 45),
        ("lan", "gustave", 175, 47, 63),
        ("lan", "Reed", 168, 52, 54),
        ("lan", "m5", 183, 50, 59),
        ("wm", "ian", 162, 43, 52),
        ("wm", "marcelo", 178, 46, 57),
        ("wm", "travis", 171, 49, 65),
        ("ny", "michel", 166, 50, 48),
        ("ny", "miguel", 180, 47, 62),
        ("ny", "victor", 164, 44, 55),
        # dev: variants unseen in train.
        ("lan", "Mike", 170, 50, 55),
        ("gb", "f4", 174, 53, 63),
        # test: variants unseen in train and dev.
        ("us", "m3", 172, 49, 56),
        ("rp", "f3", 168, 54, 64),
        ("sc", "max", 177, 47, 52),
    ]
    split_of = ["train"] * 48 + ["dev"] * 2 + ["test"] * 3
    return tuple(
        Speaker(f"{accent}_{variant.lower()}", accent, variant, rate, pitch, rng, split)
        for (accent, variant, rate, pitch, rng), split in zip(rows, split_of, strict=True)
    )


SPEAKERS = _speakers()


def describe() -> dict:
    """corpus_info.json's "speakers": name -> split, voice and prosody of every speaker."""
    return {
        s.name: {
            "split": s.split,
            "voice": s.voice,
            "variant": s.variant,
            "rate": s.rate,
            "pitch": s.pitch,
            "pitch_range": s.pitch_range,
        }
        for s in SPEAKERS
    }
