"""Beam search with and without an n-gram LM on a trained run: WER/CER and search time.

`python benchmarks/lm_fusion.py --workdir runs/demo --data data/demo/shards [--head rnnt]`

1. Builds a word n-gram LM (`--order`, default 3) from the train split's transcripts with
   `data_prep.lm` (or takes `--lm`), and reports how many dev/test transcripts occur
   verbatim in the train split (an LM trained on them would know those sentences).
2. Runs the model once over every utterance of dev and test (`--head ctc`: the log-probs
   evaluation's ctc_beam uses; `rnnt`: the transducer's projected encodings) and scores,
   from the same outputs: greedy decoding (for rnnt: modified beam search of width 1, which
   is greedy search with the run's decoding.max_symbols_per_frame),
   beam search without LM, and with the LM for every (`--weights` x `--bonuses`) on dev;
   then test (and the other `--test_splits`) with the best dev setting (by `--select`:
   WER, or CER) and with the config's own. The rnnt searches
   are the fused host search (`decoding.rnnt_fusion`; weight 0 is the device search).
3. Prints a table and writes `benchmarks/results/lm_fusion.json` (`lm_fusion_rnnt.json`;
   `--output NAME`).

Scores use the evaluator's scorer and the run's scoring normalization, so the greedy row
equals `python -m jaxspeech.evaluate` on the same checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import types

import jax
import numpy as np

from data_prep import lm as lm_build
from jaxspeech.data import reader
from jaxspeech.data.tokenizer import normalize_text
from jaxspeech.decoding import ctc, search
from jaxspeech.decoding.lm import Fusion, NgramLM, TokenWords
from jaxspeech.decoding.rnnt_fusion import rnnt_beam_search_fused
from jaxspeech.evaluation import scoring
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.runs import loading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
BATCH = 16
PAD_SECONDS = 2.0  # batches are padded to a multiple of this: few compiled shapes


def outputs_of_split(
    run, data: str, split: str, head: str
) -> tuple[list[np.ndarray], list[str], float]:
    """Per utterance (T, V) CTC log-probs or (T, J) transducer encodings, the references
    and the split's audio seconds."""
    config = run.config.copy_and_resolve_references()
    # rnnt_beam with an LM path: the device half returns the encodings for the host search.
    config.decoding.method = "ctc_beam" if head == "ctc" else "rnnt_beam"
    config.decoding.lm_path = "" if head == "ctc" else "an.arpa"
    key = "logprobs" if head == "ctc" else "enc_proj"
    decode = search.make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id)
    recs = reader.read_split_records(data, split)
    audio = [reader.audio_float32(r) for r in recs]
    rate = recs[0]["sample_rate"]
    pad = int(PAD_SECONDS * rate)
    order = np.argsort([len(a) for a in audio])
    out: list[np.ndarray | None] = [None] * len(recs)
    with jax.set_mesh(run.spec.mesh):
        for start in range(0, len(order), BATCH):
            idx = order[start : start + BATCH]
            width = pad * math.ceil(max(len(audio[i]) for i in idx) / pad)
            batch = np.zeros((BATCH, width), np.float32)
            lens = np.zeros(BATCH, np.int32)
            for row, i in enumerate(idx):
                batch[row, : len(audio[i])], lens[row] = audio[i], len(audio[i])
            got = jax.device_get(decode(run.params, run.model_vars, batch, lens))
            for row, i in enumerate(idx):
                out[i] = got[key][row, : int(got["lengths"][row])]
    refs = [normalize_text(r["text"]) for r in recs]
    return out, refs, sum(len(a) for a in audio) / rate


def score(hyps: list[list[int]], refs: list[str], run, normalize) -> dict:
    counts = ErrorCounts()
    for ref, ids in zip(refs, hyps):
        counts.add(normalize(ref), normalize(run.tokenizer.decode(ids)))
    return {"wer": round(counts.wer, 5), "cer": round(counts.cer, 5)}


def decode_all(outputs, beam: int | None, fusion: Fusion | None, transducer=None) -> tuple:
    """Best label sequences and seconds; `transducer`: a `PredictorBeam` (rnnt head)."""
    t0 = time.perf_counter()
    logprobs = outputs
    if transducer is not None:
        fusion = fusion or Fusion(transducer.lm, transducer.words, 0.0, 0.0)
        hyps = [
            rnnt_beam_search_fused(
                x,
                len(x),
                transducer.model,
                fusion,
                beam=beam or 1,
                max_symbols_per_frame=transducer.max_symbols,
            )[0].tokens
            for x in outputs
        ]
    elif beam is None:
        hyps = [ctc.collapse(lp.argmax(-1)[None], np.array([len(lp)]))[0] for lp in logprobs]
    else:
        hyps = [
            ctc.ctc_prefix_beam_search(lp, len(lp), beam=beam, fusion=fusion)[0][0]
            for lp in logprobs
        ]
    return hyps, time.perf_counter() - t0


