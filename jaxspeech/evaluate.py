"""Decode and score a model: `python -m jaxspeech.evaluate --workdir RUN --data DIR --split S`.

Prints one JSON line {"split", "num_utts", "wer", "cer", ...} and writes it to
RUN/eval/<split>-step<N>.json. The run's own tokenizer (RUN/assets/tokenizer)
and normalization statistics (inside the checkpoint) are used, so DIR may be
any corpus prepared with `python -m data_prep.prepare`.

The library half (`make_decode_fn`, `evaluate_split`) is what training's periodic
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
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import cli, faults, inputs
from jaxspeech import state as state_lib
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.decoding import rnnt as rnnt_decoding
from jaxspeech.errors import UserError
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules

DECODERS = ("ctc_greedy", "ctc_beam", "rnnt_greedy", "rnnt_beam")


# ---------------------------------------------------------------- decoding
def decoding_method(config: ConfigDict) -> str:
    """config.decoding.method, with "auto" resolved and checked against the model's head."""
    method, heads = config.decoding.method, config.model.head.split("+")
    if method == "auto":
        return "rnnt_greedy" if "rnnt" in heads else "ctc_greedy"
    if method not in DECODERS:
        raise ValueError(f"decoding.method must be auto or one of {DECODERS}, got {method!r}")
    if method.split("_")[0] not in heads:
        raise ValueError(f"decoding.method {method!r} needs a model with that head, not {heads}")
    return method


def make_decode_fn(graphdef, config: ConfigDict, blank_id: int) -> Callable:
    """decode(params, model_vars, audio, audio_len) -> device outputs for `hypotheses`."""
    method, dec = decoding_method(config), config.decoding

    @jax.jit
    def decode(params, model_vars, audio_bs, audio_len_b):
        model = nnx.merge(graphdef, params, model_vars)
        enc, lengths = model(audio_bs, audio_len_b, train=False)
        if method == "ctc_greedy":
            return {"ids": ctc_decoding.greedy_ids(model.ctc_logits(enc)), "lengths": lengths}
        if method == "ctc_beam":
            return {"logprobs": jax.nn.log_softmax(model.ctc_logits(enc)), "lengths": lengths}
        tr = model.transducer
        pred_init, pred_step, joint = tr.decoder_fns()
        enc_proj = tr.joiner.enc_proj(enc)
        if method == "rnnt_greedy":
            tokens, num = rnnt_decoding.rnnt_greedy(
                enc_proj,
                lengths,
                pred_init,
                pred_step,
                joint,
                blank_id=blank_id,
                max_symbols_per_frame=dec.max_symbols_per_frame,
            )
        else:
            tokens, num, _ = rnnt_decoding.rnnt_modified_beam_search(
                enc_proj, lengths, pred_init, pred_step, joint, beam=dec.beam, blank_id=blank_id
            )
        return {"tokens": tokens, "num_tokens": num}

    return decode


def hypotheses(out: dict, config: ConfigDict, blank_id: int) -> list[list[int]]:
    """Host-local decode outputs -> one label sequence per row."""
    if "ids" in out:
        return ctc_decoding.collapse(out["ids"], out["lengths"], blank_id=blank_id)
    if "logprobs" in out:
        return ctc_decoding.ctc_beam_search_batch(
            out["logprobs"], out["lengths"], beam=config.decoding.beam, blank_id=blank_id
        )
    return rnnt_decoding.to_lists(out["tokens"], out["num_tokens"])


