"""Decode and score a model: `python -m jaxspeech.evaluate --workdir RUN --data DIR --split S`.

Prints one JSON line {"split", "num_utts", "wer", "cer", ...} and writes it to
RUN/eval/<split>-step<N>.json. The run's own tokenizer (RUN/assets/tokenizer)
and normalization statistics (inside the checkpoint) are used, so DIR may be
any corpus prepared with `python -m data_prep.prepare`.

Also home of the model-from-config helpers that train.py shares.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data import records
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import ctc as ctc_decoding
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.models import build_model
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules

ASSETS = "assets"
TOKENIZER = "tokenizer"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# ---------------------------------------------------------------- model from config
def feature_config(config: ConfigDict) -> LogMelConfig:
    """The LogMelConfig of `config.features`."""
    return LogMelConfig(**config.features.to_dict())


def make_model(config: ConfigDict, vocab_size: int, seed: int) -> nnx.Module:
    """Instantiate `config.model` (explicit keyword arguments, no config inside the model)."""
    m = config.model
    if m.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {m.dtype!r}")
    specaug = None
    if config.specaug.enabled:
        specaug = {k: v for k, v in config.specaug.to_dict().items() if k != "enabled"}
    kwargs = {k: v for k, v in m.to_dict().items() if k not in ("name", "dtype")}
    return build_model(
        m.name,
        vocab_size=vocab_size,
        feature_config=feature_config(config),
        specaug=specaug,
        dtype=DTYPES[m.dtype],
        rngs=nnx.Rngs(params=seed),
        **kwargs,
    )


def abstract_model(config: ConfigDict, vocab_size: int, mesh) -> tuple:
    """(graphdef, abstract params, abstract model_vars, param shardings, var shardings).

    Abstract trees are pure dicts of ShapeDtypeStructs carrying the mesh shardings.
    """
    model = nnx.eval_shape(lambda: make_model(config, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    p_shard = rules.state_shardings(params, mesh)
    v_shard = rules.state_shardings(model_vars, mesh)
    return (
        graphdef,
        ckpt_lib.abstract_like(nnx.to_pure_dict(params), p_shard),
        ckpt_lib.abstract_like(nnx.to_pure_dict(model_vars), v_shard),
        p_shard,
        v_shard,
    )


def make_decode_fn(graphdef) -> Callable:
    """forward(params, model_vars, audio, audio_len) -> (greedy ids (B, T'), lengths (B,))."""

    @jax.jit
    def decode(params, model_vars, audio_bs, audio_len_b):
        model = nnx.merge(graphdef, params, model_vars)
        logits, lengths = model(audio_bs, audio_len_b, train=False)
        return ctc_decoding.greedy_ids(logits), lengths

    return decode


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
) -> dict:
    """Greedy-decode every utterance of `data_dir/split`; returns WER/CER and examples."""
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
    )
    tokenizer = Tokenizer.load(tokenizer_dir)
    counts, examples = ErrorCounts(), []
    for batch in pipe.dataset():
        arrays = mesh_lib.host_to_global(mesh, {k: batch[k] for k in ("audio", "audio_len")})
        ids, lengths = decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
        ids = mesh_lib.to_host_local(mesh, ids)
        lengths = mesh_lib.to_host_local(mesh, lengths)
        hyps = ctc_decoding.collapse(ids, lengths, blank_id=tokenizer.blank_id)
        for utt_id, ref, hyp_ids in zip(batch["id"], batch["text"], hyps):
            if not utt_id:  # a padding row
                continue
            hyp = tokenizer.decode(hyp_ids)
            counts.add(ref, hyp)
            if len(examples) < num_examples:
                examples.append({"id": utt_id, "ref": ref, "hyp": hyp})
    totals = mesh_lib.sum_over_processes(
        np.array(
            [counts.word_errors, counts.words, counts.char_errors, counts.chars, counts.utterances],
            np.int64,
        )
    )
    counts = ErrorCounts(*map(int, totals))
    if counts.utterances != index.num_records:
        raise RuntimeError(
            f"scored {counts.utterances} of {index.num_records} utterances of {split}; "
            "evaluation must cover the whole split"
        )
    return {
        "split": split,
        "num_utts": counts.utterances,
        "wer": round(counts.wer, 5),
        "cer": round(counts.cer, 5),
        "words": counts.words,
        "chars": counts.chars,
        "eval_seconds": round(time.time() - t0, 1),
        "examples": examples,
    }


def write_result(workdir: str, result: dict, step: int) -> str:
    """Write RUN/eval/<split>-step<N>.json (process 0) and return its path."""
    path = os.path.join(workdir, "eval", f"{result['split']}-step{step}.json")
    if jax.process_index() == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result | {"step": step}, f, indent=1)
    return path


def load_run_config(workdir: str) -> ConfigDict:
    """The resolved config a run was trained with (RUN/config.json)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {workdir} is not a jaxspeech run directory "
            "(train one with `python -m jaxspeech.train --workdir ...`)"
        )
    with open(path) as f:
        return ConfigDict(json.load(f))


def evaluate_workdir(
    workdir: str, data_dir: str | None, split: str | None, step: int | None
) -> dict:
    """Restore RUN's checkpoint (latest unless `step`) and score a split."""
    config = load_run_config(workdir)
    data_dir = data_dir or config.data.dir
    split = split or config.data.eval_split
    tokenizer_dir = os.path.join(workdir, ASSETS, TOKENIZER)
    tokenizer = Tokenizer.load(tokenizer_dir)
    mesh = mesh_lib.make_mesh(config.mesh.to_dict())
    graphdef, abs_params, abs_vars, _, _ = abstract_model(config, tokenizer.vocab_size, mesh)
    ckpt = ckpt_lib.Checkpointer(workdir, async_save=False)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {ckpt.directory}; train first")
    restored = ckpt.restore(step, abstract_model={"params": abs_params, "model_vars": abs_vars})
    model_state = restored[ckpt_lib.MODEL]
    ckpt.close()
    result = evaluate_split(
        config=config,
        decode_fn=make_decode_fn(graphdef),
        params=model_state["params"],
        model_vars=model_state["model_vars"],
        mesh=mesh,
        data_dir=data_dir,
        split=split,
        tokenizer_dir=tokenizer_dir,
    )
    result["step"] = step
    write_result(workdir, result, step)
    return result


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    del argv
    try:
        result = evaluate_workdir(FLAGS.workdir, FLAGS.data, FLAGS.split, FLAGS.step)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    for ex in result.pop("examples"):
        print(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}", file=sys.stderr)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string("split", None, "Split to score (default: the run's data.eval_split).")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main)
