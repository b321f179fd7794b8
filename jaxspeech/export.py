"""Deployment artifacts: `python -m jaxspeech.export --workdir RUN --format stablehlo --output DIR`.

The artifact takes 16 kHz audio: the log-mel front end and the run's feature
normalization are inside it, with a symbolic batch `b` and length `s` (any length,
also longer than every training bucket). What it holds depends on the head:

- CTC (`ctc`, `ctc+rnnt` models): `ctc.stablehlo`: (audio f32[b, s], audio_len i32[b])
  -> (log_probs f32[b, t, V], lengths i32[b]); a runtime takes the argmax per frame,
  collapses repeats and drops blanks (greedy) or runs a prefix beam search.
- Transducer (`rnnt`, `ctc+rnnt`), as separate functions so a runtime can run greedy or
  beam search: `encoder.stablehlo` (audio, audio_len) -> (enc_proj f32[b, t, J],
  lengths); `predictor_init.stablehlo` (tokens i32[b]) -> the predictor's state (the
  tokens only give the batch size); `predictor_step.stablehlo` (state..., tokens i32[b])
  -> (pred_proj f32[b, J], state...); `joiner.stablehlo` (enc_proj f32[b, J], pred_proj
  f32[b, J]) -> log_probs f32[b, V]. Greedy search starts with one predictor step on
  the blank, as `jaxspeech.decoding.rnnt` does.

Each `.stablehlo` file is `jax.export`'s serialization (parameters inside as
constants): `jax.export.deserialize(bytes).call(*arrays)` runs it with jax alone, no
jaxspeech code. Beside them: `manifest.json` (inputs, outputs, shapes, sample rate,
feature settings, tokenizer, the run's step, config and parameter fingerprint, dev
WER/CER of the exported checkpoint) and `tokenizer/` (the run's tokenizer files).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
from absl import app, flags, logging
from flax import nnx

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import cli, evaluate
from jaxspeech import state as state_lib
from jaxspeech.errors import UserError
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules

FORMATS = ("stablehlo",)
MANIFEST = "manifest.json"
# Shorter audio gives the front end and the subsampling no frame: the runtime pads it.
MIN_SECONDS = 0.1


# ---------------------------------------------------------------- the exported functions
def inference_functions(graphdef, params: dict, model_vars: dict) -> dict[str, Callable]:
    """name -> a pure function of arrays with the parameters closed over (numpy constants,
    so the exported program does not depend on the devices they were loaded on)."""
    params, model_vars = jax.device_get(params), jax.device_get(model_vars)

    def model():  # jnp constants: numpy arrays cannot be indexed by traced values
        return nnx.merge(graphdef, *jax.tree.map(jnp.asarray, (params, model_vars)))

    out: dict[str, Callable] = {}
    head = model().head.split("+")
    if "ctc" in head:

        def ctc(audio_bs, audio_len_b):
            m = model()
            enc, lengths = m(audio_bs, audio_len_b, train=False)
            return jax.nn.log_softmax(m.ctc_logits(enc), axis=-1), lengths

        out["ctc"] = ctc
    if "rnnt" in head:

        def encoder(audio_bs, audio_len_b):
            m = model()
            enc, lengths = m(audio_bs, audio_len_b, train=False)
            return m.transducer.joiner.enc_proj(enc).astype(jnp.float32), lengths

        def predictor_init(tokens_b):
            init, _, _ = model().transducer.decoder_fns()
            return tuple(jax.tree.leaves(init(tokens_b.shape[0])))

        def predictor_step(*state_and_tokens):
            *leaves, tokens_b = state_and_tokens
            init, step, _ = model().transducer.decoder_fns()
            treedef = jax.tree.structure(init(1))
            pred, state = step(jax.tree.unflatten(treedef, leaves), tokens_b)
            return (pred.astype(jnp.float32), *jax.tree.leaves(state))

        def joiner(enc_proj_bj, pred_proj_bj):
            _, _, joint = model().transducer.decoder_fns()
            return jax.nn.log_softmax(joint(enc_proj_bj, pred_proj_bj).astype(jnp.float32), -1)

        out |= {
            "encoder": encoder,
            "predictor_init": predictor_init,
            "predictor_step": predictor_step,
            "joiner": joiner,
        }
    return out


def argument_specs(name: str, fns: dict[str, Callable], sample_rate: int) -> tuple:
    """The symbolic-shape arguments each function is exported for (b: batch, s: samples)."""
    min_samples = int(MIN_SECONDS * sample_rate)
    b, s = jax.export.symbolic_shape("b, s", constraints=(f"s >= {min_samples}",))
    audio = (jax.ShapeDtypeStruct((b, s), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.int32))
    if name in ("ctc", "encoder"):
        return audio
    (b,) = jax.export.symbolic_shape("b")  # the decoder's functions see no audio length
    tokens = jax.ShapeDtypeStruct((b,), jnp.int32)
    if name == "predictor_init":
        return (tokens,)
    if name == "joiner":
        enc_out = jax.eval_shape(fns["encoder"], *audio)[0]  # (b, t, J)
        pred = jax.eval_shape(fns["predictor_step"], *state_specs(fns, b), tokens)[0]
        return (
            jax.ShapeDtypeStruct((b, enc_out.shape[-1]), jnp.float32),
            jax.ShapeDtypeStruct((b, pred.shape[-1]), pred.dtype),
        )
    return (*state_specs(fns, b), tokens)  # predictor_step


def state_specs(fns: dict[str, Callable], b) -> tuple:
    """The predictor state's leaves for a batch of `b`."""
    return tuple(
        jax.ShapeDtypeStruct(x.shape, x.dtype)
        for x in jax.eval_shape(fns["predictor_init"], jax.ShapeDtypeStruct((b,), jnp.int32))
    )


