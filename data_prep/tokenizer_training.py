"""The split's tokenizer: a bounded, deterministic sample of its normalized transcripts, and
the char or SentencePiece tokenizer trained on it."""

from __future__ import annotations

import heapq
import zlib
from typing import Any

import apache_beam as beam

from data_prep.config import PrepConfig
from data_prep.readers.common import PrepareError
from jaxspeech.data.tokenizer import (
    BLANK,
    UNK,
    Tokenizer,
    train_sentencepiece_tokenizer,
)


class TranscriptSampleFn(beam.CombineFn):
    """(id, normalized text) -> every character seen, and a deterministic sample of at most
    k texts (those with the smallest crc32 of the id): exact for the char tokenizer, bounded
    memory for SentencePiece."""

    def __init__(self, max_sentences: int):
        self._k = max_sentences

    def create_accumulator(self) -> tuple[set[str], list[tuple[int, str, str]], int]:
        return set(), [], 0

    def _prune(self, sample: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
        return heapq.nsmallest(self._k, sample) if len(sample) > 2 * self._k else sample

    def add_input(self, acc: Any, x: tuple[str, str]) -> Any:
        chars, sample, n = acc
        chars.update(x[1])
        sample.append((zlib.crc32(x[0].encode("utf-8")), x[0], x[1]))
        return chars, self._prune(sample), n + 1

    def merge_accumulators(self, accs: Any) -> Any:
        chars, sample, n = set(), [], 0
        for c, s, m in accs:
            chars |= c
            sample = self._prune(sample + s)
            n += m
        return chars, sample, n

    def extract_output(self, acc: Any) -> dict[str, Any]:
        chars, sample, n = acc
        texts = [text for _, _, text in heapq.nsmallest(self._k, sample)]
        return {"chars": sorted(chars), "texts": texts, "num_texts": n}


def train_tokenizer(cfg: PrepConfig, texts: dict[str, Any]) -> Tokenizer:
    """The ``--tokenizer`` trained on TranscriptSampleFn's output.

    Raises:
      PrepareError: SentencePiece cannot train this ``--vocab_size`` on these texts.
    """
    if cfg.tokenizer == "char":
        return Tokenizer(kind="char", vocab=[BLANK, UNK, *texts["chars"]])
    try:
        return train_sentencepiece_tokenizer(
            texts["texts"], model_type=cfg.tokenizer, vocab_size=cfg.vocab_size
        )
    except ValueError as e:
        raise PrepareError(f"{e}; try a smaller --vocab_size") from e
