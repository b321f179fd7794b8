"""Tests of text normalization and the char / SentencePiece tokenizers."""

from __future__ import annotations

import random

import pytest

from jaxspeech.data.tokenizer import (
    BLANK,
    UNK,
    Tokenizer,
    normalize_text,
    train_char_tokenizer,
    train_sentencepiece_tokenizer,
)

WORDS = (
    "the quick brown fox jumps over lazy dog speech recognition model audio train data "
    "shard record beam pipeline token blank label frame batch"
).split()


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """600 sentences of 4-12 words, some with stray case and whitespace."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(600)]
    return [t.upper() if i % 7 == 0 else f"  {t}\t" for i, t in enumerate(texts)]


def test_normalize_text():
    assert normalize_text("  Hello \t  WORLD\n ") == "hello world"
    assert normalize_text("\n\t ") == ""
    assert normalize_text("Ünïcode  Ça") == "ünïcode ça"


def test_char_round_trip_and_vocab(corpus):
    tok = train_char_tokenizer(corpus)
    chars = sorted(set("".join(normalize_text(t) for t in corpus)))
    assert tok.pieces == [BLANK, UNK, *chars] and " " in chars
    assert tok.vocab_size == len(chars) + 2
    assert tok.blank_id == 0 and tok.unk_id == 1
    for text in corpus[:50]:
        ids = tok.encode(text)
        assert tok.blank_id not in ids and tok.count_unk(ids) == 0
        assert tok.decode(ids) == normalize_text(text)


def test_char_unknown_characters_are_counted_and_never_decoded():
    tok = train_char_tokenizer(["abc"])
    ids = tok.encode("a!b?Z")  # "z" (lowercased) is unknown too.
    assert ids == [2, tok.unk_id, 3, tok.unk_id, tok.unk_id]
    assert tok.count_unk(ids) == 3
    assert tok.decode(ids) == "ab"
    assert tok.decode([0, 2, 0, 0, 3, 1, 4]) == "abc"  # Blanks and <unk> have no spelling.
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_sentencepiece_round_trip(corpus, model_type, tmp_path):
    tok = train_sentencepiece_tokenizer(corpus, model_type=model_type, vocab_size=40)
    assert tok.kind == "sentencepiece" and tok.model_type == model_type
    assert tok.vocab_size == 40 and tok.pieces[:2] == [BLANK, UNK]
    for text in corpus[:50]:
        ids = tok.encode(text)
        assert ids and min(ids) >= 1 and max(ids) < 40  # Never the blank.
        assert tok.count_unk(ids) == 0
        assert tok.decode(ids) == normalize_text(text)
    ids = tok.encode("the quick ~ fox")
    assert tok.count_unk(ids) == 1
    assert "⁇" not in tok.decode(ids) and tok.decode(ids).replace(" ", "") == "thequickfox"
    tok.save(str(tmp_path))
    loaded = Tokenizer.load(str(tmp_path))
    assert loaded == tok and loaded.encode(corpus[3]) == tok.encode(corpus[3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.model", "tokenizer.json"]


def test_char_save_load_equality(corpus, tmp_path):
    tok = train_char_tokenizer(corpus)
    tok.save(str(tmp_path / "tok"))
    loaded = Tokenizer.load(str(tmp_path / "tok"))
    assert loaded == tok and loaded.vocab_size == tok.vocab_size
    assert loaded.encode("blank label") == tok.encode("blank label")
    assert loaded != train_char_tokenizer(["xyz"])


def test_sentencepiece_errors(corpus):
    with pytest.raises(ValueError, match="model_type"):
        train_sentencepiece_tokenizer(corpus, model_type="word")
    with pytest.raises(ValueError, match="vocab_size=5000"):
        train_sentencepiece_tokenizer(corpus, model_type="unigram", vocab_size=5000)
    with pytest.raises(ValueError, match="no"):
        train_sentencepiece_tokenizer(["  ", ""], model_type="bpe", vocab_size=10)


def test_load_missing_tokenizer_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        Tokenizer.load(str(tmp_path))