# ---------------------------------------------------------------- scoring
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
) -> dict:
    """Decode every utterance of `data_dir/split` (config.decoding): WER/CER and examples.

    A record that cannot be read or decoded is reported (`fault_log`), counted in the
    result's "skipped_unreadable" and left out of WER; more than
    data.max_corrupt_fraction of the split raises faults.CorpusDamaged.
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
    fault_log = fault_log or faults.FaultLog(None, what=f"evaluating {split}")
    counts, examples, unreadable = ErrorCounts(), [], 0
    for batch in pipe.dataset():
        fault_log.add(batch["faults"])
        unreadable += int(batch["corrupt"].sum())
        arrays = mesh_lib.host_to_global(mesh, {k: batch[k] for k in ("audio", "audio_len")})
        out = decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
        out = {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}
        hyps = hypotheses(out, config, tokenizer.blank_id)
        for utt_id, ref, hyp_ids in zip(batch["id"], batch["text"], hyps):
            if not utt_id:  # a padding row
                continue
            hyp = tokenizer.decode(hyp_ids)
            counts.add(ref, hyp)
            if len(examples) < num_examples:
                examples.append({"id": utt_id, "ref": ref, "hyp": hyp})
    totals = mesh_lib.sum_over_processes(
        np.array(
            [
                counts.word_errors,
                counts.words,
                counts.char_errors,
                counts.chars,
                counts.utterances,
                unreadable,
            ],
            np.int64,
        )
    )
    counts, unreadable = ErrorCounts(*map(int, totals[:5])), int(totals[5])
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
        "decoding": decoding_method(config),
        "num_utts": counts.utterances,
        "skipped_unreadable": unreadable,
        "wer": round(counts.wer, 5),
        "cer": round(counts.cer, 5),
        "words": counts.words,
        "chars": counts.chars,
        "eval_seconds": round(time.time() - t0, 1),
        "examples": examples,
    }


def describe_result(result: dict, step: int) -> str:
    """The console lines of an evaluation: scores, counts, and the example hypotheses."""
    lines = [
        f"eval step {step}: {result['split']} WER {result['wer']:.2%} CER {result['cer']:.2%} "
        f"({result['num_utts']} utts, {result['skipped_unreadable']} unreadable skipped, "
        f"{result['eval_seconds']}s)"
    ]
    lines += [f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}" for ex in result["examples"]]
    return "\n".join(lines)


def write_result(workdir: str, result: dict, step: int, tag: str = "") -> str:
    """Write RUN/eval/<split>-step<N><tag>.json (process 0) and return its path."""
    path = os.path.join(workdir, "eval", f"{result['split']}-step{step}{tag}.json")
    if jax.process_index() == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result | {"step": step}, f, indent=1)
    return path


def evaluate_run(run: state_lib.Run, config: ConfigDict, data_dir: str, split: str) -> dict:
    """Score a loaded run's checkpoint on `data_dir/split` with `config.decoding`."""
    with jax.set_mesh(run.spec.mesh):  # the models' logical-axis constraints take effect
        return evaluate_split(
            config=config,
            decode_fn=make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id),
            params=run.params,
            model_vars=run.model_vars,
            mesh=run.spec.mesh,
            data_dir=data_dir,
            split=split,
            tokenizer_dir=run.tokenizer_dir,
        )


def evaluate_workdir(
    workdir: str,
    data_dir: str | None,
    split: str | None,
    step: int | None,
    method: str | None = None,
    beam: int | None = None,
    max_corrupt_fraction: float | None = None,
) -> dict:
    """Restore RUN's checkpoint (latest unless `step`) and score a split; `method` and
    `beam` override the run's config.decoding, `max_corrupt_fraction` its
    data.max_corrupt_fraction.

    Raises:
      UserError: not a run directory, no such checkpoint, a decoder the model has no
        head for, a split that is not prepared.
    """
    try:
        config = state_lib.load_run_config(workdir)
        if method:
            config.decoding.method = method
        if beam:
            config.decoding.beam = beam
        if max_corrupt_fraction is not None:
            config.data.max_corrupt_fraction = max_corrupt_fraction
        decoding_method(config)  # a method the model cannot run is an error before any work
        data_dir = data_dir or config.data.dir
        split = split or config.data.eval_split
        with rules.axis_rules(state_lib.rules_from_config(config)):
            run = state_lib.load_run(workdir, step=step)
            result = evaluate_run(run, config, data_dir, split)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    step = run.step
    result["step"] = step
    # Runs decoded another way than the run's own config keep their own file.
    tag = f"-{decoding_method(config)}-beam{config.decoding.beam}" if method or beam else ""
    write_result(workdir, result, step, tag)
    return result


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")

    def job() -> None:
        result = evaluate_workdir(
            FLAGS.workdir,
            FLAGS.data,
            FLAGS.split,
            FLAGS.step,
            FLAGS.method,
            FLAGS.beam,
            FLAGS.max_corrupt_fraction,
        )
        for ex in result.pop("examples"):
            print(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}", file=sys.stderr)
        print(json.dumps(result), flush=True)

    cli.run_job(job)


if __name__ == "__main__":
    mesh_lib.define_flags()
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string("split", None, "Split to score (default: the run's data.eval_split).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    flags.DEFINE_enum(
        "method", None, list(DECODERS), "Decoder (default: the run's config.decoding.method)."
    )
    flags.DEFINE_integer("beam", None, "Beam size of ctc_beam / rnnt_beam (default: the run's).")
    flags.DEFINE_float(
        "max_corrupt_fraction",
        None,
        "Unreadable records of the split allowed, as a fraction; they are skipped and "
        "counted (default: the run's data.max_corrupt_fraction).",
    )
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main, flags_parser=cli.parse_flags)