def _names(name: str, n_state: int) -> tuple[list[str], list[str]]:
    """Input and output names of each function (the manifest's and the ONNX graph's)."""
    state = [f"state_{i}" for i in range(n_state)]
    return {
        "ctc": (["audio", "audio_len"], ["log_probs", "lengths"]),
        "encoder": (["audio", "audio_len"], ["enc_proj", "lengths"]),
        "predictor_init": (["tokens"], state),
        "predictor_step": ([*state, "tokens"], ["pred_proj", *state]),
        "joiner": (["enc_proj", "pred_proj"], ["log_probs"]),
    }[name]


def _describe(names: list[str], avals) -> list[dict]:
    return [
        {"name": n, "shape": [str(d) for d in a.shape], "dtype": str(a.dtype)}
        for n, a in zip(names, avals, strict=True)
    ]


def export_stablehlo(fns: dict[str, Callable], sample_rate: int, output: str) -> dict:
    """Write <name>.stablehlo for every function; returns the manifest's "functions"."""
    described = {}
    n_state = 0
    if "predictor_init" in fns:
        n_state = len(state_specs(fns, 1))
    for name, fn in fns.items():
        specs = argument_specs(name, fns, sample_rate)
        exported = jax.export.export(jax.jit(fn), platforms=("cpu", "cuda", "tpu"))(*specs)
        path = os.path.join(output, f"{name}.stablehlo")
        with open(path, "wb") as f:
            f.write(exported.serialize())
        inputs, outputs = _names(name, n_state)
        described[name] = {
            "file": os.path.basename(path),
            "inputs": _describe(inputs, exported.in_avals),
            "outputs": _describe(outputs, exported.out_avals),
            "platforms": list(exported.platforms),
        }
    return described


