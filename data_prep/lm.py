"""Builds an n-gram word language model from transcripts and writes it as an ARPA file.

    python -m data_prep.lm --output lm.arpa [--order 3]
        (--text FILE[,FILE...] | --data DIR --split NAME)

Sentences come from text files (one per line, UTF-8) or from the transcripts of a split
written by ``data_prep.prepare``. Each is normalized as the tokenizer does (lowercase,
whitespace collapsed), split on spaces and wrapped as ``<s> w1 ... wn </s>``; lines that
normalize to nothing are skipped and counted. The report (sentences, skipped lines, words,
vocabulary, n-grams per order, discounts, seconds) is printed as one JSON line.

The model is interpolated modified Kneser-Ney (Chen & Goodman 1998), the scheme of KenLM's
``lmplz``: raw counts at the highest order, continuation counts (distinct left extensions)
below it except for n-grams that start with ``<s>``; three discounts per order from the
counts-of-counts; unigrams interpolated with the uniform distribution over the vocabulary
(``<unk>`` and ``</s>`` included, ``<s>`` excluded: it is never predicted, so its probability
is written as -99). The written probabilities are the interpolated ones and a context's
backoff weight is its interpolation weight, so standard ARPA backoff reproduces the
interpolated model exactly. The same input gives a byte-identical file.

Discount fallback: on a small corpus the counts-of-counts n1..n4 of an order can leave the
estimates undefined (a zero) or outside (0, k); that order then uses lmplz's
``--discount_fallback`` values (0.5, 1, 1.5) and a warning says so.

Why by hand: ``lmplz`` is a C++ binary that needs Boost and is not on PyPI, the ``kenlm``
Python module only queries models, and NLTK writes no ARPA. Query the result with
``kenlm.Model(path)``. Plain Python dicts: tens of thousands of sentences take seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

from absl import flags

from jaxspeech.common import files
from jaxspeech.data import reader as reader_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import normalize_text

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
MAX_ORDER = 6
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)  # lmplz --discount_fallback
LOG10_NEVER = -99.0  # ARPA's log10 probability of <s>, which is never predicted
READ_BLOCK = 1024  # records per read of a split
MAX_EXAMPLES = 5  # unreadable records named in the warning

Ngram = tuple[str, ...]
Counts = dict[int, dict[Ngram, int]]  # order -> n-gram -> count


class LMError(ValueError):
    """A mistake in the input or the request: an empty corpus, a bad order, bad text."""


@dataclasses.dataclass(frozen=True)
class LanguageModel:
    """An estimated backoff model.

    Attributes:
      order: the highest n-gram order N.
      ngrams: order -> n-gram -> (log10 probability, log10 backoff or None); a backoff
        only for n-grams of order < N that are the context of some (n+1)-gram.
      discounts: order -> (D1, D2, D3+) used.
      counts_of_counts: order -> (n1, n2, n3, n4) of the adjusted counts.
      fallback_orders: orders whose discounts are FALLBACK_DISCOUNTS.
    """

    order: int
    ngrams: dict[int, dict[Ngram, tuple[float, float | None]]]
    discounts: dict[int, tuple[float, float, float]]
    counts_of_counts: dict[int, tuple[int, int, int, int]]
    fallback_orders: tuple[int, ...]


@dataclasses.dataclass
class Unreadable:
    """Records of a split that could not be read or decoded: how many, and the first reasons."""

    count: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, n: int, reason: str) -> None:
        self.count += n
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(reason)


# ---------------------------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------------------------


def read_sentences_from_text(paths: Sequence[str]) -> Iterator[str]:
    """The lines of `paths` in order (UTF-8, one sentence a line, line ends dropped)."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            try:
                for line in f:
                    yield line.rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise LMError(f"{path} is not UTF-8 text ({e})") from e


