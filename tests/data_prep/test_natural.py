"""The demo's natural-text test splits: the text normalizer, the stored sentences, and the
synthesized clean and noisy splits (jaxspeech/tts/text/normalize.py, make_texts.py,
natural.py)."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import soundfile as sf

from data_prep.demo import make_texts, natural, synth
from jaxspeech.tts.text.normalize import normalize, spell_int, spell_ordinal, spell_year

# Hand-checked readings (not computed by the code under test).
CARDINALS = {
    0: "zero",
    13: "thirteen",
    40: "forty",
    99: "ninety nine",
    100: "one hundred",
    101: "one hundred one",
    1000: "one thousand",
    1200: "one thousand two hundred",
    20_019: "twenty thousand nineteen",
    3_000_000: "three million",
    123_456_789: "one hundred twenty three million four hundred fifty six thousand seven "
    "hundred eighty nine",
}


@pytest.mark.parametrize("n,words", sorted(CARDINALS.items()))
def test_spell_int(n, words):
    assert spell_int(n) == words


def test_ordinals_and_years():
    assert [spell_ordinal(n) for n in (1, 2, 3, 5, 12, 20, 21, 100)] == [
        "first",
        "second",
        "third",
        "fifth",
        "twelfth",
        "twentieth",
        "twenty first",
        "one hundredth",
    ]
    assert spell_year(1851) == "eighteen fifty one"
    assert spell_year(1900) == "nineteen hundred"
    assert spell_year(1905) == "nineteen oh five"
    assert spell_year(2008) == "two thousand eight"
    assert spell_year(2016) == "twenty sixteen"
    with pytest.raises(ValueError):
        spell_int(10**9)


def test_normalize_writes_out_what_the_synthesizer_would_read_its_own_way():
    text, spoken = normalize("In 1851, Mr. Starbuck paid $1,200 to Dr. Bunger; the 21st time!")
    assert text == (
        "in eighteen fifty one mister starbuck paid one thousand two hundred dollars to "
        "doctor bunger the twenty first time"
    )
    assert spoken.startswith("In eighteen fifty one, mister Starbuck") and spoken.endswith(".")
    assert normalize("\u2018Tis the whale-ship\u2019s boat \u2014 and 5% & more.")[0] == (
        "tis the whale ship's boat and five percent and more"
    )
    assert normalize("Is it there?\u2014avast!")[1] == "Is it there, avast."
    for bad, reason in (("Caf\u00e9 noir.", "outside the alphabet"), ("...", "no words")):
        with pytest.raises(ValueError, match=reason):
            normalize(bad)
    with pytest.raises(ValueError, match="cannot read the number"):
        normalize("Call 12,34 now.")


def test_sentences_split_at_their_ends_not_after_abbreviations():
    prose = "Call me Ishmael. Mr. Starbuck said \u201cNo!\u201d Then he left?  Yes."
    assert make_texts.sentences_of(prose) == [
        "Call me Ishmael.",
        "Mr. Starbuck said \u201cNo!\u201d",
        "Then he left?",
        "Yes.",
    ]
    kept = make_texts.usable(["One two three four five.", "Too short.", "One two three four five."])
    assert kept == [("one two three four five", "One two three four five.")]


@pytest.mark.parametrize("path", [make_texts.MOBY_DICK, make_texts.SOTU])
def test_the_stored_sentences_are_normalized_and_distinct(path):
    sentences = make_texts.read_sentences(path)
    texts = [t for t, _ in sentences]
    assert len(texts) == len(set(texts)) >= 500
    for text, spoken in sentences:
        assert normalize(spoken)[0] == text, (text, spoken)  # written out already
        assert not re.search(r",\s*,", spoken), spoken
        assert 5 <= len(text.split()) <= 16
    if path == make_texts.SOTU:  # no initials, dotted abbreviations or lone letters
        assert not any(re.search(r"(^| )[b-hj-np-z]( |$)", t) for t in texts)


def test_no_test_sentence_is_trained_on():
    """The natural-text test splits' sentences are in no split of the demo corpus, and no
    dev or test sentence is a training sentence, at the default natural share and at 1."""
    moby = {t for t, _ in make_texts.read_sentences(make_texts.MOBY_DICK)}
    sotu = {t for t, _ in make_texts.read_sentences(make_texts.SOTU)}
    assert not moby & sotu
    for share in (0.5, 1.0):
        skipped = {}
        plan = synth.plan_corpus(3.0, 0, share, skipped)
        train = [u.text for u in plan if u.split == "train"]
        held_out = {u.text for u in plan if u.split != "train"}
        assert len(set(train)) == len(train) and not held_out & set(train)
        assert not moby & (set(train) | held_out)
        natural_share = sum(t in sotu for t in train) / len(train)
        assert abs(natural_share - share) < 0.05, natural_share
        assert skipped["too_long"] > 0 and skipped["held_out"] == 0
        # The natural sentences fit the longest bucket at the speaker's slowest rate.
        for u in plan:
            if u.text in sotu:
                assert synth.estimate_duration(u.text, u.rate) + 0.4 <= synth.MAX_NATURAL_S
    # Dev and test do not depend on the share.
    at = {s: [u for u in synth.plan_corpus(3.0, 0, s) if u.split != "train"] for s in (0, 1)}
    assert at[0] == at[1]


def test_a_held_out_natural_sentence_is_skipped_and_counted():
    natural_sentences = synth.NaturalSentences(0, held_out=set())
    first = natural_sentences.next_for(175)
    again = synth.NaturalSentences(0, held_out={first.text})
    assert again.next_for(175) != first and again.skipped["held_out"] == 1


def test_natural_order_keeps_the_first_block_as_the_3000_sentence_file_had_it():
    # Every corpus built while texts/sotu.txt held 3,000 sentences stays byte-identical: the
    # first block is shuffled by the same stream, which then draws the same `choose`s.
    pool = [(f"s{i}", f"S{i}.") for i in range(2 * synth.NATURAL_BLOCK + 5)]
    old = random.Random("x")
    first = pool[: synth.NATURAL_BLOCK]
    old.shuffle(first)
    new = random.Random("x")
    order = synth.natural_order(pool, new, seed=0)
    assert order[: synth.NATURAL_BLOCK] == first
    assert new.random() == old.random()
    assert sorted(order) == sorted(pool)  # each sentence once
    later = order[synth.NATURAL_BLOCK : 2 * synth.NATURAL_BLOCK]
    assert sorted(later) == sorted(pool[synth.NATURAL_BLOCK : 2 * synth.NATURAL_BLOCK])
    assert later != pool[synth.NATURAL_BLOCK : 2 * synth.NATURAL_BLOCK]  # shuffled too
    assert order == synth.natural_order(pool, random.Random("x"), seed=0)


def test_natural_splits_are_the_same_speech_clean_and_noisy(tmp_path):
    counts = natural.build(str(tmp_path), utterances=8, seed=0, workers=1)
    assert counts == {natural.CLEAN: 8, natural.NOISY: 8}
    rows = {
        split: [json.loads(line) for line in open(tmp_path / split / "manifest.jsonl")]
        for split in (natural.CLEAN, natural.NOISY)
    }
    clean, noisy = rows[natural.CLEAN], rows[natural.NOISY]
    assert [r["text"] for r in clean] == [r["text"] for r in noisy]
    # Both carry the clean audio's phoneme timing, ending with the audio.
    for key in ("phonemes", "phoneme_ends"):
        assert [r[key] for r in clean] == [r[key] for r in noisy]
    assert all(r["phoneme_ends"][-1] == r["duration"] for r in clean)
    trained = {s.name for s in synth.SPEAKERS}
    assert len({r["speaker"] for r in clean}) == 8 and not {r["speaker"] for r in clean} & trained
    for c, n in zip(clean, noisy):
        x, rate = sf.read(tmp_path / natural.CLEAN / c["audio_filepath"], dtype="float64")
        y, _ = sf.read(tmp_path / natural.NOISY / n["audio_filepath"], dtype="float64")
        assert rate == 16000 and len(x) == len(y) == round(c["duration"] * 16000)
        snr = 10 * np.log10(np.mean(x**2) / np.mean((y - x) ** 2))
        assert 15.0 <= n["snr_db"] <= 25.0 and n["noise"] in natural.NOISES
        assert abs(snr - n["snr_db"]) < 0.2, (snr, n["snr_db"])  # int16 rounding only
    with pytest.raises(FileExistsError, match="exists; remove it first"):
        natural.build(str(tmp_path), utterances=8)