# ---------------------------------------------------------------- the command
def export_run(
    workdir: str,
    output: str,
    *,
    fmt: str = "stablehlo",
    step: int | None = None,
    data_dir: str | None = None,
    eval_split: str | None = None,
) -> dict:
    """Export RUN's checkpoint (latest unless `step`) to `output`; returns the manifest.

    `eval_split` ("" to skip; default the run's data.eval_split) is scored with the
    exported checkpoint and recorded in the manifest.

    Raises:
      UserError: not a run, no checkpoint, an unknown format, a split that is not prepared.
    """
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}: choose one of {FORMATS}")
    try:
        config = state_lib.load_run_config(workdir)
        with rules.axis_rules(state_lib.rules_from_config(config)):
            one = state_lib.mesh_from_config(_single_device(config), devices=jax.devices()[:1])
            run = state_lib.load_run(workdir, step=step, mesh=one)
            scores = None
            split = config.data.eval_split if eval_split is None else eval_split
            if split:
                data_dir = data_dir or config.data.dir
                result = evaluate.evaluate_run(run, config, data_dir, split)
                scores = {k: result[k] for k in ("split", "num_utts", "wer", "cer")}
                scores["data"] = os.path.abspath(data_dir)
    except (FileNotFoundError, ValueError, ckpt_lib.CheckpointError) as e:
        raise UserError(str(e)) from e
    os.makedirs(output, exist_ok=True)
    fns = inference_functions(run.spec.graphdef, run.params, run.model_vars)
    functions = export_stablehlo(fns, int(config.features.sample_rate), output)
    tokenizer_out = os.path.join(output, "tokenizer")
    shutil.copytree(run.tokenizer_dir, tokenizer_out, dirs_exist_ok=True)
    manifest = {
        "format": fmt,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "functions": functions,
        "audio": {
            "sample_rate": int(config.features.sample_rate),
            "min_samples": int(MIN_SECONDS * config.features.sample_rate),
            "dtype": "float32",
            "range": "[-1, 1]",
        },
        "features": dict(config.features.to_dict(), normalization="the run's, inside"),
        "tokenizer": {
            "dir": "tokenizer",
            "kind": run.tokenizer.kind,
            "vocab_size": run.tokenizer.vocab_size,
            "blank_id": run.tokenizer.blank_id,
            "files": sorted(os.listdir(tokenizer_out)),
        },
        "run": {
            "workdir": os.path.abspath(workdir),
            "step": run.step,
            "params_fingerprint": ckpt_lib.fingerprint(run.params),
            "head": config.model.head,
            "decoding": config.decoding.to_dict(),
            "config": config.to_dict(),
        },
        "eval": scores,
    }
    with open(os.path.join(output, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
    return manifest


def _single_device(config):
    """The run's config with a one-device mesh: the export traces one program."""
    c = config.copy_and_resolve_references()
    c.mesh.replica, c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1, 1
    return c


FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")

    def job() -> None:
        manifest = export_run(
            FLAGS.workdir,
            FLAGS.output,
            fmt=FLAGS.format,
            step=FLAGS.step,
            data_dir=FLAGS.data,
            eval_split=FLAGS.eval_split,
        )
        files = ", ".join(f["file"] for f in manifest["functions"].values())
        scores = manifest["eval"]
        print(
            f"exported step {manifest['run']['step']} of {FLAGS.workdir} to {FLAGS.output}: "
            f"{files}, {MANIFEST}"
            + (
                f"; {scores['split']} WER {scores['wer']:.2%} CER {scores['cer']:.2%}"
                if scores
                else ""
            ),
            file=sys.stderr,
        )
        summary = {"output": os.path.abspath(FLAGS.output), "step": manifest["run"]["step"]}
        print(json.dumps(summary | {"functions": list(manifest["functions"]), "eval": scores}))

    cli.run_job(job)


if __name__ == "__main__":
    mesh_lib.define_flags()
    flags.DEFINE_string("workdir", None, "Run directory written by jaxspeech.train.", required=True)
    flags.DEFINE_string("output", None, "Directory for the artifact.", required=True)
    flags.DEFINE_string("format", "stablehlo", f"One of {FORMATS}.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    flags.DEFINE_string("data", None, "Prepared data directory (default: the run's data.dir).")
    flags.DEFINE_string(
        "eval_split",
        None,
        "Split scored into the manifest (default: the run's data.eval_split; '' skips).",
    )
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=cli.parse_flags)
