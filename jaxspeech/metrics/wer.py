"""Word and character error rates: normalization, error types, confidence intervals.

Distances and alignments come from rapidfuzz's C++ Levenshtein over token sequences;
the tests check them against a plain dynamic-programming edit distance and against
jiwer's substitution / deletion / insertion counts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

# Punctuation: any character that is neither a word character, whitespace nor an
# apostrophe inside a word ("don't" keeps its apostrophe; 'quoted' loses its quotes).
_PUNCTUATION = re.compile(r"[^\w\s']|(?<!\w)'|'(?!\w)")


def edit_distance(ref: list | str, hyp: list | str) -> int:
    """Minimum substitutions + insertions + deletions turning ref into hyp."""
    return Levenshtein.distance(ref, hyp)


def edit_types(ref: Sequence | str, hyp: Sequence | str) -> tuple[int, int, int]:
    """(substitutions, deletions, insertions) of one minimum-cost alignment of ref to
    hyp; they sum to `edit_distance(ref, hyp)`."""
    subs = dels = ins = 0
    for op in Levenshtein.editops(ref, hyp):
        if op.tag == "replace":
            subs += 1
        elif op.tag == "delete":
            dels += 1
        else:
            ins += 1
    return subs, dels, ins


@dataclasses.dataclass(frozen=True)
class Normalizer:
    """Text normalization applied to reference and hypothesis alike before scoring.

    Whitespace always collapses to single spaces. `lowercase` folds case;
    `remove_punctuation` drops punctuation (apostrophes inside words stay); `mapping`
    replaces whole words after that (e.g. {"okay": "ok", "uh": ""}: "" deletes the word).
    """

    lowercase: bool = False
    remove_punctuation: bool = False
    mapping: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __call__(self, text: str) -> str:
        if self.lowercase:
            text = text.lower()
        if self.remove_punctuation:
            text = _PUNCTUATION.sub(" ", text)
        words = (self.mapping.get(w, w) for w in text.split())
        return " ".join(" ".join(w.split()) for w in words if w.strip())


def load_mapping(path: str) -> dict[str, str]:
    """A word mapping file: one `word<TAB>replacement` per line (an empty replacement
    deletes the word); blank lines and lines starting with # are skipped.

    Raises:
      ValueError: a line without a tab, or a word listed twice (with its line number).
    """
    mapping: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            if "\t" not in line:
                raise ValueError(f"{path}:{line_no}: expected `word<TAB>replacement`: {line!r}")
            word, replacement = line.split("\t", 1)
            if word in mapping:
                raise ValueError(f"{path}:{line_no}: {word!r} is mapped twice")
            mapping[word] = replacement.strip()
    return mapping


def score_utterance(ref: str, hyp: str) -> dict[str, int]:
    """One utterance's counts: words, word_errors, word_sub/del/ins, chars, char_errors,
    char_sub/del/ins. Words split on whitespace; characters count the single spaces
    between words."""
    ref_w, hyp_w = ref.split(), hyp.split()
    ref_c, hyp_c = " ".join(ref_w), " ".join(hyp_w)
    ws, wd, wi = edit_types(ref_w, hyp_w)
    cs, cd, ci = edit_types(ref_c, hyp_c)
    return {
        "words": len(ref_w),
        "word_errors": ws + wd + wi,
        "word_sub": ws,
        "word_del": wd,
        "word_ins": wi,
        "chars": len(ref_c),
        "char_errors": cs + cd + ci,
        "char_sub": cs,
        "char_del": cd,
        "char_ins": ci,
    }


@dataclasses.dataclass
class ErrorCounts:
    """Accumulated errors and reference lengths; WER/CER are ratios of the totals."""

    word_errors: int = 0
    words: int = 0
    char_errors: int = 0
    chars: int = 0
    utterances: int = 0
    word_sub: int = 0
    word_del: int = 0
    word_ins: int = 0
    char_sub: int = 0
    char_del: int = 0
    char_ins: int = 0

    def add(self, ref: str, hyp: str) -> dict[str, int]:
        """Score one utterance (`score_utterance`), add it, and return its counts."""
        scores = score_utterance(ref, hyp)
        for k, v in scores.items():
            setattr(self, k, getattr(self, k) + v)
        self.utterances += 1
        return scores

    def as_array(self) -> np.ndarray:
        """The fields in order, int64: what processes sum (`from_array` reads it back)."""
        return np.array(dataclasses.astuple(self), np.int64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> ErrorCounts:
        return cls(*(int(v) for v in values))

    @property
    def wer(self) -> float:
        return self.word_errors / max(self.words, 1)

    @property
    def cer(self) -> float:
        return self.char_errors / max(self.chars, 1)


def bootstrap_interval(
    errors: np.ndarray,
    lengths: np.ndarray,
    *,
    num_samples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of sum(errors) / sum(lengths) over utterances.

    errors, lengths: (N,) per-utterance error counts and reference lengths. Each of
    `num_samples` resamples draws N utterances with replacement (the utterance is the
    unit: errors within one are not independent); the interval is the central
    `confidence` mass of the resampled rates. (nan, nan) for N = 0.
    """
    errors, lengths = np.asarray(errors, np.float64), np.asarray(lengths, np.float64)
    n = errors.shape[0]
    if n == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    rates = np.empty(num_samples)
    # Chunks of resamples bound the (chunk, N) index array for large test sets.
    chunk = max(1, min(num_samples, 2**24 // n))
    for start in range(0, num_samples, chunk):
        idx = rng.integers(0, n, (min(chunk, num_samples - start), n))
        rates[start : start + idx.shape[0]] = errors[idx].sum(1) / np.maximum(
            lengths[idx].sum(1), 1.0
        )
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(rates, [tail, 100 - tail])
    return float(lo), float(hi)
