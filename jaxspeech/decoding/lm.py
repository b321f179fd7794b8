"""Word n-gram language models for shallow fusion in beam search.

A hypothesis' fused score is

    log P_acoustic(y) + lm_weight * ln P_lm(words(y)) + word_bonus * |words(y)|

where a word is scored by the LM when the token that follows it starts a new word (a space
for character tokenizers, a piece beginning with "▁" for SentencePiece), and the last word
plus the end of sentence when the search finishes. The acoustic scores stay separate from
the LM scores in the searches, so the LM only reorders hypotheses.

`NgramLM` queries an ARPA (or KenLM binary) file through KenLM's Python module
(`pip install jaxspeech[lm]`; `python -m data_prep.lm` builds one from transcripts). The
searches themselves are ours (`decoding.ctc.ctc_prefix_beam_search`,
`decoding.rnnt_fusion`): pyctcdecode, the usual CTC+KenLM decoder, pins numpy < 2, which
jax 0.10 cannot run with, and no library fuses an n-gram LM into RNN-T beam search.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any, Protocol

from jaxspeech.common import storage
from jaxspeech.common.errors import UserError
from jaxspeech.data.tokenizer import BLANK_ID, UNK, UNK_ID, Tokenizer

LN10 = math.log(10.0)
_SPM_SPACE = "\u2581"  # SentencePiece's word-boundary marker


class WordLM(Protocol):
    """A word LM as the fusion needs it; states must be hashable."""

    def begin(self) -> Any:
        """The state at the start of a sentence (after <s>)."""

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        """(ln P(word | state), state after word)."""

    def end(self, state: Any) -> float:
        """ln P(</s> | state)."""


class NgramLM:
    """An n-gram LM file (ARPA or KenLM binary) queried with KenLM, natural-log scores.

    Raises:
      UserError: KenLM is not installed, or the file is missing or not a language model.
    """

    def __init__(self, path: str):
        try:
            import kenlm
        except ImportError as e:
            raise UserError(
                "LM fusion needs KenLM's Python module: pip install 'jaxspeech[lm]'"
            ) from e
        path = storage.local_file(path)  # s3://, gs://: KenLM reads local files only
        if not os.path.isfile(path):
            raise UserError(f"decoding.lm_path: no language model file at {path!r}")
        try:
            self._model = kenlm.Model(path)
        except UnicodeDecodeError as e:  # KenLM reads a file without its binary header as text
            raise UserError(
                f"decoding.lm_path: {path!r} is not an ARPA text file (it holds bytes that "
                "are not UTF-8 text) nor a KenLM binary"
            ) from e
        except (OSError, RuntimeError) as e:
            raise UserError(f"decoding.lm_path: {path!r} is not an ARPA/KenLM file: {e}") from e
        self._kenlm = kenlm
        self.path = path
        self.order = int(self._model.order)

    def begin(self) -> Any:
        state = self._kenlm.State()
        self._model.BeginSentenceWrite(state)
        return state

    def score(self, state: Any, word: str) -> tuple[float, Any]:
        out = self._kenlm.State()
        return self._model.BaseScore(state, word, out) * LN10, out

    def end(self, state: Any) -> float:
        return self._model.BaseScore(state, "</s>", self._kenlm.State()) * LN10


@dataclasses.dataclass(frozen=True)
class TokenWords:
    """How label ids spell words: `starts_word[i]` (id i begins a new word) and `text[i]`
    (what it adds to the current word). Blank adds nothing; a character tokenizer's space
    starts a word and adds nothing; <unk> adds "<unk>", which an LM scores as unknown."""

    starts_word: tuple[bool, ...]
    text: tuple[str, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> TokenWords:
        return cls.from_pieces(tokenizer.pieces, sentencepiece=tokenizer.kind != "char")

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], *, sentencepiece: bool) -> TokenWords:
        starts, text = [], []
        for i, piece in enumerate(pieces):
            if i == BLANK_ID:
                starts.append(False), text.append("")
            elif i == UNK_ID or piece == UNK:
                starts.append(False), text.append(UNK)
            elif sentencepiece:
                starts.append(piece.startswith(_SPM_SPACE))
                text.append(piece.lstrip(_SPM_SPACE))
            else:
                starts.append(piece == " ")
                text.append("" if piece == " " else piece)
        return cls(tuple(starts), tuple(text))


@dataclasses.dataclass(frozen=True)
class LMContext:
    """A hypothesis' LM side: the LM state after its complete words, the word being spelled,
    and the weighted LM score plus word bonuses so far (natural log)."""

    state: Any
    partial: str
    score: float


class Fusion:
    """Shallow fusion of `lm` with weight `lm_weight` and `word_bonus` per word, over the
    labels of `words`. Scores are cached per (state, word) during one search, so a beam's
    many hypotheses that share a history query the LM once.
    """

    def __init__(self, lm: WordLM, words: TokenWords, lm_weight: float, word_bonus: float):
        self.lm, self.words = lm, words
        self.lm_weight, self.word_bonus = float(lm_weight), float(word_bonus)
        self._cache: dict[tuple[Any, str], tuple[float, Any]] = {}

    def start(self) -> LMContext:
        """The context of an empty hypothesis. A search starts here, so the cache (of the
        previous utterance's histories) is emptied: it stays as big as one search needs."""
        self._cache.clear()
        return LMContext(self.lm.begin(), "", 0.0)

    def _word(self, ctx: LMContext) -> tuple[Any, float]:
        """Score ctx.partial as a complete word: (state after it, added fused score)."""
        if not ctx.partial:
            return ctx.state, 0.0
        key = (ctx.state, ctx.partial)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self.lm.score(ctx.state, ctx.partial)
        logp, state = hit
        return state, self.lm_weight * logp + self.word_bonus

    def extend(self, ctx: LMContext, token: int) -> LMContext:
        """The context after appending label `token` (not blank)."""
        text = self.words.text[token]
        if not self.words.starts_word[token]:
            return LMContext(ctx.state, ctx.partial + text, ctx.score)
        state, added = self._word(ctx)
        return LMContext(state, text, ctx.score + added)

    def word_done(self, ctx: LMContext) -> float:
        """The fused score of `ctx` once its current word is complete: what any label that
        starts a new word gives it (the new word's own score comes when it is complete)."""
        return ctx.score + self._word(ctx)[1]

    def finish(self, ctx: LMContext) -> float:
        """The whole hypothesis' fused LM score: its last word and the end of sentence."""
        state, added = self._word(ctx)
        return ctx.score + added + self.lm_weight * self.lm.end(state)


def fusion_from_config(decoding: Any, tokenizer: Tokenizer) -> Fusion | None:
    """config.decoding's LM (lm_path, lm_weight, word_bonus) over `tokenizer`'s labels, or
    None when lm_path is empty (or the config predates it).

    Raises:
      UserError: see `NgramLM`.
    """
    path = decoding.get("lm_path", "")
    if not path:
        return None
    return Fusion(
        NgramLM(path), TokenWords.from_tokenizer(tokenizer), decoding.lm_weight, decoding.word_bonus
    )