def read_sentences_from_split(
    data_dir: str, split: str, unreadable: Unreadable | None = None
) -> Iterator[str]:
    """The raw transcripts of a prepared split, in record order.

    Records that cannot be read or decoded (and every record of a shard that cannot be
    opened) are skipped, counted into `unreadable` and summed up on stderr at the end.

    Raises:
      FileNotFoundError: the split is not prepared.
    """
    index = records.read_split_index(data_dir, split)
    bad = Unreadable() if unreadable is None else unreadable
    before = bad.count
    for path, expected in zip(index.shard_paths, index.shard_num_records):
        found, problem = reader_lib.shard_status(path, expected)
        if found is None or found < expected:
            bad.add(expected - (found or 0), f"{path}: {problem}")
        if found is None:
            continue
        reader = reader_lib.RecordReader([path], [min(found, expected)])
        for start in range(0, len(reader), READ_BLOCK):
            positions = list(range(start, min(len(reader), start + READ_BLOCK)))
            datas, faults, _ = reader.read(positions)
            errors = {f.position: f.error for f in faults}
            for position, data in zip(positions, datas):
                try:
                    if data is None:
                        raise ValueError(errors.get(position, "unreadable"))
                    text = records.decode_header(data)["text"]
                except ValueError as e:
                    bad.add(1, f"{path}[{position}]: {e}")
                    continue
                yield text
    if bad.count > before:
        print(
            f"warning: {bad.count - before} unreadable records of {data_dir}:{split} skipped; "
            + "; ".join(bad.examples),
            file=sys.stderr,
        )


# ---------------------------------------------------------------------------------------------
# Estimation
# ---------------------------------------------------------------------------------------------


def check_order(order: int) -> None:
    if not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise LMError(f"the order must be an integer from 1 to {MAX_ORDER}, got {order!r}")


def count_ngrams(sentences: Iterable[str], order: int) -> tuple[Counts, dict[str, int]]:
    """Raw n-gram counts of the normalized, ``<s>``/``</s>``-wrapped sentences.

    Returns:
      ({n: {n-gram tuple: count} for n in 1..order}, {sentences, skipped_empty, words}).

    Raises:
      LMError: a bad order, or a sentence holding the reserved word <s> or </s>.
    """
    check_order(order)
    counts = {n: collections.Counter() for n in range(1, order + 1)}
    stats = {"sentences": 0, "skipped_empty": 0, "words": 0}
    for line in sentences:
        words = normalize_text(line).split(" ")
        if words == [""]:
            stats["skipped_empty"] += 1
            continue
        if BOS in words or EOS in words:
            raise LMError(f"a sentence holds the reserved word {BOS} or {EOS}: {line!r}")
        stats["sentences"] += 1
        stats["words"] += len(words)
        tokens = (BOS, *words, EOS)
        for n, table in counts.items():
            table.update(zip(*(tokens[k:] for k in range(n))))  # the n-grams, at C speed
    return {n: dict(table) for n, table in counts.items()}, stats


def adjusted_counts(counts: Counts, order: int) -> Counts:
    """Kneser-Ney counts: raw at `order`; below it the number of distinct words seen just
    before the n-gram, except for n-grams starting with <s> (they have none: raw count)."""
    adjusted = {order: counts[order]}
    for n in range(order - 1, 0, -1):
        table: dict[Ngram, int] = {}
        for longer in counts[n + 1]:
            table[longer[1:]] = table.get(longer[1:], 0) + 1
        table.update((g, c) for g, c in counts[n].items() if g[0] == BOS)
        adjusted[n] = table
    return adjusted


def kn_discounts(n: Sequence[int]) -> tuple[float, float, float] | None:
    """(D1, D2, D3+) from counts-of-counts (n1, n2, n3, n4) (Chen & Goodman), or None when
    they leave one undefined or outside (0, k)."""
    n1, n2, n3, n4 = n
    if n1 == 0 or n2 == 0 or n3 == 0:
        return None
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    return d if all(0 < dk < k for k, dk in enumerate(d, 1)) else None


def _counts_of_counts(table: dict[Ngram, int]) -> tuple[int, int, int, int]:
    coc = [0, 0, 0, 0]
    for g, c in table.items():
        if c <= 4 and g != (BOS,):  # <s> as a unigram is never predicted
            coc[c - 1] += 1
    return tuple(coc)


