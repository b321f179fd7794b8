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
from jaxspeech.decoding import rnnt as rnnt_decoding
from jaxspeech.metrics.wer import ErrorCounts
from jaxspeech.models import ENCODERS, build_model
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules

ASSETS = "assets"
TOKENIZER = "tokenizer"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
DECODERS = ("ctc_greedy", "ctc_beam", "rnnt_greedy", "rnnt_beam")


# ---------------------------------------------------------------- model from config
def feature_config(config: ConfigDict) -> LogMelConfig:
    """The LogMelConfig of `config.features`."""
    return LogMelConfig(**config.features.to_dict())


def make_model(config: ConfigDict, vocab_size: int, seed: int) -> nnx.Module:
    """Instantiate `config.model` (explicit keyword arguments, no config inside the model)."""
    m = config.model
    if m.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {m.dtype!r}")
    if m.encoder not in ENCODERS or m.encoder not in m:
        raise ValueError(
            f"model.encoder must be one of {sorted(ENCODERS)} with its settings under "
            f"config.model.<encoder>, got {m.encoder!r}"
        )
    specaug = None
    if config.specaug.enabled:
        specaug = {k: v for k, v in config.specaug.to_dict().items() if k != "enabled"}
    return build_model(
        encoder=m.encoder,
        encoder_kwargs=m[m.encoder].to_dict(),
        head=m.head,
        transducer_kwargs=m.transducer.to_dict() if "rnnt" in m.head else None,
        vocab_size=vocab_size,
        feature_config=feature_config(config),
        specaug=specaug,
        dtype=DTYPES[m.dtype],
        rngs=nnx.Rngs(params=seed),
    )


def abstract_model(config: ConfigDict, vocab_size: int, mesh, *, with_axes: bool = False) -> tuple:
    """(graphdef, abstract params, abstract model_vars, param shardings, var shardings),
    plus the parameters' logical axes (a matching dict) when `with_axes`.

    Abstract trees are pure dicts of ShapeDtypeStructs carrying the mesh shardings.
    """
    model = nnx.eval_shape(lambda: make_model(config, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    p_shard = rules.state_shardings(params, mesh)
    v_shard = rules.state_shardings(model_vars, mesh)
    out = (
        graphdef,
        ckpt_lib.abstract_like(nnx.to_pure_dict(params), p_shard),
        ckpt_lib.abstract_like(nnx.to_pure_dict(model_vars), v_shard),
        p_shard,
        v_shard,
    )
    return out + (rules.state_axes(params),) if with_axes else out


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
) -> dict:
    """Decode every utterance of `data_dir/split` (config.decoding): WER/CER and examples."""
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
        "decoding": decoding_method(config),
        "num_utts": counts.utterances,
        "wer": round(counts.wer, 5),
        "cer": round(counts.cer, 5),
        "words": counts.words,
        "chars": counts.chars,
        "eval_seconds": round(time.time() - t0, 1),
        "examples": examples,
    }


def write_result(workdir: str, result: dict, step: int, tag: str = "") -> str:
    """Write RUN/eval/<split>-step<N><tag>.json (process 0) and return its path."""
    path = os.path.join(workdir, "eval", f"{result['split']}-step{step}{tag}.json")
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
    workdir: str,
    data_dir: str | None,
    split: str | None,
    step: int | None,
    method: str | None = None,
    beam: int | None = None,
) -> dict:
    """Restore RUN's checkpoint (latest unless `step`) and score a split; `method` and
    `beam` override the run's config.decoding."""
    config = load_run_config(workdir)
    if method:
        config.decoding.method = method
    if beam:
        config.decoding.beam = beam
    decoding_method(config)  # a method the model cannot run is an error before any work
    data_dir = data_dir or config.data.dir
    split = split or config.data.eval_split
    tokenizer_dir = os.path.join(workdir, ASSETS, TOKENIZER)
    tokenizer = Tokenizer.load(tokenizer_dir)
    mesh = mesh_lib.make_mesh(config.mesh.to_dict())
    graphdef, abs_params, abs_vars, _, _ = abstract_model(config, tokenizer.vocab_size, mesh)
    ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {ckpt.directory}; train first")
    restored = ckpt.restore(step, abstract_model={"params": abs_params, "model_vars": abs_vars})
    model_state = restored[ckpt_lib.MODEL]
    ckpt.close()
    with jax.set_mesh(mesh):  # the models' logical-axis constraints take effect
        result = evaluate_split(
            config=config,
            decode_fn=make_decode_fn(graphdef, config, tokenizer.blank_id),
            params=model_state["params"],
            model_vars=model_state["model_vars"],
            mesh=mesh,
            data_dir=data_dir,
            split=split,
            tokenizer_dir=tokenizer_dir,
        )
    result["step"] = step
    # Runs decoded another way than the run's own config keep their own file.
    tag = f"-{decoding_method(config)}-beam{config.decoding.beam}" if method or beam else ""
    write_result(workdir, result, step, tag)
    return result


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    del argv
    try:
        mesh_lib.initialize()  # multi-host flags or cluster detection, as in training
        result = evaluate_workdir(
            FLAGS.workdir, FLAGS.data, FLAGS.split, FLAGS.step, FLAGS.method, FLAGS.beam
        )
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
    flags.DEFINE_enum(
        "method", None, list(DECODERS), "Decoder (default: the run's config.decoding.method)."
    )
    flags.DEFINE_integer("beam", None, "Beam size of ctc_beam / rnnt_beam (default: the run's).")
    logging.set_verbosity(logging.WARNING)  # keep Orbax's per-restore INFO lines off the console
    app.run(main)
