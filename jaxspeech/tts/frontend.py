"""Text -> the phoneme tokens a synthesizer was trained on (`tts.synthesis`).

Two front ends:

- "espeak": the demo corpus's own (`tts.text`, with which `data_prep.demo` made it), so
  that a sentence is phonemized exactly as the corpus's were: written out by
  `tts.text.normalize` (numbers, abbreviations and symbols as words; a capital and a full
  stop), spoken by espeak-ng (`tts.text.espeak`) in the speaker's accent and prosody, and
  its phoneme events mapped to tokens as `tts.text.phonemes.align` maps them ("_" for
  every pause, one at each end, runs merged, zero-length ones inside dropped). The voice
  is the speaker's in the demo corpus (`tts.text.demo_speakers`: the accent decides the
  phonemes), or the one given (a corpus of other speakers phonemized with espeak-ng).
- "phonemes": the text is the phonemes themselves, space-separated tokens of the run's
  table (a corpus phonemized by another tool: phonemize the text with that tool).

Every mistake is one line (`UserError`): no words, a character the normalizer cannot
write out, a phoneme the run's table lacks (the run was trained on another phoneme set).
"""

from __future__ import annotations

import dataclasses

from jaxspeech.common.errors import UserError
from jaxspeech.tts.batch import PAD, UNK, PhonemeTable
from jaxspeech.tts.text import demo_speakers, espeak, normalize, phonemes

FRONT_ENDS = ("espeak", "phonemes")
DEFAULT_VOICE = "en-us"  # espeak-ng's, for a speaker not in the demo corpus


@dataclasses.dataclass(frozen=True)
class Voice:
    """What espeak-ng is set to before it speaks (the phonemes depend on the voice's
    language and accent; the prosody only on where pauses fall)."""

    name: str  # espeak-ng voice ("en-us", "en-gb-scotland", ...)
    variant: str | None = None
    rate: int = 175
    pitch: int = 50
    pitch_range: int = 50


def voice_for(speaker: str, voice: str | None = None) -> Voice:
    """The voice `speaker` spoke with in the demo corpus (its accent, variant and base
    prosody), with its language replaced by `voice` when given; `voice` (default
    DEFAULT_VOICE) for a speaker the demo corpus does not have."""
    for s in demo_speakers.SPEAKERS:
        if s.name == speaker:
            demo = Voice(s.voice, s.variant, s.rate, s.pitch, s.pitch_range)
            return demo if voice is None else dataclasses.replace(demo, name=voice)
    return Voice(voice or DEFAULT_VOICE)


def normalized(sentence: str) -> tuple[str, str]:
    """(transcript, what espeak-ng is given) of `sentence`, as the corpus's sentences.

    Raises:
      UserError: no words, or characters the normalizer cannot write out.
    """
    try:
        return normalize.normalize(sentence)
    except ValueError as e:
        if str(e) == "no words":
            raise UserError("empty text: nothing to say") from e
        raise UserError(f"cannot phonemize {sentence!r}: {e}") from e


def espeak_tokens(spoken: str, voice: Voice) -> list[str]:
    """The tokens espeak-ng speaks `spoken` with in `voice` (module docstring).

    Raises:
      UserError: libespeak-ng is missing, rejects the voice, or speaks nothing.
    """
    try:
        tts = espeak.Espeak.get()
        tts.set_voice(voice.name, voice.variant)
        tts.set_prosody(voice.rate, voice.pitch, voice.pitch_range)
        wav, events = tts.synthesize_with_phonemes(spoken)
    except espeak.EspeakError as e:
        raise UserError(f"espeak-ng: {e}") from e
    if not events:
        raise UserError(f"espeak-ng spoke no phoneme of {spoken!r}")
    seconds = len(wav) / tts.sample_rate
    return list(phonemes.align(events, 0.0, seconds, 0.0, seconds).phonemes)


def tokens_of(
    sentence: str, table: PhonemeTable, front_end: str, voice: Voice
) -> tuple[str, list[str]]:
    """(transcript, phoneme tokens of `table`) of one sentence; for the "phonemes" front
    end the transcript is the tokens joined.

    Raises:
      UserError: see `normalized` and `espeak_tokens`; a token the table lacks.
    """
    if front_end == "phonemes":
        tokens = sentence.split()
        if not tokens:
            raise UserError("empty text: nothing to say")
        text = " ".join(tokens)
    elif front_end == "espeak":
        text, spoken = normalized(sentence)
        tokens = espeak_tokens(spoken, voice)
    else:
        raise UserError(f"unknown front end {front_end!r}: choose one of {FRONT_ENDS}")
    known = set(table.tokens) - {PAD, UNK}
    unknown = sorted({t for t in tokens if t not in known})
    if unknown:
        how = (
            f"espeak-ng (voice {voice.name}) gives phonemes {unknown[:5]}"
            if front_end == "espeak"
            else f"phonemes {unknown[:5]} are"
        )
        raise UserError(
            f"cannot phonemize {sentence!r}: {how} not in the run's phoneme table "
            f"({len(known)} phonemes, e.g. {sorted(known)[:8]}); a run trained on another "
            "phoneme set takes its own phonemes: --front_end phonemes"
        )
    return text, tokens