def _unigrams(table: dict[Ngram, int], d: Sequence[float]) -> dict[Ngram, float]:
    """p(w): discounted counts plus the freed mass spread evenly over the vocabulary (every
    word but <s>, with <unk>)."""
    words = {g: c for g, c in table.items() if g != (BOS,)}
    words.setdefault((UNK,), 0)
    total = sum(words.values())
    n = collections.Counter(min(c, 3) for c in words.values())
    freed = (d[0] * n[1] + d[1] * n[2] + d[2] * n[3]) / total
    probs = {
        g: (c - d[min(c, 3) - 1] if c else 0.0) / total + freed / len(words)
        for g, c in words.items()
    }
    probs[(BOS,)] = 0.0
    return probs


def _interpolate(
    table: dict[Ngram, int], d: Sequence[float], lower: dict[Ngram, float]
) -> tuple[dict[Ngram, float], dict[Ngram, float]]:
    """p(w|h) of the n-grams hw of `table`, and gamma(h) of their contexts h."""
    rows: dict[Ngram, list[int]] = {}  # h -> [c(h.), N1(h.), N2(h.), N3+(h.)]: integers,
    for g, c in table.items():  # so the result does not depend on the sentence order
        row = rows.setdefault(g[:-1], [0, 0, 0, 0])
        row[0] += c
        row[min(c, 3)] += 1
    gamma = {h: (d[0] * n1 + d[1] * n2 + d[2] * n3) / t for h, (t, n1, n2, n3) in rows.items()}
    discount = (0.0, *d)
    probs = {}
    for g, c in table.items():  # the hot loop: no calls but the dict look-ups
        h = g[:-1]
        probs[g] = (c - discount[c if c < 3 else 3]) / rows[h][0] + gamma[h] * lower[g[1:]]
    return probs, gamma


def estimate(counts: Counts, order: int) -> LanguageModel:
    """Interpolated modified Kneser-Ney from raw counts (`count_ngrams`), as backoff model.

    Raises:
      LMError: a bad order, counts below `order` missing, or no sentence counted.
    """
    check_order(order)
    if any(n not in counts for n in range(1, order + 1)):
        raise LMError(f"counts for orders 1..{order} needed, got orders {sorted(counts)}")
    if not any(g != (BOS,) for g in counts[1]):
        raise LMError("no words to estimate a language model from")
    adjusted = adjusted_counts(counts, order)
    discounts, coc, fallback = {}, {}, []
    for n in range(1, order + 1):
        coc[n] = _counts_of_counts(adjusted[n])
        discounts[n] = kn_discounts(coc[n])
        if discounts[n] is None:
            discounts[n] = FALLBACK_DISCOUNTS
            fallback.append(n)
    probs = {1: _unigrams(adjusted[1], discounts[1])}
    gammas: dict[int, dict[Ngram, float]] = {}
    for n in range(2, order + 1):
        probs[n], gammas[n - 1] = _interpolate(adjusted[n], discounts[n], probs[n - 1])
    ngrams = {}
    for n, table in probs.items():
        bo = gammas.get(n, {})
        ngrams[n] = {
            g: (
                math.log10(p) if p > 0 else LOG10_NEVER,
                math.log10(bo[g]) if g in bo else None,
            )
            for g, p in table.items()
        }
    return LanguageModel(order, ngrams, discounts, coc, tuple(fallback))


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def arpa_lines(model: LanguageModel) -> Iterator[str]:
    """The ARPA text, line by line (with line ends); n-grams sorted by their text (as
    deterministic as by tuple, and faster), log10 values with 8 decimals."""
    yield "\\data\\\n"
    for n in range(1, model.order + 1):
        yield f"ngram {n}={len(model.ngrams[n])}\n"
    for n in range(1, model.order + 1):
        yield f"\n\\{n}-grams:\n"
        for text, logp, logbo in sorted((" ".join(g), *v) for g, v in model.ngrams[n].items()):
            tail = "" if logbo is None else f"\t{logbo:.8f}"
            yield f"{logp:.8f}\t{text}{tail}\n"
    yield "\n\\end\\\n"


