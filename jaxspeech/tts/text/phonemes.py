"""Phoneme timing of a rendered demo utterance: espeak-ng's phoneme events mapped onto the
final audio, which `data_prep.demo.synth.render` trims to the speech and frames with the
planned edge silences.

    espeak-ng output (22,050 Hz)     |..h..@..l..oU.._:|_         (events: start seconds)
    kept speech [start, stop)            [---------]               (resampled to 16 kHz)
    final audio                      [lead][---------][trail]
    tokens / ends                    _    h  @  l  oU _      end = duration

A phoneme starting at t seconds of espeak-ng's output starts at
lead + clip(t - start, 0, stop - start) in the final audio: what lies outside the kept
speech was replaced by silence. The lead is one silence token (merged with a pause espeak-ng
reports at the start), the trail another (merged with its closing pauses); every pause
("_", "_:", ...) becomes that token, runs of them merge into one, and one of zero length
inside the utterance is dropped. Other phonemes may last zero seconds: espeak-ng reports
some (a post-vocalic "l" after "'O:", say) at the same sample as the next one.

Durations are END times in seconds (non-decreasing, the last one the utterance's exact
duration), not per-phoneme lengths: a trainer derives frames by rounding the cumulative ends
at its hop length, so the frames of all phonemes always add up to the utterance's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

SILENCE = "_"  # the token of every pause, and of the lead and trail silences
# Stands in for whitespace inside a mnemonic (tokens are space-separated in a manifest);
# espeak-ng's mnemonics are ASCII, so it cannot clash with one of them.
SPACE_STANDIN = "\u2423"
ENDS_DECIMALS = 4  # manifest precision of the ends (0.1 ms; a 16 kHz sample is 0.0625 ms)


class Alignment(NamedTuple):
    """Phoneme tokens of one utterance and the second each one ends at (same length)."""

    phonemes: tuple[str, ...]
    ends: tuple[float, ...]


def token(mnemonic: str) -> str | None:
    """The token of an espeak-ng mnemonic: SILENCE for a pause ("_", "_:", "_!", ...), the
    mnemonic with whitespace replaced by SPACE_STANDIN otherwise; None for an empty one."""
    if not mnemonic:
        return None
    if mnemonic.startswith("_"):
        return SILENCE
    return re.sub(r"\s", SPACE_STANDIN, mnemonic)


def _merge_silences(tokens: list[str], ends: list[float]) -> Alignment:
    """Runs of SILENCE become one token ending where the run ends; an interior SILENCE of
    zero length (espeak-ng marks clause boundaries it puts no pause at) is dropped."""
    out_tokens: list[str] = []
    out_ends: list[float] = []
    for i, (tok, end) in enumerate(zip(tokens, ends, strict=True)):
        if tok == SILENCE and out_tokens and out_tokens[-1] == SILENCE:
            out_ends[-1] = end
        elif tok == SILENCE and out_ends and end == out_ends[-1] and i < len(tokens) - 1:
            continue
        else:
            out_tokens.append(tok)
            out_ends.append(end)
    return Alignment(tuple(out_tokens), tuple(out_ends))


def align(
    events: Sequence[tuple[str, float]],
    speech_start_s: float,
    speech_s: float,
    lead_s: float,
    duration_s: float,
) -> Alignment:
    """Maps espeak-ng's phoneme events onto the final audio.

    Args:
      events: (mnemonic, start seconds in espeak-ng's output), in spoken order.
      speech_start_s: where the kept speech starts in espeak-ng's output (the trim start).
      speech_s: length of the kept speech; it starts at lead_s in the final audio.
      lead_s: the silence before the speech in the final audio.
      duration_s: the final audio's duration (lead + speech + trail).

    Returns:
      The tokens, SILENCE first and last, and their end seconds: non-decreasing, each in
      [lead_s, duration_s], the last exactly duration_s.
    """
    tokens, starts = [SILENCE], [0.0]
    for mnemonic, t in events:
        tok = token(mnemonic)
        if tok is None:
            continue
        start = lead_s + min(max(t - speech_start_s, 0.0), speech_s)
        tokens.append(tok)
        starts.append(max(start, starts[-1]))  # events come in order; keep them so
    tokens.append(SILENCE)  # the trail
    starts.append(max(lead_s + speech_s, starts[-1]))
    return _merge_silences(tokens, [*starts[1:], duration_s])


def manifest_fields(alignment: Alignment) -> dict[str, str | list[float]]:
    """{"phonemes": space-separated tokens, "phoneme_ends": ends rounded to ENDS_DECIMALS},
    the last end kept exact (it is the utterance's duration)."""
    last = alignment.ends[-1]
    ends = [min(round(e, ENDS_DECIMALS), last) for e in alignment.ends[:-1]] + [last]
    return {"phonemes": " ".join(alignment.phonemes), "phoneme_ends": ends}
