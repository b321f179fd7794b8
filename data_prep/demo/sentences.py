"""Deterministic English sentence generator for the synthetic demo corpus.

A small phrase-structure grammar over the word lists in `data_prep.demo.lexicon`: statements in
several tenses (with negation and contractions), yes/no and wh-questions, imperatives,
subordinate and relative clauses, comparisons, weather, and number/time/date phrases, all
with subject-verb agreement and correct irregular inflections.

Each `Sentence` carries two renderings of the same words:
  text:   the normalized transcript (lowercase a-z, apostrophe, single spaces);
  spoken: what espeak-ng reads: the same words with capitals and punctuation, which only
          shape prosody (pauses at commas, rising pitch on questions).

    gen = SentenceGenerator(seed=0)
    s = next(gen)   # Sentence(text="did you find the old key", spoken="Did you find the old key?")
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterator, Sequence

from data_prep.demo import lexicon

# Bump when the grammar or word lists change: recorded in corpus_info.json so a corpus
# can be traced to the generator that made it.
SENTENCES_VERSION = 1

MIN_WORDS = 4
MAX_WORDS = 16

_TEXT_RE = re.compile(r"[a-z']+( [a-z']+)*")
_PUNCT = frozenset({",", ".", "?", "!"})
# Tokens starting with this mark are proper nouns: capitalized in the spoken text only.
_PROPER = "^"


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence: `text` is the transcript, `spoken` the string espeak-ng reads."""

    text: str
    spoken: str

    @property
    def num_words(self) -> int:
        return self.text.count(" ") + 1


# ---------------------------------------------------------------------------------------
# Morphology
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Noun:
    sg: str
    pl: str | None  # None for mass nouns ("rice", "water").


@dataclasses.dataclass(frozen=True)
class Verb:
    base: str
    s: str  # third person singular present
    past: str
    pp: str  # past participle
    ing: str


_VOWELS = "aeiou"


def pluralize(word: str) -> str:
    """Regular English plural (box -> boxes, city -> cities, key -> keys, piano -> pianos)."""
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2] not in _VOWELS:
        return word[:-1] + "ies"
    return word + "s"


def _third_person(base: str) -> str:
    if base == "have":
        return "has"
    if base.endswith(("s", "x", "z", "ch", "sh")) or (
        base.endswith("o") and base[-2] not in _VOWELS
    ):
        return base + "es"  # goes, does, fixes, watches
    if base.endswith("y") and base[-2] not in _VOWELS:
        return base[:-1] + "ies"
    return base + "s"


def _regular_past(base: str, double: bool) -> str:
    if double:
        return base + base[-1] + "ed"
    if base.endswith("e"):
        return base + "d"
    if base.endswith("y") and base[-2] not in _VOWELS:
        return base[:-1] + "ied"
    return base + "ed"


def _present_participle(base: str, double: bool) -> str:
    if base.endswith("ie"):
        return base[:-2] + "ying"  # tie -> tying
    if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
        return base[:-1] + "ing"  # smile -> smiling; agree -> agreeing
    if double:
        return base + base[-1] + "ing"
    return base + "ing"


def _tokens(block: str) -> list[str]:
    """Whitespace-separated entries of a lexicon block, first occurrence order, no repeats."""
    return list(dict.fromkeys(block.split()))


def _nouns(block: str) -> list[Noun]:
    out = []
    for tok in _tokens(block):
        sg, _, pl = tok.partition(":")
        out.append(Noun(sg, pl or pluralize(sg)))
    return list({n.sg: n for n in out}.values())


def _mass_nouns(block: str) -> list[Noun]:
    return [Noun(w, None) for w in _tokens(block)]


def _verb_table() -> dict[str, Verb]:
    """All verbs of every lexicon list, keyed by base form, with all inflections resolved."""
    irregular: dict[str, tuple[str, str]] = {}
    double: set[str] = set()
    for tok in _tokens(lexicon.IRREGULAR_VERBS):
        base, past, pp = tok.split(":")
        if base.endswith("*"):
            base = base[:-1]
            double.add(base)
        irregular[base] = (past, pp)
    blocks = (
        lexicon.VERBS_THING,
        lexicon.VERBS_PERSON,
        lexicon.VERBS_INTRANSITIVE,
        lexicon.VERBS_MOTION,
        lexicon.VERBS_FOOD,
        lexicon.VERBS_SAY,
        lexicon.VERBS_INFINITIVE,
    )
    bases: list[str] = []
    for block in blocks:
        for tok in _tokens(block):
            if tok.endswith("*"):
                tok = tok[:-1]
                double.add(tok)
            bases.append(tok)
    table = {}
    for base in dict.fromkeys(bases):
        dbl = base in double
        past, pp = irregular.get(base, (None, None))
        if past is None:
            past = pp = _regular_past(base, dbl)
        table[base] = Verb(base, _third_person(base), past, pp, _present_participle(base, dbl))
    return table


def _verbs(block: str, table: dict[str, Verb]) -> list[Verb]:
    return [table[t.rstrip("*")] for t in _tokens(block)]


def _pairs(block: str) -> dict[str, str]:
    return dict(tok.split(":") for tok in _tokens(block))


