"""Decode and score a model: `python -m jaxspeech.evaluate --workdir RUN --data DIR
--split dev,test [--watch]`.

Prints one JSON line per split {"split", "num_utts", "wer", "cer", "wer_ci95", "word_sub",
...} and writes it to RUN/eval/<split>-step<N>.json, with every utterance's reference,
hypothesis and errors in RUN/eval/<split>-step<N>-utts.jsonl. `--watch` follows a training
run instead (`jaxspeech.eval_watch`). The run's own tokenizer (RUN/assets/tokenizer)
and normalization statistics (inside the checkpoint) are used, so DIR may be
any corpus prepared with `python -m data_prep.prepare`.

The library half (`evaluate_split`, with `search.make_decode_fn`) is what training's periodic
evaluation calls; the model and its checkpoint come from `jaxspeech.state`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import ConfigDict

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import cli, faults, inputs, search
from jaxspeech import state as state_lib
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.errors import UserError
from jaxspeech.metrics.wer import ErrorCounts, Normalizer, bootstrap_interval, load_mapping
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules


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


def parse_splits(text: str) -> list[str]:
    """ "dev,test" -> ["dev", "test"]: the splits evaluation scores, in order (the first
    one's WER chooses the best checkpoint).

    Raises:
      UserError: an empty name or a split named twice.
    """
    splits = [s.strip() for s in str(text).split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise UserError(f"splits must be distinct names separated by commas, got {text!r}")
    return splits


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


def eval_bucket_spec(config: ConfigDict, durations: np.ndarray, multiple_of: int):
    """Eval buckets (else the training ones) plus one up to the longest utterance.

    The extra bucket makes sure every utterance of the split is scored.
    """
    bounds = list(config.data.eval_bucket_boundaries or config.data.bucket_boundaries)
    longest = float(durations.max()) if len(durations) else 0.0
    if longest > bounds[-1]:
        bounds.append(float(math.ceil(longest)))
    return pipeline_lib.make_bucket_spec(
        bounds,
        config.data.batch_seconds,
        config.data.max_tokens_per_second,
        config.features.sample_rate,
        multiple_of=multiple_of,
    )


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
    multiple_of = math.lcm(mesh_lib.num_batch_shards(mesh), jax.process_count())
    spec = eval_bucket_spec(config, index.durations, multiple_of)
    pipe = pipeline_lib.make_pipeline(
        data_dir=data_dir,
        split=split,
        tokenizer_dir=tokenizer_dir,
        spec=spec,
        seed=config.seed,
        train=False,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        prefetch=config.data.prefetch,
        retry=inputs.retry_policy(config),
    )
    tokenizer = Tokenizer.load(tokenizer_dir)
    searcher = searcher or search.Searcher(config, tokenizer)
    hypotheses = searcher.bind(params, model_vars)
    stream = None
    if config.decoding.get("streaming", False):
        longest = float(index.durations.max()) if index.num_records else 0.0
        stream = search.StreamDecoder(
            searcher.graphdef, params, model_vars, config, tokenizer.blank_id, longest
        )
    normalize = normalizer_from_config(config)
    fault_log = fault_log or faults.FaultLog(None, what=f"evaluating {split}")
    counts, examples, rows, unreadable = ErrorCounts(), [], [], 0
    for batch in pipe.dataset():
        fault_log.add(batch["faults"])
        unreadable += int(batch["corrupt"].sum())
        if stream:  # each row through the stream functions, on this process's device
            out = stream(batch["audio"], batch["audio_len"])
        else:
            arrays = mesh_lib.host_to_global(mesh, {k: batch[k] for k in ("audio", "audio_len")})
            out = decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}
        hyps = hypotheses(out)
        for utt_id, ref, hyp_ids in zip(batch["id"], batch["text"], hyps):
            if not utt_id:  # a padding row
                continue
            ref, hyp = normalize(ref), normalize(tokenizer.decode(hyp_ids))
            rows.append({"id": utt_id, "ref": ref, "hyp": hyp} | counts.add(ref, hyp))
            if len(examples) < num_examples:
                examples.append({"id": utt_id, "ref": ref, "hyp": hyp})
    totals = mesh_lib.sum_over_processes(np.append(counts.as_array(), unreadable))
    counts, unreadable = ErrorCounts.from_array(totals[:-1]), int(totals[-1])
    rows = sorted(mesh_lib.allgather_json(rows), key=lambda r: r["id"])
    if counts.utterances + unreadable != index.num_records:
        raise RuntimeError(
            f"scored {counts.utterances} and skipped {unreadable} unreadable of "
            f"{index.num_records} utterances of {split}; evaluation must cover the whole split"
        )
    faults.CorruptBudget(index.num_records, inputs.max_corrupt_fraction(config), split).add(
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
        **{
            f"{unit}_{kind}": getattr(counts, f"{unit}_{kind}")
            for unit in ("word", "char")
            for kind in ("sub", "del", "ins")
        },
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
        with open(base + ".json", "w") as f:
            json.dump(summary | {"step": step}, f, indent=1)
        if "utterances" in result:
            with open(base + "-utts.jsonl", "w", encoding="utf-8") as f:
                for row in result["utterances"]:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return base + ".json"


def evaluate_run(
    run: state_lib.Run,
    config: ConfigDict,
    data_dir: str,
    split: str,
    decode_fn: Callable | None = None,
    searcher: search.Searcher | None = None,
) -> dict:
    """Score a loaded run's checkpoint on `data_dir/split` with `config.decoding`.
    `decode_fn` (`search.make_decode_fn` of the run's model) and `searcher`: pass them to
    reuse compiled programs and the loaded LM across splits and checkpoints of one model."""
    if decode_fn is None:
        decode_fn = search.make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id)
    if searcher is None:
        searcher = search.Searcher(config, run.tokenizer, run.spec.graphdef)
    with jax.set_mesh(run.spec.mesh):  # the models' logical-axis constraints take effect
        return evaluate_split(
            config=config,
            decode_fn=decode_fn,
            params=run.params,
            model_vars=run.model_vars,
            mesh=run.spec.mesh,
            data_dir=data_dir,
            split=split,
            tokenizer_dir=run.tokenizer_dir,
            searcher=searcher,
        )


def run_eval_config(
    workdir: str,
    method: str | None = None,
    beam: int | None = None,
    max_corrupt_fraction: float | None = None,
    decoding: dict | None = None,
) -> ConfigDict:
    """RUN's config with the command line's decoding and corrupt-record overrides, checked
    (a decoder the model has no head for is an error before any work). `decoding`: any of
    lm_path ("" for no LM), lm_weight, word_bonus, streaming for config.decoding, and
    chunk_size for model.conformer (the chunk size a streaming model is decoded with);
    None values leave the run's.

    Raises:
      FileNotFoundError: not a run directory. ValueError: a decoder the model cannot run,
        an LM with a greedy decoder, a chunk size below 0.
      UserError: a bad scoring.mapping_file.
    """
    config = state_lib.load_run_config(workdir)
    if method:
        config.decoding.method = method
    if beam:
        config.decoding.beam = beam
    if max_corrupt_fraction is not None:
        config.data.max_corrupt_fraction = max_corrupt_fraction
    for key, default in (
        ("lm_path", ""),
        ("lm_weight", search.LM_WEIGHT),
        ("word_bonus", search.WORD_BONUS),
        ("streaming", False),
    ):
        if key not in config.decoding:  # a run from before the key
            config.decoding[key] = default
    for key, value in (decoding or {}).items():
        if value is None:
            continue
        if key == "chunk_size":
            if value < 0:
                raise ValueError(f"chunk_size must be >= 0 (0: full context), got {value}")
            config.model.conformer.chunk_size = value
        else:
            config.decoding[key] = value
    search.uses_lm(config)
    normalizer_from_config(config)
    return config


def result_tag(
    config: ConfigDict, method: str | None, beam: int | None, decoding: dict | None = None
) -> str:
    """File-name tag of results decoded otherwise than the run's own config says."""
    if not (method or beam or any(v is not None for v in (decoding or {}).values())):
        return ""
    tag = f"-{search.decoding_method(config)}-beam{config.decoding.beam}"
    dec = config.decoding
    if dec.lm_path:
        name = os.path.splitext(os.path.basename(dec.lm_path))[0]
        tag += f"-{name}-w{dec.lm_weight:g}-b{dec.word_bonus:g}"
    if (decoding or {}).get("chunk_size") is not None:
        tag += f"-chunk{config.model.conformer.chunk_size}"
    if dec.streaming:
        tag += "-streaming"
    return tag


def evaluate_splits(
    workdir: str,
    data_dir: str | None,
    splits: list[str] | None,
    step: int | None,
    method: str | None = None,
    beam: int | None = None,
    max_corrupt_fraction: float | None = None,
    decoding: dict | None = None,
) -> list[dict]:
    """Restore RUN's checkpoint (latest unless `step`) once and score each split (default:
    the run's data.eval_split list), writing RUN/eval/ for each; `method` and `beam`
    override the run's config.decoding, `max_corrupt_fraction` its
    data.max_corrupt_fraction, `decoding` its LM and streaming settings
    (`run_eval_config`).

    Raises:
      UserError: not a run directory, no such checkpoint, a decoder the model has no
        head for, a split that is not prepared.
    """
    try:
        config = run_eval_config(workdir, method, beam, max_corrupt_fraction, decoding)
        data_dir = data_dir or config.data.dir
        splits = splits or parse_splits(config.data.eval_split)
        with rules.axis_rules(state_lib.rules_from_config(config)):
            run = state_lib.load_run(workdir, step=step, config=config)
            decode = search.make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id)
            searcher = search.Searcher(config, run.tokenizer, run.spec.graphdef)
            results = [
                evaluate_run(run, config, data_dir, split, decode, searcher) for split in splits
            ]
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    for result in results:
        result["step"] = run.step
        write_result(workdir, result, run.step, result_tag(config, method, beam, decoding))
    return results


def evaluate_workdir(
    workdir: str,
    data_dir: str | None,
    split: str | None,
    step: int | None,
    method: str | None = None,
    beam: int | None = None,
    max_corrupt_fraction: float | None = None,
    decoding: dict | None = None,
) -> dict:
    """`evaluate_splits` of one split (default: the run's first data.eval_split); its
    result."""
    return evaluate_splits(
        workdir,
        data_dir,
        [split] if split else None,
        step,
        method,
        beam,
        max_corrupt_fraction,
        decoding,
    )[0]


FLAGS = flags.FLAGS


def print_result(result: dict) -> None:
    """Examples and the worst utterances to stderr, the scores as one JSON line to stdout."""
    for ex in result.pop("examples"):
        print(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}", file=sys.stderr)
    for w in result.get("worst", []):
        print(
            f"  worst {w['word_errors']}/{w['words']} {w['id']}\n    ref: {w['ref']}\n"
            f"    hyp: {w['hyp']}",
            file=sys.stderr,
        )
    result.pop("utterances", None)  # in RUN/eval/<split>-step<N>-utts.jsonl
    print(json.dumps(result), flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")

    def job() -> None:
        if FLAGS.watch and FLAGS.step is not None:
            cli.usage_error("--step and --watch exclude each other (--watch scores every step)")
        splits = parse_splits(FLAGS.split) if FLAGS.split else None
        overrides = (FLAGS.method, FLAGS.beam, FLAGS.max_corrupt_fraction, search.flag_overrides())
        if FLAGS.watch:
            from jaxspeech import eval_watch  # the watcher imports this module

            eval_watch.watch(
                FLAGS.workdir, FLAGS.data, splits, *overrides,
                timeout_s=FLAGS.watch_timeout, poll_s=FLAGS.watch_poll_s,
            )  # fmt: skip
            return
        for result in evaluate_splits(FLAGS.workdir, FLAGS.data, splits, FLAGS.step, *overrides):
            print_result(result)

    cli.run_job(job)


if __name__ == "__main__":
    mesh_lib.define_flags()
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string(
        "split", None, "Splits to score, comma-separated (default: the run's data.eval_split)."
    )
    flags.DEFINE_bool(
        "watch",
        False,
        "Follow the run: evaluate every newly committed checkpoint once per split, keep "
        "progress in RUN/eval/watch.json, exit when the run's final checkpoint is scored.",
    )
    flags.DEFINE_float(
        "watch_timeout",
        0.0,
        "With --watch: stop after this many seconds without a new "
        "checkpoint (0 = wait until the run finishes).",
        lower_bound=0.0,
    )
    flags.DEFINE_float(
        "watch_poll_s",
        30.0,
        "With --watch: seconds between looks for new checkpoints.",
        lower_bound=0.0,
    )
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest; not with --watch).")
    search.define_flags()
    flags.DEFINE_float(
        "max_corrupt_fraction",
        None,
        "Unreadable records of the split allowed, as a fraction; they are skipped and "
        "counted (default: the run's data.max_corrupt_fraction).",
    )
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