def overlap(data: str, split: str, train: set[str]) -> dict:
    """How many of the split's transcripts are in the train split verbatim, and the share
    of its words the train transcripts never use (out of the LM's vocabulary)."""
    texts = [normalize_text(r["text"]) for r in reader.read_split_records(data, split)]
    vocab = {w for t in train for w in t.split()}
    words = [w for t in texts for w in t.split()]
    return {
        "utterances": len(texts),
        "in_train": sum(t in train for t in texts),
        "oov_rate": round(sum(w not in vocab for w in words) / max(len(words), 1), 4),
    }


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--lm", help="an ARPA file (default: built from the train split)")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--head", choices=("ctc", "rnnt"), default="ctc")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--weights", default="0.1,0.2,0.3,0.45")
    ap.add_argument("--bonuses", default="0.5,1,2,3,4")
    ap.add_argument(
        "--select",
        choices=("wer", "cer"),
        default="wer",
        help="dev metric that picks the best setting (the other breaks ties)",
    )
    ap.add_argument(
        "--test_splits",
        default="test",
        help="comma-separated splits scored "
        "with the best dev setting and the config's, e.g. test,test_natural_clean",
    )
    ap.add_argument("--output", help="result file name (default: lm_fusion[_rnnt].json)")
    return ap.parse_args()


def main() -> None:
    args = _parse_args()
    tests = args.test_splits.split(",")

    result: dict = {
        "machine": environment.machine(),
        "beam": args.beam,
        "head": args.head,
    }
    lm_path = args.lm or os.path.join(args.workdir, "lm", f"train-{args.order}gram.arpa")
    if not args.lm:
        sentences = list(lm_build.read_sentences_from_split(args.data, "train"))
        result["lm_build"] = lm_build.build_lm(sentences, args.order, lm_path)
    result["lm"] = {"path": lm_path, "megabytes": round(os.path.getsize(lm_path) / 1e6, 2)}
    train = {normalize_text(s) for s in lm_build.read_sentences_from_split(args.data, "train")}
    result["verbatim_in_train"] = {s: overlap(args.data, s, train) for s in ("dev", *tests)}

    run = loading.load_run(args.workdir)
    normalize = scoring.normalizer_from_config(run.config)
    words = TokenWords.from_tokenizer(run.tokenizer)
    lm = NgramLM(lm_path)
    result["step"], rows = run.step, []
    splits = {s: outputs_of_split(run, args.data, s, args.head) for s in ("dev", *tests)}
    transducer = None
    if args.head == "rnnt":
        model = search.predictor_beam(
            run.spec.graphdef, run.params, run.model_vars, run.tokenizer.blank_id
        )
        max_symbols = int(run.config.decoding.max_symbols_per_frame)
        transducer = types.SimpleNamespace(model=model, lm=lm, words=words, max_symbols=max_symbols)

    def row(split, name, beam, weight=None, bonus=None):
        outputs, refs, seconds = splits[split]
        fusion = Fusion(lm, words, weight, bonus) if weight is not None else None
        hyps, secs = decode_all(outputs, beam, fusion, transducer)
        r = {"split": split, "decoder": name, "lm_weight": weight, "word_bonus": bonus}
        r |= score(hyps, refs, run, normalize) | {"search_rtf": round(secs / seconds, 4)}
        rows.append(r)
        print(json.dumps(r), flush=True)
        return r

    for split in ("dev", *tests):
        row(split, "greedy", None)
        row(split, f"beam {args.beam}", args.beam)
    grid = [
        row("dev", f"beam {args.beam} + LM", args.beam, float(w), float(b))
        for w in args.weights.split(",")
        for b in args.bonuses.split(",")
    ]
    other = {"wer": "cer", "cer": "wer"}[args.select]
    best = min(grid, key=lambda r: (r[args.select], r[other]))
    dec = run.config.decoding
    default = (dec.get("lm_weight", 0.5), dec.get("word_bonus", 1.0))
    for weight, bonus in dict.fromkeys([(best["lm_weight"], best["word_bonus"]), default]):
        for split in tests:
            row(split, f"beam {args.beam} + LM", args.beam, weight, bonus)
    result |= {"rows": rows, "selected_by": f"dev {args.select}"}
    result["best_dev"] = {k: best[k] for k in ("lm_weight", "word_bonus")}
    name = args.output or ("lm_fusion.json" if args.head == "ctc" else "lm_fusion_rnnt.json")
    results.write_json(os.path.join(RESULTS, name), result)
    print("| split | decoder | LM weight | word bonus | WER | CER | search RTF |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if r["split"] != "dev" or r["decoder"] != f"beam {args.beam} + LM" or r is best:
            w = "" if r["lm_weight"] is None else r["lm_weight"]
            b = "" if r["word_bonus"] is None else r["word_bonus"]
            print(
                f"| {r['split']} | {r['decoder']} | {w} | {b} | {r['wer']:.2%} | {r['cer']:.2%} "
                f"| {r['search_rtf']} |"
            )


if __name__ == "__main__":
    main()