def number_words(n: int) -> list[str]:
    """Cardinal number as words, 0 <= n < 1,000,000 (342 -> three hundred and forty two)."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number out of range: {n}")
    ones, teens, tens = (_tokens(b) for b in (lexicon.ONES, lexicon.TEENS, lexicon.TENS))

    def below_100(k: int) -> list[str]:
        if k < 10:
            return [ones[k]]
        if k < 20:
            return [teens[k - 10]]
        return [tens[k // 10 - 2]] + ([ones[k % 10]] if k % 10 else [])

    def below_1000(k: int) -> list[str]:
        if k < 100:
            return below_100(k)
        head = [ones[k // 100], "hundred"]
        return head + (["and"] + below_100(k % 100) if k % 100 else [])

    if n < 1000:
        return below_1000(n)
    head = below_1000(n // 1000) + ["thousand"]
    rest = n % 1000
    if rest == 0:
        return head
    return head + (["and"] if rest < 100 else []) + below_1000(rest)


def year_words(year: int) -> list[str]:
    """A year as spoken: 1984 -> nineteen eighty four, 1905 -> nineteen oh five."""
    if 2000 <= year < 2010:
        return ["two", "thousand"] + (["and"] + number_words(year - 2000) if year > 2000 else [])
    hi, lo = divmod(year, 100)
    if lo == 0:
        return number_words(hi) + ["hundred"]
    return number_words(hi) + (["oh"] + number_words(lo) if lo < 10 else number_words(lo))


def indefinite_article(word: str) -> str:
    """'a' or 'an' by the sound of `word` (an hour, a uniform, an apple)."""
    if word.startswith(("hour", "honest", "honor", "heir")):
        return "an"
    if word.startswith(("uni", "use", "usu", "uti", "eu", "one", "ewe")):
        return "a"
    return "an" if word[0] in _VOWELS else "a"


# ---------------------------------------------------------------------------------------
# The lexicon, parsed once at import
# ---------------------------------------------------------------------------------------

_VERBS = _verb_table()
PEOPLE = _nouns(lexicon.PEOPLE)
ANIMALS = _nouns(lexicon.ANIMALS)
THINGS = _nouns(lexicon.THINGS)
FOOD_COUNT = _nouns(lexicon.FOOD_COUNT)
FOOD_MASS = _mass_nouns(lexicon.FOOD_MASS)
PLACES = _nouns(lexicon.PLACES)
VEHICLES = _nouns(lexicon.VEHICLES)
ABSTRACT = _nouns(lexicon.ABSTRACT)
BODY = _nouns(lexicon.BODY)
NATURE = _nouns(lexicon.NATURE)
V_THING = _verbs(lexicon.VERBS_THING, _VERBS)
V_PERSON = _verbs(lexicon.VERBS_PERSON, _VERBS)
V_INTRANS = _verbs(lexicon.VERBS_INTRANSITIVE, _VERBS)
V_MOTION = _verbs(lexicon.VERBS_MOTION, _VERBS)
V_FOOD = _verbs(lexicon.VERBS_FOOD, _VERBS)
V_SAY = _verbs(lexicon.VERBS_SAY, _VERBS)
V_INF = _verbs(lexicon.VERBS_INFINITIVE, _VERBS)
ADJ_THING = _tokens(lexicon.ADJ_THING)
ADJ_PERSON = _tokens(lexicon.ADJ_PERSON)
ADJ_FOOD = _tokens(lexicon.ADJ_FOOD)
ADJ_WEATHER = _tokens(lexicon.ADJ_WEATHER)
COLORS = _tokens(lexicon.COLORS)
COMPARATIVES = _pairs(lexicon.COMPARATIVES)
ADV_MANNER = _tokens(lexicon.ADVERBS_MANNER)
ADV_FREQ = _tokens(lexicon.ADVERBS_FREQUENCY)
DEGREE = _tokens(lexicon.DEGREE)
NAMES = _tokens(lexicon.NAMES)
SURNAMES = _tokens(lexicon.SURNAMES)
CITIES = _tokens(lexicon.CITIES)
COUNTRIES = _tokens(lexicon.COUNTRIES)
DAYS = _tokens(lexicon.DAYS)
MONTHS = _tokens(lexicon.MONTHS)
ORDINALS = _tokens(lexicon.ORDINALS)
TIME_NOUNS = _tokens(lexicon.TIME_NOUNS)

# Verbs that sound wrong in progressive tenses ("she is knowing").
_STATIVE = frozenset(
    "want need like love hate prefer know believe understand seem appear recognize remember "
    "forget mean doubt suspect realize deserve afford fear assume wish hope own cost".split()
)
_MODALS = ("can", "could", "should", "must", "might", "may", "would")
_NEG = {
    "do": "don't",
    "does": "doesn't",
    "did": "didn't",
    "is": "isn't",
    "are": "aren't",
    "was": "wasn't",
    "were": "weren't",
    "have": "haven't",
    "has": "hasn't",
    "will": "won't",
    "can": "can't",
    "could": "couldn't",
    "should": "shouldn't",
    "would": "wouldn't",
    "must": "mustn't",
}
# Subject pronoun + auxiliary contractions ("she is" -> "she's").
_CONTRACT = {
    ("i", "am"): "i'm",
    ("you", "are"): "you're",
    ("we", "are"): "we're",
    ("they", "are"): "they're",
    ("he", "is"): "he's",
    ("she", "is"): "she's",
    ("it", "is"): "it's",
    ("i", "have"): "i've",
    ("you", "have"): "you've",
    ("we", "have"): "we've",
    ("they", "have"): "they've",
    **{(p, "will"): p + "'ll" for p in ("i", "you", "he", "she", "we", "they", "it")},
    **{(p, "would"): p + "'d" for p in ("i", "you", "he", "she", "we", "they")},
}
_OBJECT_PRONOUN = {"i": "me", "he": "him", "she": "her", "we": "us", "they": "them"}


# ---------------------------------------------------------------------------------------
# Grammar
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _NP:
    """A noun phrase as tokens, with the agreement features a verb needs."""

    tokens: tuple[str, ...]
    person: int = 3
    plural: bool = False
    pronoun: str | None = None  # set for subject pronouns (enables contractions)

    @property
    def third_sg(self) -> bool:
        return self.person == 3 and not self.plural


_PRONOUNS = (
    _NP(("i",), 1, False, "i"),
    _NP(("you",), 2, False, "you"),
    _NP(("he",), 3, False, "he"),
    _NP(("she",), 3, False, "she"),
    _NP(("we",), 1, True, "we"),
    _NP(("they",), 3, True, "they"),
)
_TENSE_TIME = {
    "past": "past",
    "prog_past": "past",
    "future": "future",
    "modal": "future",
    "present": "habit",
    "prog_present": "now",
    "perfect": "perfect",
}


class SentenceGenerator:
    """Yields distinct `Sentence`s of MIN_WORDS..MAX_WORDS words, deterministic in `seed`.

    Iterating yields an endless stream; no sentence text repeats within one generator, so
    consecutive slices of it are disjoint (the demo corpus takes its splits that way).
    """

    def __init__(self, seed: int):
        # A string seed goes through SHA-512 in CPython: stable across versions and
        # decorrelated from the other random streams the corpus derives from `seed`.
        self._rng = random.Random(f"jaxspeech-sentences-{seed}")
        self._seen: set[str] = set()
        weights = {
            self._s_thing: 12,
            self._s_person: 7,
            self._s_motion: 7,
            self._s_food: 6,
            self._s_intransitive: 6,
            self._s_say: 6,
            self._s_infinitive: 6,
            self._s_be: 7,
            self._s_weather: 2,
            self._s_there: 4,
            self._s_yes_no: 8,
            self._s_wh: 8,
            self._s_imperative: 5,
            self._s_complex: 9,
            self._s_relative: 4,
            self._s_number: 6,
            self._s_comparative: 3,
            self._s_exclamation: 1,
        }
        self._templates = list(weights)
        self._weights = list(weights.values())

    def __iter__(self) -> Iterator[Sentence]:
        return self

    def __next__(self) -> Sentence:
        for _ in range(10_000):
            template = self._rng.choices(self._templates, self._weights)[0]
            sentence = _render(template())
            if MIN_WORDS <= sentence.num_words <= MAX_WORDS and sentence.text not in self._seen:
                self._seen.add(sentence.text)
                return sentence
        raise RuntimeError("sentence generator could not find a new sentence")

    def take(self, n: int) -> list[Sentence]:
        """The next `n` sentences."""
        return [next(self) for _ in range(n)]

    # --- small helpers -----------------------------------------------------------------

    def _p(self, prob: float) -> bool:
        return self._rng.random() < prob

    def _pick(self, seq: Sequence):
        return seq[self._rng.randrange(len(seq))]

    def _number(self, lo: int, hi: int) -> list[str]:
        return number_words(self._rng.randint(lo, hi))

    def _adjs(self, pool: Sequence[str], prob: float) -> list[str]:
        if not self._p(prob):
            return []
        first = self._pick(pool)
        if self._p(0.15):
            color = self._pick(COLORS)
            if color != first:
                return [first, color]
        return [first]

    def _with_det(self, noun: Noun, plural: bool, adjs: list[str]) -> list[str]:
        word = noun.pl if plural else noun.sg
        r = self._rng.random()
        if plural:
            if r < 0.3:
                det = ["the"]
            elif r < 0.5:
                det = [self._pick(("my", "your", "his", "her", "our", "their"))]
            elif r < 0.65:
                det = [self._pick(("these", "those", "some", "many", "several", "both"))]
            elif r < 0.75:
                det = [_PROPER + self._pick(NAMES) + "'s"]
            else:
                det = self._number(2, 20)
        else:
            if r < 0.35:
                det = ["the"]
            elif r < 0.6:
                det = [indefinite_article((adjs + [word])[0])]
            elif r < 0.8:
                det = [self._pick(("my", "your", "his", "her", "our", "their"))]
            elif r < 0.9:
                det = [self._pick(("this", "that", "another", "every"))]
            else:
                det = [_PROPER + self._pick(NAMES) + "'s"]
        return det + adjs + [word]

    def _name(self) -> list[str]:
        r = self._rng.random()
        if r < 0.65:
            return [_PROPER + self._pick(NAMES)]
        if r < 0.8:
            return [_PROPER + self._pick(NAMES), _PROPER + self._pick(SURNAMES)]
        title = self._pick(("doctor", "mister", "professor", "captain", "officer", "judge"))
        return [title, _PROPER + self._pick(SURNAMES)]

    # --- noun phrases ------------------------------------------------------------------

    def _subject(self, pronoun_prob: float = 0.3) -> _NP:
        r = self._rng.random()
        if r < pronoun_prob:
            return self._pick(_PRONOUNS)
        r = self._rng.random()
        if r < 0.3:
            return _NP(tuple(self._name()))
        if r < 0.38:
            names = [_PROPER + self._pick(NAMES), "and", _PROPER + self._pick(NAMES)]
            return _NP(tuple(names), 3, True)
        plural = self._p(0.3)
        pool = PEOPLE if self._p(0.8) else ANIMALS
        noun = self._pick(pool)
        adjs = self._adjs(ADJ_PERSON if pool is PEOPLE else ADJ_THING + COLORS, 0.3)
        toks = self._with_det(noun, plural, adjs)
        if self._p(0.08):
            toks += ["from", _PROPER + self._pick(CITIES + COUNTRIES)]
        return _NP(tuple(toks), 3, plural)

    def _person_object(self) -> list[str]:
        r = self._rng.random()
        if r < 0.2:
            return [self._pick(("me", "you", "him", "her", "us", "them"))]
        if r < 0.5:
            return self._name()
        noun = self._pick(PEOPLE if self._p(0.85) else ANIMALS)
        return self._with_det(noun, self._p(0.25), self._adjs(ADJ_PERSON, 0.25))

    def _thing(self, plural: bool | None = None) -> list[str]:
        pool = THINGS if self._p(0.75) else self._pick((VEHICLES, NATURE, ANIMALS, THINGS))
        noun = self._pick(pool)
        if plural is None:
            plural = self._p(0.3)
        return self._with_det(noun, plural, self._adjs(ADJ_THING + COLORS, 0.4))

    def _food(self) -> list[str]:
        if self._p(0.45):
            noun = self._pick(FOOD_MASS)
            det = self._pick((["some"], ["the"], ["more"], ["a", "lot", "of"], ["my"], []))
            return det + self._adjs(ADJ_FOOD, 0.35) + [noun.sg]
        return self._with_det(self._pick(FOOD_COUNT), self._p(0.45), self._adjs(ADJ_FOOD, 0.35))

    def _place_noun(self) -> list[str]:
        noun = self._pick(PLACES)
        return ["the"] + self._adjs(ADJ_THING, 0.25) + [noun.sg]

    def _place_pp(self) -> list[str]:
        if self._p(0.2):
            return [self._pick(("in", "near", "outside")), _PROPER + self._pick(CITIES + COUNTRIES)]
        prep = self._pick(("in", "at", "near", "behind", "outside", "inside", "beside", "by"))
        if self._p(0.1):
            prep = self._pick((["next", "to"], ["on", "the", "way", "to"], ["across", "from"]))
            return prep + self._place_noun()
        return [prep] + self._place_noun()

    def _destination(self) -> list[str]:
        r = self._rng.random()
        if r < 0.6:
            return [self._pick(("to", "to", "into", "toward", "past", "across"))] + (
                self._place_noun()
            )
        if r < 0.9:
            return ["to", _PROPER + self._pick(CITIES + COUNTRIES)]
        return [self._pick(("home", "downstairs", "upstairs", "outside", "back", "away"))]

    # --- time phrases ------------------------------------------------------------------

    def _clock(self) -> list[str]:
        hour = self._number(1, 12)
        r = self._rng.random()
        if r < 0.3:
            return ["at"] + hour + ["o'clock"]
        if r < 0.5:
            return ["at", self._pick(("half", "quarter")), "past"] + hour
        if r < 0.6:
            return ["at", "quarter", "to"] + hour
        if r < 0.9:
            minutes = self._rng.choice((10, 15, 20, 25, 30, 35, 40, 45, 50, 55))
            return ["at"] + hour + number_words(minutes)
        return ["at", self._pick(("noon", "midnight", "dawn", "sunset"))]

    def _time(self, kind: str) -> list[str]:
        r = self._rng.random()
        day = _PROPER + self._pick(DAYS)
        month = _PROPER + self._pick(MONTHS)
        if r < 0.12:
            return self._clock()
        if r < 0.22:
            return self._pick((["on", day], ["in", month], ["on", day, "morning"]))
        if kind == "past":
            return self._pick(
                (
                    ["yesterday"],
                    ["last", self._pick(("night", "week", "month", "year", "summer", "winter"))],
                    ["last", day],
                    self._number(2, 12)
                    + [self._pick(("days", "weeks", "months", "years", "minutes", "hours"))]
                    + ["ago"],
                    ["this", self._pick(("morning", "afternoon", "evening"))],
                    ["the", "day", "before", "yesterday"],
                    ["earlier", "today"],
                    ["after", self._pick(("lunch", "dinner", "breakfast", "school", "work"))],
                    ["during", "the", self._pick(("storm", "holiday", "meeting", "concert"))],
                    ["in"] + year_words(self._rng.randint(1905, 2029)),
                )
            )
        if kind == "future":
            return self._pick(
                (
                    ["tomorrow"],
                    ["tomorrow", self._pick(("morning", "afternoon", "evening", "night"))],
                    ["next", self._pick(("week", "month", "year", "summer", "weekend"))],
                    ["next", day],
                    ["tonight"],
                    ["later", "today"],
                    ["in"]
                    + self._number(2, 12)
                    + [self._pick(("days", "weeks", "months", "minutes", "hours"))],
                    ["soon"],
                    ["after", self._pick(("lunch", "dinner", "school", "work", "the", "party"))],
                    ["before", "the", self._pick(("end", "start")), "of", "the", "month"],
                )
            )
        if kind == "habit":
            return self._pick(
                (
                    ["every", self._pick(TIME_NOUNS[:6] + ["day", "summer"])],
                    ["every", day],
                    ["on", day + "s"],
                    ["in", "the", self._pick(("morning", "afternoon", "evening"))],
                    ["at", "night"],
                    [self._pick(("once", "twice")), "a", self._pick(("week", "month", "day"))],
                    ["at", "the", "weekend"],
                    ["in", "the", self._pick(("summer", "winter", "spring", "autumn"))],
                )
            )
        if kind == "now":
            return self._pick(
                (
                    ["right", "now"],
                    ["at", "the", "moment"],
                    ["today"],
                    ["this", self._pick(("morning", "afternoon", "evening", "week"))],
                )
            )
        return self._pick(  # perfect
            (
                ["already"],
                ["this", self._pick(("week", "month", "year", "morning"))],
                ["since", day],
                ["for"] + self._number(2, 30) + [self._pick(("years", "days", "weeks", "hours"))],
                ["twice", "today"],
                ["recently"],
            )
        )

    # --- verb groups -------------------------------------------------------------------

    def _tense(self, allow_prog: bool = True) -> str:
        tenses = ["past", "past", "past", "present", "present", "future", "perfect", "modal"]
        if allow_prog:
            tenses += ["prog_present", "prog_past"]
        return self._pick(tenses)

    def _finite(self, subj: _NP, verb: Verb, tense: str, neg: bool = False) -> list[str]:
        """Subject + verb group, with agreement, negation and optional contraction."""
        if tense.startswith("prog") and verb.base in _STATIVE:
            tense = "past" if tense == "prog_past" else "present"
        if tense == "past":
            group = ["did", verb.base] if neg else [verb.past]
        elif tense == "present":
            if neg:
                group = ["does" if subj.third_sg else "do", verb.base]
            else:
                group = [verb.s if subj.third_sg else verb.base]
        elif tense == "future":
            group = ["will", verb.base] if self._p(0.8) else [*self._be(subj, "present"), "going"]
            if group[-1] == "going":
                group += ["to", verb.base]
        elif tense == "perfect":
            group = ["has" if subj.third_sg else "have", verb.pp]
        elif tense == "prog_present":
            group = [*self._be(subj, "present"), verb.ing]
        elif tense == "prog_past":
            group = [*self._be(subj, "past"), verb.ing]
        else:
            group = [self._pick(_MODALS), verb.base]
        return self._join(subj, group, neg)

    def _be(self, subj: _NP, tense: str) -> list[str]:
        if tense == "past":
            return ["was" if subj.third_sg or subj.pronoun == "i" else "were"]
        if tense == "future":
            return ["will", "be"]
        if tense == "perfect":
            return ["has" if subj.third_sg else "have", "been"]
        if subj.pronoun == "i":
            return ["am"]
        return ["is" if subj.third_sg else "are"]

    def _join(self, subj: _NP, group: list[str], neg: bool) -> list[str]:
        aux, rest = group[0], group[1:]
        if neg and rest:
            if aux in _NEG and self._p(0.75):
                return [*subj.tokens, _NEG[aux], *rest]
            return [*subj.tokens, aux, "not", *rest]
        if neg:  # a bare verb cannot be negated; fall back to "never" with the same verb
            return [*subj.tokens, "never", aux]
        if subj.pronoun and (subj.pronoun, aux) in _CONTRACT and self._p(0.4):
            return [_CONTRACT[(subj.pronoun, aux)], *rest]
        return [*subj.tokens, *group]

    def _time_tail(self, tense: str, prob: float) -> list[str]:
        return self._time(_TENSE_TIME[tense]) if self._p(prob) else []

    # --- clauses -----------------------------------------------------------------------

    def _clause(self, tense: str | None = None, subj: _NP | None = None) -> list[str]:
        """A short declarative clause without final punctuation."""
        tense = tense or self._tense()
        subj = subj or self._subject()
        neg = self._p(0.12)
        r = self._rng.random()
        if r < 0.3:
            return self._finite(subj, self._pick(V_THING), tense, neg) + self._thing()
        if r < 0.45:
            return self._finite(subj, self._pick(V_PERSON), tense, neg) + self._person_object()
        if r < 0.6:
            return self._finite(subj, self._pick(V_MOTION), tense, neg) + self._destination()
        if r < 0.72:
            return self._finite(subj, self._pick(V_FOOD), tense, neg) + self._food()
        if r < 0.85:
            tail = [self._pick(ADV_MANNER)] if self._p(0.4) else []
            return self._finite(subj, self._pick(V_INTRANS), tense, neg) + tail
        be_tense = tense if tense in ("past", "future", "perfect") else "present"
        return self._join(subj, self._be(subj, be_tense), neg) + self._adj_phrase(ADJ_PERSON)

    def _adj_phrase(self, pool: Sequence[str]) -> list[str]:
        return ([self._pick(DEGREE)] if self._p(0.35) else []) + [self._pick(pool)]

    def _base_vp(self) -> list[str]:
        """An infinitive verb phrase without 'to' ("paint the old fence")."""
        r = self._rng.random()
        if r < 0.4:
            return [self._pick(V_THING).base] + self._thing()
        if r < 0.6:
            return [self._pick(V_PERSON).base] + self._person_object()
        if r < 0.8:
            return [self._pick(V_MOTION).base] + self._destination()
        return [self._pick(V_FOOD).base] + self._food()

    # --- sentence templates (each returns tokens including final punctuation) ----------

    def _s_thing(self) -> list[str]:
        tense = self._tense()
        toks = self._finite(self._subject(), self._pick(V_THING), tense, self._p(0.12))
        toks += self._thing()
        if self._p(0.35):
            toks += self._place_pp()
        if self._p(0.15):
            toks.append(self._pick(ADV_MANNER))
        return toks + self._time_tail(tense, 0.3) + ["."]

    def _s_person(self) -> list[str]:
        tense = self._tense()
        toks = self._finite(self._subject(), self._pick(V_PERSON), tense, self._p(0.12))
        toks += self._person_object()
        if self._p(0.3):
            toks += self._place_pp()
        return toks + self._time_tail(tense, 0.4) + ["."]

    def _s_motion(self) -> list[str]:
        tense = self._tense()
        subj = self._subject()
        verb = self._pick(V_MOTION)
        toks = self._finite(subj, verb, tense, self._p(0.1))
        if self._p(0.25):
            toks.append(self._pick(ADV_MANNER))
        toks += self._destination()
        if verb.base in ("drive", "go", "come", "travel", "return", "ride") and self._p(0.4):
            toks += ["by", self._pick(VEHICLES).sg]
        return toks + self._time_tail(tense, 0.45) + ["."]

    def _s_food(self) -> list[str]:
        tense = self._tense()
        toks = self._finite(self._subject(), self._pick(V_FOOD), tense, self._p(0.1))
        toks += self._food()
        if self._p(0.35):
            toks += ["for", self._pick(("breakfast", "lunch", "dinner", "dessert", "supper"))]
        return toks + self._time_tail(tense, 0.3) + ["."]

    def _s_intransitive(self) -> list[str]:
        tense = self._tense()
        subj = self._subject()
        toks = []
        if tense == "present" and self._p(0.4):
            # Frequency adverbs sit between subject and verb: "she often laughs".
            toks = list(subj.tokens) + [self._pick(ADV_FREQ)]
            verb = self._pick(V_INTRANS)
            toks.append(verb.s if subj.third_sg else verb.base)
        else:
            toks = self._finite(subj, self._pick(V_INTRANS), tense, self._p(0.12))
        if self._p(0.45):
            toks.append(self._pick(ADV_MANNER))
        if self._p(0.35):
            toks += self._place_pp()
        return toks + self._time_tail(tense, 0.35) + ["."]

    def _s_say(self) -> list[str]:
        tense = self._pick(("past", "past", "present", "perfect"))
        toks = self._finite(self._subject(0.4), self._pick(V_SAY), tense)
        if self._p(0.5):
            toks.append("that")
        inner = "past" if tense == "past" else self._tense(allow_prog=True)
        return toks + self._clause(inner) + ["."]

    def _s_infinitive(self) -> list[str]:
        tense = self._pick(("past", "past", "present", "perfect", "future"))
        toks = self._finite(self._subject(), self._pick(V_INF), tense, self._p(0.15))
        return toks + ["to"] + self._base_vp() + self._time_tail(tense, 0.25) + ["."]

    def _s_be(self) -> list[str]:
        tense = self._pick(("past", "past", "present", "present", "future", "perfect"))
        neg = self._p(0.12)
        r = self._rng.random()
        if r < 0.45:
            subj = self._subject(0.4)
            toks = self._join(subj, self._be(subj, tense), neg) + self._adj_phrase(ADJ_PERSON)
        elif r < 0.8:
            plural = self._p(0.3)
            subj = _NP(tuple(self._thing(plural)), 3, plural)
            toks = self._join(subj, self._be(subj, tense), neg)
            toks += self._adj_phrase(ADJ_THING + COLORS)
        else:
            noun = self._pick(FOOD_MASS + FOOD_COUNT)
            plural = noun.pl is not None and self._p(0.5)
            word = noun.pl if plural else noun.sg
            subj = _NP(("the", word), 3, plural)
            toks = self._join(subj, self._be(subj, tense), neg) + self._adj_phrase(ADJ_FOOD)
        if self._p(0.25):
            toks += self._place_pp()
        return toks + self._time_tail(tense, 0.2) + ["."]

    def _s_weather(self) -> list[str]:
        r = self._rng.random()
        adj = self._adj_phrase(ADJ_WEATHER)
        where = (["in", _PROPER + self._pick(CITIES)]) if self._p(0.5) else []
        if r < 0.35:
            return ["it", "was"] + adj + where + self._time("past") + ["."]
        if r < 0.6:
            return ["it", "will", "be"] + adj + where + self._time("future") + ["."]
        if r < 0.8:
            return ["the", "weather", "is", "usually"] + adj + where + self._time("habit") + ["."]
        return ["it's"] + adj + ["and", self._pick(ADJ_WEATHER)] + where + ["today", "."]

    def _s_there(self) -> list[str]:
        past = self._p(0.5)
        plural = self._p(0.45)
        be = ("were" if plural else "was") if past else ("are" if plural else "is")
        neg = self._p(0.15)
        if plural:
            pool = self._pick((THINGS, ANIMALS, PEOPLE, FOOD_COUNT, VEHICLES))
            noun = self._pick(pool)
            quant = ["any"] if neg else self._pick((self._number(2, 99), ["some"], ["many"]))
            np = quant + self._adjs(ADJ_THING + COLORS, 0.3) + [noun.pl]
        else:
            noun = self._pick(self._pick((THINGS, ANIMALS, PEOPLE, VEHICLES, NATURE)))
            adjs = self._adjs(ADJ_THING + COLORS, 0.4)
            np = [indefinite_article((adjs + [noun.sg])[0])] + adjs + [noun.sg]
        verb = [be + "n't"] if neg else [be]
        where = self._place_pp() if self._p(0.8) else []
        time = self._time("past") if past and self._p(0.3) else []
        return ["there"] + verb + np + where + time + ["."]

    def _s_yes_no(self) -> list[str]:
        subj = self._subject(0.45)
        r = self._rng.random()
        if r < 0.55:
            tense = self._pick(("past", "present", "future", "perfect", "modal", "prog_present"))
            verb_pool = self._pick((V_THING, V_PERSON, V_MOTION, V_FOOD, V_INTRANS))
            verb = self._pick(verb_pool)
            if tense == "prog_present" and verb.base in _STATIVE:
                tense = "present"
            aux, form = {
                "past": ("did", verb.base),
                "present": ("does" if subj.third_sg else "do", verb.base),
                "future": ("will", verb.base),
                "perfect": ("has" if subj.third_sg else "have", verb.pp),
                "modal": (self._pick(("can", "could", "should", "would", "must")), verb.base),
                "prog_present": (self._be(subj, "present")[0], verb.ing),
            }[tense]
            toks = [aux, *subj.tokens]
            if tense == "perfect" and self._p(0.4):
                toks.append("ever")
            toks.append(form)
            if verb_pool is V_THING:
                toks += self._thing()
            elif verb_pool is V_PERSON:
                toks += self._person_object()
            elif verb_pool is V_MOTION:
                toks += self._destination()
            elif verb_pool is V_FOOD:
                toks += self._food()
            elif self._p(0.4):
                toks.append(self._pick(ADV_MANNER))
            return toks + self._time_tail(tense, 0.25) + ["?"]
        tense = self._pick(("past", "present"))
        be = self._be(subj, tense)[0]
        if r < 0.8:
            return [be, *subj.tokens] + self._adj_phrase(ADJ_PERSON) + ["?"]
        plural = self._p(0.3)
        thing = _NP(tuple(self._thing(plural)), 3, plural)
        be = self._be(thing, tense)[0]
        return [be, *thing.tokens] + self._adj_phrase(ADJ_THING + COLORS) + ["?"]

    def _s_wh(self) -> list[str]:
        subj = self._subject(0.5)
        tense = self._pick(("past", "past", "present", "future"))
        aux = {"past": "did", "present": "does" if subj.third_sg else "do", "future": "will"}[tense]
        r = self._rng.random()
        if r < 0.3:
            wh = self._pick(("where", "when", "why", "how"))
            verb_pool, make_object = self._pick(
                ((V_THING, self._thing), (V_FOOD, self._food), (V_PERSON, self._person_object))
            )
            obj = make_object()
            return [wh, aux, *subj.tokens, self._pick(verb_pool).base, *obj, "?"]
        if r < 0.45:
            verb = self._pick(V_THING + V_FOOD)
            return ["what", aux, *subj.tokens, verb.base] + self._time_tail(tense, 0.3) + ["?"]
        if r < 0.55:
            return ["who", aux, *subj.tokens, self._pick(V_PERSON).base, "?"]
        if r < 0.67:
            return ["who", self._pick(V_THING).past] + self._thing() + ["?"]
        if r < 0.77:
            noun = self._pick(self._pick((THINGS, FOOD_COUNT, ANIMALS)))
            verb = self._pick(V_THING + V_FOOD)
            return ["how", "many", noun.pl, aux, *subj.tokens, verb.base, "?"]
        if r < 0.85:
            noun = self._pick(THINGS + VEHICLES)
            verb = self._pick(V_THING)
            return ["which", noun.sg, aux, *subj.tokens, verb.base, "?"]
        if r < 0.9:
            place = self._pick(PLACES).sg
            return ["what", "time", "does", "the", place, self._pick(("open", "close")), "?"]
        if r < 0.95:
            a, b = self._pick(CITIES), self._pick(CITIES)
            return ["how", "far", "is", _PROPER + a, "from", _PROPER + b, "?"]
        noun = self._pick(THINGS)
        return ["whose", noun.sg, "is", self._pick(("this", "that")), "?"]

    def _s_imperative(self) -> list[str]:
        r = self._rng.random()
        if r < 0.3:
            return ["please"] + self._base_vp() + (self._place_pp() if self._p(0.3) else []) + ["."]
        if r < 0.45:
            return (
                ["don't", "forget", "to"] + self._base_vp() + self._time_tail("future", 0.5) + ["."]
            )
        if r < 0.6:
            return ["let's"] + self._base_vp() + self._time_tail("future", 0.4) + ["."]
        if r < 0.75:
            verb = self._pick(V_THING)
            return ["never", verb.base, *self._thing(), *self._place_pp(), "."]
        if r < 0.9:
            return self._base_vp() + [self._pick(ADV_MANNER), "."]
        return ["remember", "to"] + self._base_vp() + ["."]

    def _s_complex(self) -> list[str]:
        r = self._rng.random()
        if r < 0.1:
            # Conditional: present in the if-clause, future in the main clause.
            cond = ["if"] + self._clause("present")
            main = self._clause("future")
            return cond + [","] + main + ["."] if self._p(0.6) else main + cond + ["."]
        tense = "present" if r < 0.3 else "past"
        conj = self._pick(
            (
                "because",
                "but",
                "so",
                "although",
                "while",
                "when",
                "after",
                "before",
                "until",
                "since",
                "and",
                "unless",
                "as",
            )
        )
        first, second = self._clause(tense), self._clause(tense)
        if conj in ("although", "while", "when", "after", "before", "since", "as") and self._p(0.4):
            return [conj] + second + [","] + first + ["."]
        return first + [","] + [conj] + second + ["."]

    def _s_relative(self) -> list[str]:
        r = self._rng.random()
        if r < 0.35:
            noun = self._pick(PEOPLE)
            rel = ["the", noun.sg, "who", self._pick(V_THING).past] + self._thing()
            tense = self._pick(("past", "present"))
            subj = _NP(tuple(rel), 3, False)
            return (
                self._join(subj, self._be(subj, tense), False)
                + self._adj_phrase(ADJ_PERSON)
                + ["."]
            )
        if r < 0.65:
            noun = self._pick(THINGS + VEHICLES)
            inner = self._subject(0.5)
            rel = ["the", noun.sg, "that"] + self._finite(inner, self._pick(V_THING), "past")
            subj = _NP(tuple(rel), 3, False)
            return (
                self._join(subj, self._be(subj, "past"), False)
                + self._adj_phrase(ADJ_THING + COLORS)
                + ["."]
            )
        if r < 0.85:
            noun = self._pick(PEOPLE)
            verb = self._pick(("lives", "works", "grew", "studies", "teaches", "stayed"))
            place = ["in", _PROPER + self._pick(CITIES + COUNTRIES)]
            subj = self._subject(0.6)
            know = self._finite(subj, _VERBS["know"], "present")
            verb_words = [verb, "up"] if verb == "grew" else [verb]
            art = indefinite_article(noun.sg)
            return know + [art, noun.sg, "who", *verb_words, *place, "."]
        place = self._pick(PLACES)
        subj = self._subject(0.5)
        return (
            ["this", "is", "the", place.sg, "where"]
            + self._finite(subj, self._pick(V_THING + V_PERSON), "past")
            + (self._thing() if self._p(0.6) else self._person_object())
            + ["."]
        )

    def _s_number(self) -> list[str]:
        r = self._rng.random()
        subj = self._subject()
        if r < 0.2:
            noun = self._pick(THINGS + FOOD_COUNT)
            toks = self._finite(subj, _VERBS["buy"], "past") + self._number(2, 60) + [noun.pl]
            return toks + ["for"] + self._number(2, 999) + ["dollars", "."]
        if r < 0.35:
            what = self._pick(("train", "bus", "ferry", "plane", "boat"))
            return (
                ["the", what, "to", _PROPER + self._pick(CITIES)]
                + [self._pick(("leaves", "arrives", "departs"))]
                + self._clock()
                + ["."]
            )
        if r < 0.47:
            year = year_words(self._rng.randint(1920, 2020))
            return self._join(subj, self._be(subj, "past"), False) + ["born", "in", *year, "."]
        if r < 0.6:
            noun = self._pick(PEOPLE + ANIMALS + THINGS)
            return (
                ["there", self._pick(("are", "were")), *self._number(2, 999), noun.pl]
                + self._place_pp()
                + ["."]
            )
        if r < 0.7:
            thing = self._pick(THINGS)
            cents = self._rng.randint(1, 99)
            return (
                ["the", thing.sg, "costs", *self._number(1, 500), "dollars", "and"]
                + number_words(cents)
                + ["cents", "."]
            )
        if r < 0.8:
            return [
                "the",
                self._pick(("office", "apartment", "room", "classroom", "studio")),
                "is",
                "on",
                "the",
                self._pick(ORDINALS),
                "floor",
                ".",
            ]
        if r < 0.9:
            return (
                self._finite(subj, self._pick(V_MOTION), "past")
                + self._number(2, 900)
                + [self._pick(("miles", "kilometers", "meters", "steps"))]
                + ["to", "the", self._pick(PLACES).sg, "."]
            )
        ordinal = self._pick(ORDINALS + ["twenty", "thirtieth", "thirty", "twenty"])
        day = [ordinal] if ordinal.endswith(("th", "st", "nd", "rd")) else None
        if day is None:  # "twenty first", "thirty first"
            day = [ordinal, self._pick(("first", "second", "third", "fourth", "fifth"))]
            if ordinal == "thirty":
                day = ["thirty", "first"]
        return (
            ["the", self._pick(ABSTRACT).sg, "is", "on", "the"]
            + day
            + ["of", _PROPER + self._pick(MONTHS), "."]
        )

    def _s_comparative(self) -> list[str]:
        adj, comp = self._pick(list(COMPARATIVES.items()))
        tense = self._pick(("present", "past"))
        r = self._rng.random()
        if r < 0.5:
            noun = self._pick(THINGS + ANIMALS + VEHICLES)
            a = _NP(tuple(self._with_det(noun, False, [])), 3, False)
            other = self._pick((["that", "one"], ["mine"], ["yours"], ["the", "old", "one"]))
            degree = [self._pick(("much", "far", "slightly"))] if self._p(0.3) else []
            return [*a.tokens, *self._be(a, tense), *degree, comp, "than", *other, "."]
        if r < 0.8:
            subj = self._subject(0.4)
            other = self._name()
            return self._join(subj, self._be(subj, tense), False) + [comp, "than"] + other + ["."]
        a, b = self._pick(CITIES), self._pick(CITIES)
        return [_PROPER + a, self._be(_NP(("x",)), tense)[0], comp, "than", _PROPER + b, "."]

    def _s_exclamation(self) -> list[str]:
        noun = self._pick(THINGS + PLACES + ANIMALS)
        adj = self._pick(ADJ_THING)
        return ["what", indefinite_article(adj), adj, noun.sg, "!"]


def _render(tokens: list[str]) -> Sentence:
    """Tokens (words, `^`-marked proper nouns, punctuation) -> transcript and spoken text."""
    words: list[str] = []
    spoken: list[str] = []
    for tok in tokens:
        if tok in _PUNCT:
            if spoken and spoken[-1][-1] not in ",.?!":
                spoken[-1] += tok
            continue
        if tok.startswith(_PROPER):
            tok = tok[1:]
            shown = tok[0].upper() + tok[1:]
        elif tok == "i" or tok.startswith("i'"):
            shown = "I" + tok[1:]
        else:
            shown = tok
        words.append(tok)
        spoken.append(shown)
    if spoken:
        spoken[0] = spoken[0][0].upper() + spoken[0][1:]
    text = " ".join(words)
    if not _TEXT_RE.fullmatch(text):
        raise ValueError(f"generated transcript is not normalized: {text!r}")
    return Sentence(text=text, spoken=" ".join(spoken))
