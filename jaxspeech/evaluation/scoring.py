"""Decode and score one split: WER/CER with bootstrap intervals, per-utterance rows, and
the result files in RUN/eval/.

`evaluate_split` (with `search.make_decode_fn`) is what training's periodic evaluation,
the evaluation CLI and the checkpoint watcher call."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import jax
import numpy as np
from ml_collections import ConfigDict

from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import search
from jaxspeech.evaluation import splits
from jaxspeech.metrics.wer import ErrorCounts, Normalizer, bootstrap_interval, load_mapping
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import faults


# ---------------------------------------------------------------- scoring
def normalizer_from_config(config: ConfigDict) -> Normalizer:
    """config.scoring's text normalization (none for runs that predate the key).

    Raises:
      UserError: scoring.mapping_file is missing or malformed.
    """
    sc = config.get("scoring")
    if sc is None:
        return Normalizer()
    mapping = {}
    if sc.mapping_file:
        try:
            mapping = load_mapping(sc.mapping_file)
        except (OSError, ValueError) as e:
            raise UserError(f"scoring.mapping_file: {e}") from e
    return Normalizer(sc.lowercase, sc.remove_punctuation, mapping)


def summarize_utterances(rows: list[dict], config: ConfigDict) -> dict:
    """Confidence intervals and the worst utterances from every scored utterance's row
    (`metrics.wer.score_utterance` counts plus id, ref, hyp)."""
    sc = config.get("scoring")
    samples = 1000 if sc is None else int(sc.bootstrap_samples)
    worst = 5 if sc is None else int(sc.worst)
    out: dict = {}
    if samples > 0:
        for rate, errors, length in (
            ("wer", "word_errors", "words"),
            ("cer", "char_errors", "chars"),
        ):
            lo, hi = bootstrap_interval(
                np.array([r[errors] for r in rows]),
                np.array([r[length] for r in rows]),
                num_samples=samples,
                seed=config.seed,
            )
            out[f"{rate}_ci95"] = [round(lo, 5), round(hi, 5)]
    ranked = sorted(rows, key=lambda r: (-r["word_errors"], -r["char_errors"], r["id"]))
    out["worst"] = [
        {k: r[k] for k in ("id", "ref", "hyp", "word_errors", "words")} for r in ranked[:worst]
    ]
    return out


def _eval_pipeline(
    config: ConfigDict,
    mesh,
    index: records.SplitIndex,
    data_dir: str,
    split: str,
    tokenizer_dir: str,
) -> pipeline_lib.Pipeline:
    """One pass over every utterance of the split (its `index`), in order, with text and
    ids, batched for `mesh` (`splits.split_buckets`)."""
    spec = splits.split_buckets(config, mesh, index)
    return pipeline_lib.make_pipeline(
        data_dir=data_dir,
        split=split,
        tokenizer_dir=tokenizer_dir,
        spec=spec,
        **build.loader_settings(config, train=False),
    )


def _stream_decoder(
    config: ConfigDict,
    searcher: search.Searcher,
    params: dict,
    model_vars: dict,
    tokenizer: Tokenizer,
    index: records.SplitIndex,
) -> search.StreamDecoder | None:
    """With decoding.streaming, the stream decoder for utterances up to the split's
    longest; else None."""
    if not config.decoding.get("streaming", False):
        return None
    longest = float(index.durations.max()) if index.num_records else 0.0
    return search.StreamDecoder(
        searcher.graphdef, params, model_vars, config, tokenizer.blank_id, longest
    )


def decode_batch(
    batch: dict,
    stream: search.StreamDecoder | None,
    decode_fn: Callable,
    params: dict,
    model_vars: dict,
    mesh,
) -> dict:
    """The decoder's host-local outputs for one batch's (B, S) audio and (B,) audio_len
    (also the recognizer's path for waveforms in memory: `evaluation.recognize`)."""
    if stream:  # each row through the stream functions, on this process's device
        return stream(batch["audio"], batch["audio_len"])
    arrays = mesh_lib.host_to_global(mesh, {k: batch[k] for k in ("audio", "audio_len")})
    out = decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
    return {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}


def _gather_scores(
    counts: ErrorCounts,
    unreadable: int,
    rows: list[dict],
    index: records.SplitIndex,
    split: str,
) -> tuple[ErrorCounts, int, list[dict]]:
    """This process's error counts, unreadable records and utterance rows -> those of all
    processes (rows sorted by id).

    Raises:
      RuntimeError: they do not cover the whole split.
    """
    totals = mesh_lib.sum_over_processes(np.append(counts.as_array(), unreadable))
    counts, unreadable = ErrorCounts.from_array(totals[:-1]), int(totals[-1])
    rows = sorted(mesh_lib.allgather_json(rows), key=lambda r: r["id"])
    if counts.utterances + unreadable != index.num_records:
        raise RuntimeError(
            f"scored {counts.utterances} and skipped {unreadable} unreadable of "
            f"{index.num_records} utterances of {split}; evaluation must cover the whole split"
        )
    return counts, unreadable, rows


def _error_types(counts: ErrorCounts) -> dict[str, int]:
    """word_sub, word_del, ..., char_ins: the counts of each error type."""
    return {
        f"{unit}_{kind}": getattr(counts, f"{unit}_{kind}")
        for unit in ("word", "char")
        for kind in ("sub", "del", "ins")
    }


def evaluate_split(
    *,
    config: ConfigDict,
    decode_fn: Callable,
    params: dict,
    model_vars: dict,
    mesh,
    data_dir: str,
    split: str,
    tokenizer_dir: str,
    num_examples: int = 3,
    fault_log: faults.FaultLog | None = None,
    searcher: search.Searcher | None = None,
) -> dict:
    """Decode every utterance of `data_dir/split` (config.decoding): WER/CER and examples.

    A record that cannot be read or decoded is reported (`fault_log`), counted in the
    result's "skipped_unreadable" and left out of WER; more than
    data.max_corrupt_fraction of the split raises faults.CorpusDamaged. `searcher` (the
    host half of config.decoding; built here if not given) must be given for RNN-T beam
    search with an LM and for decoding.streaming, which need the model's graph.
    """
    t0 = time.time()
    index = records.read_split_index(data_dir, split)
    pipe = _eval_pipeline(config, mesh, index, data_dir, split, tokenizer_dir)
    tokenizer = Tokenizer.load(tokenizer_dir)
    searcher = searcher or search.Searcher(config, tokenizer)
    hypotheses = searcher.bind(params, model_vars)
    stream = _stream_decoder(config, searcher, params, model_vars, tokenizer, index)
    normalize = normalizer_from_config(config)
    fault_log = fault_log or faults.FaultLog(None, what=f"evaluating {split}")
    counts, examples, rows, unreadable = ErrorCounts(), [], [], 0
    for batch in pipe.dataset():
        fault_log.add(batch["faults"])
        unreadable += int(batch["corrupt"].sum())
        out = decode_batch(batch, stream, decode_fn, params, model_vars, mesh)
        for utt_id, ref, hyp_ids in zip(batch["id"], batch["text"], hypotheses(out)):
            if not utt_id:  # a padding row
                continue
            ref, hyp = normalize(ref), normalize(tokenizer.decode(hyp_ids))
            rows.append({"id": utt_id, "ref": ref, "hyp": hyp} | counts.add(ref, hyp))
            if len(examples) < num_examples:
                examples.append({"id": utt_id, "ref": ref, "hyp": hyp})
    counts, unreadable, rows = _gather_scores(counts, unreadable, rows, index, split)
    faults.CorruptBudget(index.num_records, build.max_corrupt_fraction(config), split).add(
        0, unreadable, fault_log.by_shard
    )
    return {
        "split": split,
        "decoding": search.decoding_method(config),
        "num_utts": counts.utterances,
        "skipped_unreadable": unreadable,
        "wer": round(counts.wer, 5),
        "cer": round(counts.cer, 5),
        "words": counts.words,
        "chars": counts.chars,
        **_error_types(counts),
        **summarize_utterances(rows, config),
        "eval_seconds": round(time.time() - t0, 1),
        "examples": examples,
        "utterances": rows,  # written as RUN/eval/<split>-step<N>-utts.jsonl
    }


def describe_result(result: dict, step: int) -> str:
    """The console lines of an evaluation: scores with their error types and intervals,
    counts, the example hypotheses and the worst utterances."""
    ci = ""
    if "wer_ci95" in result:
        (wl, wh), (cl, ch) = result["wer_ci95"], result["cer_ci95"]
        ci = f" (95% CI WER {wl:.2%}-{wh:.2%}, CER {cl:.2%}-{ch:.2%})"
    lines = [
        f"eval step {step}: {result['split']} WER {result['wer']:.2%} CER {result['cer']:.2%}"
        f"{ci} ({result['num_utts']} utts, {result['skipped_unreadable']} unreadable skipped, "
        f"{result['eval_seconds']}s)"
    ]
    if "word_sub" in result:
        lines.append(
            f"  words {result['words']}: {result['word_sub']} substituted, "
            f"{result['word_del']} deleted, {result['word_ins']} inserted"
        )
    lines += [f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}" for ex in result["examples"]]
    if result.get("worst"):
        lines.append(f"  the {len(result['worst'])} utterances with the most word errors:")
        lines += [
            f"  {w['word_errors']}/{w['words']} {w['id']}\n    ref: {w['ref']}\n    hyp: {w['hyp']}"
            for w in result["worst"]
        ]
    return "\n".join(lines)


def write_result(workdir: str, result: dict, step: int, tag: str = "") -> str:
    """Write RUN/eval/<split>-step<N><tag>.json and, when the result has its
    per-utterance rows, RUN/eval/<split>-step<N><tag>-utts.jsonl (one JSON line per
    utterance: id, ref, hyp and its error counts); process 0. Returns the JSON's path."""
    base = os.path.join(workdir, "eval", f"{result['split']}-step{step}{tag}")
    if jax.process_index() == 0:
        os.makedirs(os.path.dirname(base), exist_ok=True)
        summary = {k: v for k, v in result.items() if k != "utterances"}
        if "utterances" in result:  # first: the summary's presence means both are whole
            with files.atomic_open(base + "-utts.jsonl") as f:
                for row in result["utterances"]:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        files.atomic_json(base + ".json", summary | {"step": step})
    return base + ".json"
