"""Evaluate a finished run: restore one checkpoint, apply the command line's decoding
overrides to the run's own config, and score each split (`jaxspeech.evaluation.scoring`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.config import build, defaults, validate
from jaxspeech.decoding import search
from jaxspeech.evaluation import scoring
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import loading, remote


def evaluate_run(
    run: loading.Run,
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
        return scoring.evaluate_split(
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
    lm_path ("" for no LM), lm_weight, word_bonus, streaming, ctc_weight, length_norm,
    eos_threshold for config.decoding, and chunk_size for model.conformer (the chunk size
    a streaming model is decoded with); None values leave the run's.

    Raises:
      FileNotFoundError: not a run directory. ValueError: a decoder the model cannot run,
        an LM with a greedy decoder, a chunk size below 0, a decoding value out of range.
      UserError: a bad scoring.mapping_file.
    """
    config = loading.load_run_config(workdir)
    if method:
        config.decoding.method = method
    if beam is not None:  # 0 too: refused below (decoding.beam >= 1), not ignored
        config.decoding.beam = beam
    if max_corrupt_fraction is not None:
        config.data.max_corrupt_fraction = max_corrupt_fraction
    defaults.fill_missing(config, "decoding")  # a run from before some decoding keys
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
    found = validate.decoding_mistakes(config)
    if found:
        raise ValueError("; ".join(found))
    scoring.normalizer_from_config(config)
    return config


def result_tag(
    config: ConfigDict, method: str | None, beam: int | None, decoding: dict | None = None
) -> str:
    """File-name tag of results decoded otherwise than the run's own config says."""
    if not (method or beam is not None or any(v is not None for v in (decoding or {}).values())):
        return ""
    tag = f"-{search.decoding_method(config)}-beam{config.decoding.beam}"
    dec = config.decoding
    if dec.lm_path:
        name = os.path.splitext(os.path.basename(dec.lm_path))[0]
        tag += f"-{name}-w{dec.lm_weight:g}-b{dec.word_bonus:g}"
    if (decoding or {}).get("chunk_size") is not None:
        tag += f"-chunk{config.model.conformer.chunk_size}"
    if search.decoding_method(config).startswith("aed"):  # the attention searches' settings
        tag += f"-ctc{dec.ctc_weight:g}"
        tag += "" if dec.length_norm else "-nonorm"
        tag += f"-eos{dec.eos_threshold:g}"
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
        with rules.axis_rules(build.rules_from_config(config)):
            run = loading.load_run(workdir, step=step, config=config)
            decode = search.make_decode_fn(run.spec.graphdef, config, run.tokenizer.blank_id)
            searcher = search.Searcher(config, run.tokenizer, run.spec.graphdef)
            results = [
                evaluate_run(run, config, data_dir, split, decode, searcher) for split in splits
            ]
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    copy = remote.reader(workdir)  # a run on an object store: written here, then pushed
    for result in results:
        result["step"] = run.step
        tag = result_tag(config, method, beam, decoding)
        scoring.write_result(copy.local, result, run.step, tag)
    if jax.process_index() == 0:
        copy.push()
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