def write_arpa(model: LanguageModel, path: str) -> None:
    """Writes `model` to `path` through a temporary file beside it: a killed run leaves
    the old file (or none), never half of one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with files.atomic_open(path) as f:
        f.writelines(arpa_lines(model))


def build_lm(sentences: Iterable[str], order: int, output: str) -> dict:
    """Counts, estimates and writes the model; warns on stderr for fallback discounts.

    Returns:
      {output, order, sentences, skipped_empty, words, vocabulary (distinct words, without
       <s>, </s>, <unk>), ngrams: {order: count}, discounts: {order: [D1, D2, D3+]},
       counts_of_counts: {order: [n1..n4]}, discount_fallback: [orders], seconds}.

    Raises:
      LMError: a bad order, or a corpus without words.
    """
    start = time.perf_counter()
    counts, stats = count_ngrams(sentences, order)
    if stats["words"] == 0:
        raise LMError(
            f"the corpus has no words ({stats['skipped_empty']} lines, all empty after "
            "normalization)"
        )
    model = estimate(counts, order)
    for n in model.fallback_orders:
        print(
            f"warning: {n}-gram counts-of-counts n1..n4 = {list(model.counts_of_counts[n])} "
            f"give no Kneser-Ney discounts in (0, k) (small or artificial data): using "
            f"{list(FALLBACK_DISCOUNTS)}",
            file=sys.stderr,
        )
    write_arpa(model, output)
    return {
        "output": output,
        "order": order,
        **stats,
        "vocabulary": sum(1 for g in counts[1] if g[0] not in (BOS, EOS, UNK)),
        "ngrams": {str(n): len(t) for n, t in model.ngrams.items()},
        "discounts": {str(n): [round(x, 6) for x in d] for n, d in model.discounts.items()},
        "counts_of_counts": {str(n): list(c) for n, c in model.counts_of_counts.items()},
        "discount_fallback": list(model.fallback_orders),
        "seconds": round(time.perf_counter() - start, 3),
    }


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _define_flags(fv: flags.FlagValues) -> None:
    d = {"flag_values": fv}
    flags.DEFINE_string("output", None, "The ARPA file to write.", **d)
    flags.DEFINE_integer("order", 3, f"The n-gram order, 1 to {MAX_ORDER}.", **d)
    flags.DEFINE_list("text", None, "Text files, one sentence a line (comma-separated).", **d)
    flags.DEFINE_string("data", None, "A directory written by data_prep.prepare.", **d)
    flags.DEFINE_string("split", None, "With --data: the split whose transcripts to use.", **d)


def _usage_error(message: str) -> int:
    """As `jaxspeech.common.cli.usage_error`, returned rather than exited (main runs in tests)."""
    print(f"error: bad command line: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: prints the report as one JSON line, or one ``error:`` line and
    returns 2."""
    argv = list(sys.argv if argv is None else argv)
    fv = flags.FlagValues()  # a fresh set per call: main may run many times in-process
    _define_flags(fv)
    if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]):
        print(__doc__)
        print(fv.get_help())
        return 0
    try:
        rest = fv(argv)
    except flags.Error as e:
        return _usage_error(str(e))
    if len(rest) > 1:
        return _usage_error(f"unexpected arguments: {rest[1:]}")
    if not fv.output:
        return _usage_error("--output is required")
    if bool(fv.text) == (fv.data is not None or fv.split is not None):
        return _usage_error(
            "give exactly one source: --text FILE[,FILE...] or --data DIR --split S"
        )
    if not fv.text and (fv.data is None or fv.split is None):
        return _usage_error("--data and --split go together")
    if not 1 <= fv.order <= MAX_ORDER:
        return _usage_error(f"--order must be from 1 to {MAX_ORDER}, got {fv.order}")
    unreadable = Unreadable()
    if fv.text:
        sentences = read_sentences_from_text(fv.text)
    else:
        sentences = read_sentences_from_split(fv.data, fv.split, unreadable)
    try:
        report = build_lm(sentences, fv.order, fv.output)
    except (ValueError, OSError) as e:  # LMError, a missing file or split, a bad index
        print(f"error: {e}", file=sys.stderr)
        return 2
    if fv.text is None:
        report["unreadable_records"] = unreadable.count
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
