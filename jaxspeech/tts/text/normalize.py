"""Written English as the demo's synthesizer is made to speak it and its tokenizer spells it.

`normalize(sentence)` turns a sentence of ordinary prose into (text, spoken): `text` the
transcript in the demo tokenizer's alphabet (lower-case a-z, apostrophe, single spaces),
`spoken` the same words with the sentence's commas, a capital and a full stop, which is
what espeak-ng is given. Numbers, ordinals, years, currency and common abbreviations are
written out first, so espeak-ng reads the words of the transcript and nothing else (it
would read "1851" and "Mr." its own way). A sentence that cannot be written in the
alphabet (foreign letters, symbols, digits in identifiers) is refused with the reason.
"""

from __future__ import annotations

import re
import unicodedata

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen"
).split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
ORDINAL_ENDINGS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
# Abbreviations with a full stop that does not end the sentence, as spoken.
ABBREVIATIONS = {
    "mr": "mister",
    "mrs": "missus",
    "dr": "doctor",
    "st": "saint",
    "capt": "captain",
    "col": "colonel",
    "gen": "general",
    "gov": "governor",
    "sen": "senator",
    "rev": "reverend",
    "jr": "junior",
    "sr": "senior",
    "vs": "versus",
    "etc": "et cetera",
}
SYMBOLS = {"&": " and ", "%": " percent "}
_NUMBER = re.compile(r"\$?\d[\d,]*(?:st|nd|rd|th)?\b")
_ABBREVIATION = re.compile(r"\b(" + "|".join(ABBREVIATIONS) + r")\.", re.IGNORECASE)
_ALLOWED = re.compile(r"^[a-z' ]+$")


def spell_int(n: int) -> str:
    """Cardinal words of 0 <= n < 10**9: 1851 -> 'one thousand eight hundred fifty one'."""
    if not 0 <= n < 10**9:
        raise ValueError(f"spell_int covers 0 .. 10**9 - 1, got {n}")
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + spell_int(rest))
    for size, name in ((10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return spell_int(n // size) + f" {name}" + ("" if rest == 0 else " " + spell_int(rest))
    raise AssertionError("unreachable")


def spell_ordinal(n: int) -> str:
    """21 -> 'twenty first', 100 -> 'one hundredth'."""
    words = spell_int(n).split()
    last = words[-1]
    if last in ORDINAL_ENDINGS:
        words[-1] = ORDINAL_ENDINGS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def spell_year(n: int) -> str:
    """A year as read aloud: 1851 -> 'eighteen fifty one', 1900 -> 'nineteen hundred',
    1905 -> 'nineteen oh five', 2008 -> 'two thousand eight'."""
    if 2000 <= n < 2010 or not 1100 <= n < 2100:
        return spell_int(n)
    high, low = divmod(n, 100)
    if low == 0:
        return spell_int(high) + " hundred"
    return spell_int(high) + (" oh " + ONES[low] if low < 10 else " " + spell_int(low))


def _number_words(token: str) -> str:
    """A number token of `_NUMBER` in words."""
    dollars = token.startswith("$")
    digits = token.lstrip("$")
    ordinal = digits[-2:] in ("st", "nd", "rd", "th")
    digits = digits[:-2] if ordinal else digits
    if "," in digits and not re.fullmatch(r"\d{1,3}(,\d{3})+", digits):
        raise ValueError(f"cannot read the number {token!r}")
    n = int(digits.replace(",", ""))
    if n >= 10**9:
        raise ValueError(f"cannot read the number {token!r}")
    if ordinal:
        return spell_ordinal(n)
    is_year = len(digits) == 4 and "," not in digits and not dollars
    words = spell_year(n) if is_year else spell_int(n)
    return words + (" dollars" if dollars else "")


def normalize(sentence: str) -> tuple[str, str]:
    """(text, spoken) of one sentence of prose.

    Raises:
      ValueError: the sentence cannot be written in the alphabet (the reason says why).
    """
    s = unicodedata.normalize("NFKC", sentence)
    s = s.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"')
    s = s.replace("\u201d", '"').replace("\u2014", ", ").replace("\u2013", " ")
    s = _ABBREVIATION.sub(lambda m: ABBREVIATIONS[m.group(1).lower()], s)
    for symbol, words in SYMBOLS.items():
        s = s.replace(symbol, words)
    s = _NUMBER.sub(lambda m: " " + _number_words(m.group(0)) + " ", s)
    s = re.sub(r"(?<=\w)-(?=\w)", " ", s)  # hyphenated words are two
    s = re.sub(r"[\"()\[\]_*]", " ", s)
    s = re.sub(r"\s*[;:]\s*", ", ", s)
    s = re.sub(r"\s+", " ", s).strip(" ,.!?")
    spoken_words = re.sub(r"\s*,\s*", ", ", s).strip(", ")
    text = re.sub(r"[,.!?]", " ", spoken_words.lower())
    text = re.sub(r"(^| )'+|'+( |$)", " ", text)  # quotes, not apostrophes
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        raise ValueError("no words")
    bad = sorted({c for c in text if not _ALLOWED.match(c)})
    if bad:
        raise ValueError(f"characters outside the alphabet: {''.join(bad)!r}")
    spoken = re.sub(r"[.!?]", ",", spoken_words)
    spoken = re.sub(r"(^| )'+|'+(,| |$)", r"\1\2", spoken)
    spoken = re.sub(r"\s*,[\s,]*", ", ", spoken)  # "there?, avast" -> "there, avast"
    return text, spoken[:1].upper() + spoken[1:].rstrip(", ") + "."
