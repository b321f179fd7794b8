"""The optional phoneme fields of an utterance (what text-to-speech training learns from):
their parse and checks, their fit to the audio, and a split's phoneme inventory.

An utterance carries both fields or neither:

    phonemes      the phonemes spoken, in order: a string of space-separated tokens, or a
                  list of tokens; no token is empty or holds whitespace
    phoneme_ends  the second each one ends at, relative to the utterance's audio (the
                  segment, for a manifest line with "offset"): non-negative, non-decreasing,
                  one per phoneme, the last one the audio's duration

Ends, not per-phoneme lengths: a trainer derives frames by rounding cumulative ends at its
hop length, so the frames of all phonemes add up to the utterance's at any hop. Every
problem is a counted skip reason (keys of prep_report.json["skipped"]).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

# Skip reasons.
PHONEMES_WITHOUT_ENDS = "phonemes_without_ends"
ENDS_WITHOUT_PHONEMES = "phoneme_ends_without_phonemes"
BAD_PHONEMES = "bad_phonemes"  # not a string or list of strings; empty; a token with whitespace
BAD_PHONEME_ENDS = "bad_phoneme_ends"  # not a list of numbers; negative; decreasing
PHONEME_COUNT_MISMATCH = "phoneme_count_mismatch"
PHONEME_DURATION_MISMATCH = "phoneme_ends_mismatch_duration"
MISSING_PHONEMES = "missing_phonemes"  # only with --require_phonemes

# How far the last end may be from the audio's duration (seconds): within it, the ends are
# rescaled so the last one is the duration exactly (a resampled or re-encoded file can
# differ from the duration its timing was made for by a few samples); beyond it, the
# timing belongs to other audio.
END_TOLERANCE_S = 0.05
RESCALED_DECIMALS = 6  # rescaled ends are rounded to the microsecond
INVENTORY_FILE = "phonemes.json"  # beside the split's index.json


def _tokens(value: Any) -> tuple[str, ...] | None:
    """The tokens of a "phonemes" value, or None if it is malformed."""
    if isinstance(value, str):
        tokens = value.split(" ")  # not split(): a double space is an empty token, an error
    elif isinstance(value, list) and all(isinstance(t, str) for t in value):
        tokens = value
    else:
        return None
    if not tokens or any(not t or any(c.isspace() for c in t) for t in tokens):
        return None
    return tuple(tokens)


def _ends(value: Any) -> tuple[float, ...] | None:
    """The seconds of a "phoneme_ends" value, or None unless they are finite numbers,
    non-negative and non-decreasing."""
    if not isinstance(value, list) or not value:
        return None
    # bool is an int to Python, not a number of seconds; NaN and infinities are no times.
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in value):
        return None
    ends = tuple(float(v) for v in value)
    if any(not math.isfinite(e) or e < 0 for e in ends):
        return None
    if any(b < a for a, b in zip(ends, ends[1:])):
        return None
    return ends


def parse_phoneme_fields(
    phonemes: Any, ends: Any
) -> tuple[tuple[str, ...] | None, tuple[float, ...] | None, str | None]:
    """Checks an input's raw "phonemes" and "phoneme_ends" values (None: absent).

    Returns:
      (tokens, ends seconds, None) for good fields, (None, None, None) for neither field,
      (None, None, skip reason) otherwise.
    """
    if phonemes is None and ends is None:
        return None, None, None
    if ends is None:
        return None, None, PHONEMES_WITHOUT_ENDS
    if phonemes is None:
        return None, None, ENDS_WITHOUT_PHONEMES
    tokens = _tokens(phonemes)
    if tokens is None:
        return None, None, BAD_PHONEMES
    seconds = _ends(ends)
    if seconds is None:
        return None, None, BAD_PHONEME_ENDS
    if len(tokens) != len(seconds):
        return None, None, PHONEME_COUNT_MISMATCH
    return tokens, seconds, None


def fit_ends(
    ends: tuple[float, ...], duration: float, tolerance: float = END_TOLERANCE_S
) -> tuple[float, ...] | None:
    """The ends made to finish at `duration` seconds: unchanged when the last one is it,
    scaled by duration / last (rounded to RESCALED_DECIMALS, the last exactly `duration`)
    when within `tolerance`; None (a PHONEME_DURATION_MISMATCH) otherwise."""
    last = ends[-1]
    if last == duration:
        return ends
    if not abs(last - duration) <= tolerance or last <= 0:
        return None
    scale = duration / last
    scaled = [min(round(e * scale, RESCALED_DECIMALS), duration) for e in ends[:-1]]
    return (*scaled, duration)


class PhonemeInventoryFn(beam.CombineFn):
    """Phoneme sequences (tuples of tokens; empty: an utterance without phonemes) ->
    {"utterances": with phonemes, "without": without, "counts": {token: occurrences}}."""

    def create_accumulator(self) -> tuple[int, int, collections.Counter]:
        return 0, 0, collections.Counter()

    def add_input(self, acc: Any, tokens: tuple[str, ...]) -> Any:
        with_, without, counts = acc
        if not tokens:
            return with_, without + 1, counts
        counts.update(tokens)
        return with_ + 1, without, counts

    def merge_accumulators(self, accs: Iterable[Any]) -> Any:
        with_, without, counts = 0, 0, collections.Counter()
        for a in accs:
            with_, without = with_ + a[0], without + a[1]
            counts.update(a[2])
        return with_, without, counts

    def extract_output(self, acc: Any) -> dict[str, Any]:
        with_, without, counts = acc
        return {"utterances": with_, "without": without, "counts": dict(counts)}


def inventory(summary: dict[str, Any]) -> dict[str, Any] | None:
    """phonemes.json of a split from PhonemeInventoryFn's output; None when no written
    utterance has phonemes (an ASR split: no file).

    {"utterances": records with phonemes, "utterances_without": records without,
     "num_phonemes": distinct tokens, "phonemes": {token: occurrences}, tokens sorted}:
    a trainer numbers the sorted tokens of the train split for a fixed id table.
    """
    if not summary["utterances"]:
        return None
    counts = summary["counts"]
    return {
        "utterances": summary["utterances"],
        "utterances_without": summary["without"],
        "num_phonemes": len(counts),
        "phonemes": {token: counts[token] for token in sorted(counts)},
    }
