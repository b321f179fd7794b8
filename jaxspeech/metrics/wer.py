"""Word and character error rates.

Distances come from rapidfuzz's C++ Levenshtein over token sequences; the
tests check it against a plain dynamic-programming edit distance.
"""

from __future__ import annotations

import dataclasses

from rapidfuzz.distance import Levenshtein


def edit_distance(ref: list | str, hyp: list | str) -> int:
    """Minimum substitutions + insertions + deletions turning ref into hyp."""
    return Levenshtein.distance(ref, hyp)


@dataclasses.dataclass
class ErrorCounts:
    """Accumulated errors and reference lengths; WER/CER are ratios of the totals."""

    word_errors: int = 0
    words: int = 0
    char_errors: int = 0
    chars: int = 0
    utterances: int = 0

    def add(self, ref: str, hyp: str) -> None:
        """Score one utterance. Words split on whitespace; CER counts spaces between words."""
        ref_w, hyp_w = ref.split(), hyp.split()
        self.word_errors += edit_distance(ref_w, hyp_w)
        self.words += len(ref_w)
        ref_c, hyp_c = " ".join(ref_w), " ".join(hyp_w)
        self.char_errors += edit_distance(ref_c, hyp_c)
        self.chars += len(ref_c)
        self.utterances += 1

    @property
    def wer(self) -> float:
        return self.word_errors / max(self.words, 1)

    @property
    def cer(self) -> float:
        return self.char_errors / max(self.chars, 1)
