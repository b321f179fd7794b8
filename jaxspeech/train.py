"""Train: `python -m jaxspeech.train --config configs/demo.py --workdir RUN [--config.k=v]`.

One readable function, `train_and_evaluate`, in banner sections: setup -> assets
-> data -> model & optimizer -> restore -> step -> loop -> final evaluation.
Restarting the same command resumes from the latest checkpoint in RUN.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from ml_collections import ConfigDict, config_flags

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import evaluate as eval_lib
from jaxspeech import optim
from jaxspeech.audio import augment
from jaxspeech.audio.features import stats_to_mean_std
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.losses import rnnt
from jaxspeech.losses.ctc import ctc_loss
from jaxspeech.metrics import images, perf
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules


class UserError(Exception):
    """A mistake in the command, config or data: reported as one line, no traceback."""


class TrainingDiverged(Exception):
    """train.max_nonfinite_steps steps in a row had a non-finite loss or gradient."""


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


# ---------------------------------------------------------------- waveform augmentation
def read_noise_list(path: str) -> tuple[str, ...]:
    """Noise files from JSON lines {"audio_filepath": ...} or one path per line; relative
    paths are relative to the list's directory.

    Raises:
      UserError: a missing list, a malformed line (named by its number), or no files.
    """
    if not os.path.isfile(path):
        raise UserError(f"noise manifest not found: {path}")
    base, files = os.path.dirname(os.path.abspath(path)), []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    line = json.loads(line)["audio_filepath"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise UserError(f"{path}:{line_no}: not a {{audio_filepath}} line") from e
            files.append(os.path.join(base, line))
    if not files:
        raise UserError(f"noise manifest {path} lists no files")
    return tuple(files)


def waveform_augmenter(config: ConfigDict) -> augment.WaveformAugmenter | None:
    """The loader's host-side augmentation from ``config.waveform_aug`` (None: all off)."""
    w = config.waveform_aug
    try:
        cfg = augment.WaveformAugmentConfig(
            speeds=tuple(w.speeds),
            noise_prob=w.noise_prob,
            snr_db=tuple(w.snr_db),
            noise_files=read_noise_list(w.noise_manifest) if w.noise_manifest else (),
            noise_exponents=tuple(w.noise_exponents),
            reverb_prob=w.reverb_prob,
            num_rirs=w.num_rirs,
            rt60=tuple(w.rt60),
            seed=config.seed,
        )
        return augment.WaveformAugmenter(cfg, config.features.sample_rate) if cfg.enabled else None
    except ValueError as e:  # A bad value, or a noise file that does not exist.
        raise UserError(f"config.waveform_aug: {e}") from e


# ---------------------------------------------------------------- assets
def install_assets(config: ConfigDict, workdir: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Copy the data's tokenizer and feature statistics into RUN/assets (first run only).

    Returns (tokenizer dir, mean (F,), std (F,)). A resumed run keeps its own
    assets; if the data directory's tokenizer changed since, that is an error.
    """
    data_dir, split = config.data.dir, config.data.train_split
    src_tok = os.path.join(data_dir, eval_lib.TOKENIZER)
    stats_path = os.path.join(data_dir, split, "stats.json")
    for p in (src_tok, stats_path):
        if not os.path.exists(p):
            raise UserError(
                f"{p} not found: data.dir={data_dir!r} is not a prepared corpus "
                f"(run `python -m data_prep.prepare ... --output {data_dir} --split {split}`)"
            )
    assets = os.path.join(workdir, eval_lib.ASSETS)
    dst_tok = os.path.join(assets, eval_lib.TOKENIZER)
    if jax.process_index() == 0 and not os.path.exists(dst_tok):
        os.makedirs(assets, exist_ok=True)
        shutil.copytree(src_tok, dst_tok + ".tmp", dirs_exist_ok=True)
        shutil.copy(stats_path, os.path.join(assets, "stats.json"))
        os.replace(dst_tok + ".tmp", dst_tok)
    _wait_for(dst_tok)
    if Tokenizer.load(src_tok).vocab_size != Tokenizer.load(dst_tok).vocab_size:
        raise UserError(
            f"the tokenizer in {src_tok} differs from this run's ({dst_tok}); "
            "use a new --workdir for a re-prepared corpus"
        )
    with open(os.path.join(assets, "stats.json")) as f:
        stats = json.load(f)
    expected = eval_lib.feature_config(config).as_dict()
    got = {k: stats["feature"].get(k) for k in expected}
    if any(
        not (got[k] == v or (isinstance(v, float) and math.isclose(got[k] or 0.0, v)))
        for k, v in expected.items()
    ):
        raise UserError(
            f"feature statistics in {stats_path} were computed with {got}, but the config "
            f"asks for {expected}; re-run data_prep.prepare with matching feature flags"
        )
    mean, std = stats_to_mean_std(stats["count"], stats["sum"], stats["sum_sq"])
    return dst_tok, mean, std


def _wait_for(path: str, timeout_s: float = 300.0) -> None:
    """Other processes wait for process 0 to install the assets (shared filesystem)."""
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout_s:
            raise UserError(f"{path} did not appear: is RUN on a filesystem all hosts share?")
        time.sleep(0.5)


# ---------------------------------------------------------------- the step
def rnnt_loss_scales(loss_cfg: ConfigDict, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(simple, pruned) loss weights at `step`: icefall's warm-up from (1, 0.1) to
    (simple_scale, 1) over rnnt_warmup_steps; the pruning bounds only mean something
    once the simple joiner has learned an alignment."""
    frac = jnp.clip(step / max(loss_cfg.rnnt_warmup_steps, 1), 0.0, 1.0)
    return 1.0 - frac * (1.0 - loss_cfg.simple_scale), 0.1 + 0.9 * frac


def model_losses(
    model: nnx.Module,
    batch: dict,
    key: jax.Array,
    step: jax.Array,
    loss_cfg: ConfigDict,
    blank_id: int,
) -> tuple[jax.Array, dict]:
    """Summed training objective of a (micro-)batch and the sums that normalize it.

    Returns (objective, sums): objective = sum over utterances of weight x loss;
    sums = {"tokens", "utterances", "skipped_infeasible", "skipped_label_overflow",
    "loss_<part>" (summed like the objective)}. Sums, not means, so micro-batches add up
    to exactly the full batch; the step divides by the batch's tokens. Utterances whose
    loss is infeasible (CTC: more labels than frames allow) or not finite get weight 0
    and are counted, never averaged in.
    """
    enc, enc_len = model(batch["audio"], batch["audio_len"], train=True, rngs=nnx.Rngs(key))
    labels, label_len = batch["labels"], batch["label_len"]
    weight = batch["weight"]
    parts, valid = {}, jnp.ones_like(weight, bool)
    if model.ctc is not None:
        ctc_b, ctc_ok = ctc_loss(
            model.ctc_logits(enc), enc_len, labels, label_len, blank_id=blank_id
        )
        parts["ctc"], valid = ctc_b, valid & ctc_ok
    if model.transducer is not None:
        tr = model.transducer
        enc_proj = tr.joiner.enc_proj(enc)
        pred = tr.predictor(labels)
        pred_proj = tr.joiner.pred_proj(pred)
        if loss_cfg.rnnt == "full":
            rnnt_b, rnnt_ok = rnnt.rnnt_loss(
                tr.joiner.joint,
                enc_proj,
                enc_len,
                pred_proj,
                labels,
                label_len,
                blank_id=blank_id,
                frames_per_chunk=loss_cfg.frames_per_chunk,
            )
            parts["rnnt"], valid = rnnt_b, valid & rnnt_ok
        else:
            simple_b, pruned_b, rnnt_ok = rnnt.rnnt_pruned_loss(
                tr.joiner.joint,
                enc_proj,
                enc_len,
                pred_proj,
                lambda x: tr.simple_am(x).astype(jnp.float32),  # run a chunk of frames at a time
                enc,
                tr.simple_lm(pred).astype(jnp.float32),
                labels,
                label_len,
                prune_range=loss_cfg.prune_range,
                blank_id=blank_id,
                frames_per_chunk=loss_cfg.frames_per_chunk,
            )
            simple_w, pruned_w = rnnt_loss_scales(loss_cfg, step)
            parts["rnnt_simple"], parts["rnnt_pruned"] = simple_b, pruned_b
            parts["rnnt"] = simple_w * simple_b + pruned_w * pruned_b
            valid = valid & rnnt_ok
    if "ctc" in parts and "rnnt" in parts:
        total_b = parts["rnnt"] + loss_cfg.ctc_weight * parts["ctc"]
    else:
        total_b = parts.get("rnnt", parts.get("ctc"))
    w = weight * valid
    sums = {
        "utterances": jnp.sum(w),
        "tokens": jnp.sum(w * label_len),
        "skipped_infeasible": jnp.sum(weight * (1.0 - valid)),
        "skipped_label_overflow": jnp.sum(batch["label_overflow"]).astype(jnp.float32),
    }
    for name, part in parts.items():
        sums[f"loss_{name}"] = jnp.sum(w * part)
    return jnp.sum(w * total_b), sums


def split_micro_batches(batch: dict, num: int) -> dict:
    """(B, ...) arrays -> (num, B / num, ...): micro-batch i is rows i, i + num, i + 2 num, ...

    Strided, not contiguous, so that every device's rows of the batch-sharded global
    array stay on that device in every micro-batch (no data moves between devices).
    """

    def split(x):
        b = x.shape[0]
        if b % num:
            raise ValueError(f"batch of {b} rows does not split into {num} micro-batches")
        y = jnp.swapaxes(x.reshape((b // num, num) + x.shape[1:]), 0, 1)
        return rules.constrain(y, (None, "batch") + (None,) * (x.ndim - 1))

    return jax.tree.map(split, batch)


def make_grads_fn(graphdef, blank_id: int, loss_cfg: ConfigDict) -> Callable:
    """(params, model_vars, batch, key, step) -> (summed gradients, sums incl. "objective")."""

    def objective(params, model_vars, batch, key, step):
        model = nnx.merge(graphdef, params, model_vars)
        return model_losses(model, batch, key, step, loss_cfg, blank_id)

    def grads_and_sums(params, model_vars, batch, key, step):
        (total, sums), grads = jax.value_and_grad(objective, has_aux=True)(
            params, model_vars, batch, key, step
        )
        return grads, sums | {"objective": total}

    return grads_and_sums


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    seed: int,
    blank_id: int,
    loss_cfg: ConfigDict,
    *,
    grad_accum: int = 1,
) -> Callable:
    """(params, model_vars, opt_state, batch, step) -> (params, opt_state, metrics).

    With grad_accum = k > 1 the batch is processed as k micro-batches in a `lax.scan`
    (activation memory of one micro-batch); gradients and loss sums accumulate in
    float32 and are normalized once by the whole batch's tokens, so the update equals
    the single-pass one up to summation order.

    A step whose objective or gradient norm is not finite changes nothing: parameters
    and optimizer state come back as they went in (metrics["nonfinite"] = 1). The test
    is on global values inside the one SPMD program, so every process skips the same
    steps. The step's randomness is `seed` folded with the step: (seed, step) is the
    whole RNG state a checkpoint needs.
    """
    if grad_accum < 1:
        raise ValueError(f"train.grad_accum must be >= 1, got {grad_accum}")
    grads_and_sums = make_grads_fn(graphdef, blank_id, loss_cfg)

    def train_step(params, model_vars, opt_state, batch, step):
        key = jax.random.fold_in(step_key(seed), step)
        if grad_accum == 1:
            grads, sums = grads_and_sums(
                params, model_vars, batch, jax.random.fold_in(key, 0), step
            )
        else:
            micro = split_micro_batches(batch, grad_accum)

            def body(acc, xs):
                i, mb = xs
                out = grads_and_sums(params, model_vars, mb, jax.random.fold_in(key, i), step)
                return jax.tree.map(jnp.add, acc, out), None

            shapes = jax.eval_shape(
                grads_and_sums, params, model_vars, jax.tree.map(lambda x: x[0], micro), key, step
            )
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum), micro))
        # Per-token objective: buckets of different batch sizes get the same gradient scale.
        tokens = jnp.maximum(sums["tokens"], 1.0)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(sums["objective"]) & jnp.isfinite(grad_norm)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        # Skipped, not clipped: a NaN anywhere would otherwise spread into every weight.
        params, opt_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old),
            (new_params, new_opt_state),
            (params, opt_state),
        )
        metrics = {
            "loss": sums["objective"] / tokens,
            "utt_loss": sums["objective"] / jnp.maximum(sums["utterances"], 1.0),
            "grad_norm": grad_norm,
            "param_norm": optax.tree.norm(params),
            "nonfinite": 1.0 - finite.astype(jnp.float32),
        }
        for k, v in sums.items():
            metrics[k] = v / tokens if k.startswith("loss_") else v
        return params, opt_state, metrics

    return train_step


def step_key(seed: int) -> jax.Array:
    """The base key of the training step's randomness (dropout, SpecAugment)."""
    return jax.random.key(seed + 1)


def init_opt_state(
    tx: optax.GradientTransformation, params: dict, mesh, param_shardings: dict
) -> tuple:
    """Optimizer state with every parameter-shaped leaf (Adam's moments) sharded exactly
    like its parameter, so FSDP shards optimizer memory too; other leaves (step counts)
    are replicated. Returns (state, its shardings).

    The shardings are given to `jit` explicitly: the moments are zeros that depend on no
    parameter value, so XLA alone would put them on one device.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = optax.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        jax.eval_shape(tx.init, params),
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    return jax.jit(tx.init, out_shardings=shardings)(params), shardings


# ---------------------------------------------------------------- monitoring
def step_flops(config: ConfigDict, vocab_size: int, blank_id: int, batch_shapes: dict) -> float:
    """Model FLOPs of one training step on a global batch of `batch_shapes`, by XLA's count.

    XLA's cost analysis counts a while-loop body once, whatever its trip count, and
    counts rematerialized work twice; model FLOPs (the MFU numerator) are neither. So
    the count comes from lowering (never compiling or running) the same step with the
    Conformer's layers and the transducer loss's chunks unrolled and no
    rematerialization, on abstract arguments. Loops over time (an LSTM encoder's
    recurrence, the transducer loss recursions) are still counted once: for an LSTM
    encoder the figure is a lower bound.
    """
    c = ConfigDict(config.to_dict())
    if "conformer" in c.model:
        c.model.conformer.scan_layers = False
        c.model.conformer.remat = "none"
    c.loss.frames_per_chunk = None  # the transducer joiner's chunk loop, unrolled likewise
    model = nnx.eval_shape(lambda: eval_lib.make_model(c, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, eval_lib.FeatureStats)
    params, model_vars = nnx.to_pure_dict(params), nnx.to_pure_dict(model_vars)
    tx, _ = optim.make_optimizer(c.optim, int(c.train.num_steps))
    opt_state = jax.eval_shape(tx.init, params)
    step = make_train_step(graphdef, tx, 0, blank_id, c.loss)
    cost = jax.jit(step).lower(params, model_vars, opt_state, batch_shapes, jnp.int32(0))
    analysis = cost.cost_analysis()
    return float((analysis or {}).get("flops", 0.0))


def describe_compiled(compiled, shapes: dict, flops: float, sample_rate: int) -> str:
    """One line per compiled batch shape: model GFLOP and XLA's per-device memory plan."""
    b, s = shapes["audio"].shape
    mem = compiled.memory_analysis()
    text = f"compiled the step for batch {b} x {s / sample_rate:.2f} s: {flops / 1e9:.1f} GFLOP"
    if mem is not None:
        text += (
            f"; per device: arguments {mem.argument_size_in_bytes / 2**20:.1f} MiB, "
            f"temporaries {mem.temp_size_in_bytes / 2**20:.1f} MiB"
        )
    return text


def peek_rows(local: dict, rows: int, samples: int) -> dict:
    """The first `rows` rows of a host-local batch, audio zero-padded (or cut) to `samples`
    and missing rows left empty (weight 0): one fixed shape for the periodic sample
    decoding and spectrograms (one compilation, not one per bucket)."""
    have = min(rows, local["audio"].shape[0])
    n = min(samples, local["audio"].shape[1])
    u = local["labels"].shape[1]
    out = {
        "audio": np.zeros((rows, samples), np.float32),
        "audio_len": np.full((rows,), samples, np.int32),
        "labels": np.zeros((rows, u), np.int32),
        "label_len": np.zeros((rows,), np.int32),
        "weight": np.zeros((rows,), np.float32),
    }
    out["audio"][:have, :n] = local["audio"][:have, :n]
    out["audio_len"][:have] = np.minimum(local["audio_len"][:have], samples)
    for k in ("labels", "label_len", "weight"):
        out[k][:have] = local[k][:have]
    return out


def make_features_fn(graphdef) -> Callable:
    """(params, model_vars, audio, audio_len, key) -> (clean, augmented) (B, T, F) features."""

    @jax.jit
    def features_fn(params, model_vars, audio_bs, audio_len_b, key):
        model = nnx.merge(graphdef, params, model_vars)
        clean, _ = model.frontend(audio_bs, audio_len_b, train=False, rngs=None)
        augmented, lengths = model.frontend(audio_bs, audio_len_b, train=True, rngs=nnx.Rngs(key))
        return clean, augmented, lengths

    return features_fn


# ---------------------------------------------------------------- faults
class BatchIdLog:
    """RUN/batch_ids/p<process>.jsonl: {"step": s, "ids": [...]} per step, the utterances
    of this process's rows (monitor.log_batch_ids). Lines are flushed as written, so a
    killed run keeps them; steps replayed after a restart are written again, and the last
    line of a step is the one that counted. An audit of data order across restarts."""

    def __init__(self, workdir: str):
        os.makedirs(os.path.join(workdir, "batch_ids"), exist_ok=True)
        path = os.path.join(workdir, "batch_ids", f"p{jax.process_index()}.jsonl")
        self._f = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, step: int, ids: list[str]) -> None:
        self._f.write(json.dumps({"step": step, "ids": list(ids)}) + "\n")


def read_batch_ids(workdir: str, process: int = 0) -> dict[int, list[str]]:
    """{step: ids} from a BatchIdLog; a step written twice (replayed) keeps its last line."""
    out: dict[int, list[str]] = {}
    with open(os.path.join(workdir, "batch_ids", f"p{process}.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):  # a line cut by a kill is not a record
                row = json.loads(line)
                out[row["step"]] = row["ids"]
    return out


def write_nonfinite_diagnostics(
    workdir: str,
    step: int,
    grads_fn: Callable,
    params: dict,
    model_vars: dict,
    batch: dict,
    local: dict,
    metrics: dict,
    seed: int,
) -> str:
    """What the last non-finite step looked like, in RUN/diagnostics/nonfinite-step<N>/:
    report.json (non-finite counts per parameter and per gradient, the loss parts, this
    process's rows with non-finite or empty audio) and batch_p<i>.npz (this process's rows,
    to replay the step). Every process must call it (the gradients are a collective).
    Returns the directory."""
    key = jax.random.fold_in(jax.random.fold_in(step_key(seed), step - 1), 0)

    @jax.jit
    def counts(params, model_vars, batch):
        grads, sums = grads_fn(params, model_vars, batch, key, jnp.int32(step - 1))
        bad = lambda t: jax.tree.map(lambda x: jnp.sum(~jnp.isfinite(x)), t)  # noqa: E731
        return bad(params), bad(grads), sums

    p_bad, g_bad, sums = jax.device_get(counts(params, model_vars, batch))
    flat = lambda t: {  # noqa: E731
        jax.tree_util.keystr(k): int(v) for k, v in jax.tree_util.tree_flatten_with_path(t)[0]
    }
    audio = local["audio"]
    rows = []
    for i in range(audio.shape[0]):
        n = int(local["audio_len"][i])
        finite = bool(np.all(np.isfinite(audio[i, :n])))
        peak = float(np.max(np.abs(audio[i, :n]))) if n and finite else None
        if not finite or not peak:
            rows.append({"row": i, "audio_len": n, "finite": finite, "peak": peak})
    out = os.path.join(workdir, "diagnostics", f"nonfinite-step{step}")
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"batch_p{jax.process_index()}.npz"), **local)
    if jax.process_index() == 0:
        report = {
            "step": step,
            "metrics": {k: float(v) for k, v in jax.device_get(metrics).items()},
            "loss_sums": {k: float(v) for k, v in sums.items()},
            "nonfinite_params": {k: v for k, v in flat(p_bad).items() if v},
            "nonfinite_grads": {k: v for k, v in flat(g_bad).items() if v},
            "suspect_rows_p0": rows,
        }
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)
    return out


# ---------------------------------------------------------------- train_and_evaluate
def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
    """Trains `config` in `workdir` (resuming if it holds checkpoints); returns the final eval."""
    if not os.path.isdir(config.data.dir):
        raise UserError(
            f"data directory {config.data.dir!r} does not exist; prepare it with "
            "`python -m data_prep.prepare` or set --config.data.dir"
        )
    try:
        mesh = mesh_lib.make_mesh(config.mesh.to_dict())
    except mesh_lib.MeshConfigError as e:
        raise UserError(str(e)) from e
    return _train_and_evaluate(config, workdir, mesh)


def _train_and_evaluate(config: ConfigDict, workdir: str, mesh) -> dict:
    # ---------------------------------------------------------- setup
    # Models are built outside the mesh context (Flax would read their logical axis names
    # as mesh axes); every jitted function is traced inside it (`jax.set_mesh` below), so
    # the models' logical-axis constraints (rules.constrain) take effect.
    os.makedirs(workdir, exist_ok=True)
    if config.train.compile_cache_dir:
        cache = config.train.compile_cache_dir.format(workdir=os.path.abspath(workdir))
        jax.config.update("jax_compilation_cache_dir", cache)
    log(
        f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}, "
        f"{jax.process_count()} process(es); mesh {dict(mesh.shape)}"
    )

    # ---------------------------------------------------------- assets
    tokenizer_dir, mean, std = install_assets(config, workdir)
    tokenizer = Tokenizer.load(tokenizer_dir)

    # ---------------------------------------------------------- data
    grad_accum = int(config.train.grad_accum)
    if grad_accum < 1:
        raise UserError(f"train.grad_accum must be >= 1, got {grad_accum}")
    loader_shards = int(config.data.loader_shards)
    if loader_shards < 0 or (loader_shards and loader_shards % jax.process_count()):
        raise UserError(
            f"data.loader_shards={loader_shards} must be 0 (one per process) or a multiple of "
            f"the {jax.process_count()} processes"
        )
    # Every micro-batch splits evenly over the batch shards; every loader shard (and
    # process) gets equal rows.
    multiple_of = math.lcm(
        mesh_lib.num_batch_shards(mesh) * grad_accum, loader_shards or jax.process_count()
    )
    spec = pipeline_lib.make_bucket_spec(
        config.data.bucket_boundaries,
        config.data.batch_seconds,
        config.data.max_tokens_per_second,
        config.features.sample_rate,
        multiple_of=multiple_of,
    )
    augmenter = waveform_augmenter(config)
    try:
        train_pipe = pipeline_lib.make_pipeline(
            data_dir=config.data.dir,
            split=config.data.train_split,
            tokenizer_dir=tokenizer_dir,
            spec=spec,
            seed=config.seed,
            train=True,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            loader_shards=loader_shards,
            num_workers=config.data.num_workers,
            prefetch=config.data.prefetch,
            speeds=augmenter.cfg.speeds if augmenter else (1.0,),
            augment=augmenter,
            with_text=bool(config.monitor.log_batch_ids),
        )
    except FileNotFoundError as e:
        raise UserError(str(e)) from e
    log(f"train data: {train_pipe.describe()}")
    if augmenter is not None:
        log(f"waveform augmentation (host): {augmenter.cfg}")
    train_iter = train_pipe.iterator()

    # ---------------------------------------------------------- model & optimizer
    try:
        if config.loss.rnnt not in ("pruned", "full"):
            raise ValueError(f"loss.rnnt must be 'pruned' or 'full', got {config.loss.rnnt!r}")
        eval_lib.decoding_method(config)
        graphdef, abs_params, abs_vars, p_shard, v_shard, p_axes = eval_lib.abstract_model(
            config, tokenizer.vocab_size, mesh, with_axes=True
        )
    except ValueError as e:  # A bad model, loss or decoding setting.
        raise UserError(f"config: {e}") from e

    def init_params():
        model = eval_lib.make_model(config, tokenizer.vocab_size, config.seed)
        return nnx.to_pure_dict(nnx.state(model, nnx.Param))

    params = jax.jit(init_params, out_shardings=p_shard)()
    model_vars = jax.device_put({"frontend": {"mean": mean, "std": std}}, v_shard)
    log(
        f"model: {config.model.encoder} encoder, {config.model.head} head, "
        f"{config.model.dtype} compute, float32 parameters\n"
        + rules.describe_shardings(abs_params, p_shard, mesh, p_axes)
    )
    num_steps = int(config.train.num_steps)
    tx, schedule = optim.make_optimizer(config.optim, num_steps)
    opt_state, o_shard = init_opt_state(tx, params, mesh, p_shard)

    # ---------------------------------------------------------- restore
    # Resume order: the latest committed checkpoint in RUN (a corrupt one is set aside
    # and the one before used), else --config.init_from (parameters only), else scratch.
    replicated = NamedSharding(mesh, PartitionSpec())
    tr = config.train
    ckpt = ckpt_lib.Checkpointer(
        workdir,
        keep=tr.keep_checkpoints,
        keep_best=tr.keep_best,
        every_steps=tr.checkpoint_every,
        every_minutes=tr.checkpoint_minutes,
    )
    rng = np.asarray(jax.random.key_data(step_key(config.seed)))
    t0 = time.time()
    try:
        found = ckpt.restore_latest(
            warn=log,
            abstract_model={"params": abs_params, "model_vars": abs_vars},
            abstract_train={
                "opt_state": ckpt_lib.abstract_like(opt_state, o_shard),
                "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
                "rng": jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=replicated),
            },
            data_iter=train_iter,
        )
    except ckpt_lib.CheckpointError as e:
        raise UserError(
            f"{e}\nuse a new --workdir, or the config that run was trained with "
            f"({os.path.join(workdir, 'config.json')})"
        ) from e
    start = 0
    if found is not None:
        start, restored = found
        params = restored[ckpt_lib.MODEL]["params"]
        model_vars = restored[ckpt_lib.MODEL]["model_vars"]
        opt_state = restored[ckpt_lib.TRAIN]["opt_state"]
        saved_rng = np.asarray(jax.device_get(restored[ckpt_lib.TRAIN]["rng"]))
        if not np.array_equal(saved_rng, rng):
            raise UserError(
                f"checkpoint {start} was trained with another config.seed than {config.seed}: "
                "resuming would change every random stream; use that seed or a new --workdir"
            )
        log(f"resumed from step {start} in {time.time() - t0:.1f}s")
    elif config.init_from:
        try:
            src_step, src = ckpt_lib.load_model(
                config.init_from, {"params": abs_params, "model_vars": abs_vars}
            )
        except ckpt_lib.CheckpointError as e:
            raise UserError(f"config.init_from: {e}") from e
        params = src["params"]  # this run's own feature statistics stay
        log(
            f"initialized parameters from {config.init_from} (step {src_step}) in "
            f"{time.time() - t0:.1f}s"
        )
    if jax.process_index() == 0:  # after the restore: a refused config must not replace it
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=1))
    preemption = ckpt_lib.Preemption()

    # ---------------------------------------------------------- step
    batch_shard = {
        k: mesh_lib.batch_sharding(mesh, nd)
        for k, nd in (
            ("audio", 2),
            ("audio_len", 1),
            ("labels", 2),
            ("label_len", 1),
            ("weight", 1),
            ("label_overflow", 1),
        )
    }
    train_step = jax.jit(
        make_train_step(
            graphdef, tx, config.seed, tokenizer.blank_id, config.loss, grad_accum=grad_accum
        ),
        in_shardings=(p_shard, v_shard, o_shard, batch_shard, None),
        out_shardings=(p_shard, o_shard, None),
        donate_argnums=(0, 2),
    )
    decode_fn = eval_lib.make_decode_fn(graphdef, config, tokenizer.blank_id)
    features_fn = make_features_fn(graphdef)
    writer = MetricWriter(
        os.path.join(workdir, "tensorboard"), jsonl_path=os.path.join(workdir, "metrics.jsonl")
    )
    mon, sr = config.monitor, config.features.sample_rate
    device_kind = jax.devices()[0].device_kind
    peak = perf.peak_flops_per_device(device_kind, config.model.dtype, mon.peak_tflops)
    if peak is None:
        log(f"MFU: no peak FLOP/s known for {device_kind!r}; set --config.monitor.peak_tflops")
    compiled: dict[tuple, tuple] = {}  # batch shape -> (executable, model FLOPs)
    goodput = perf.Goodput()

    def compiled_step(batch: dict, step: int) -> tuple[Callable, float]:
        """The step's executable for this batch shape, compiled (and its FLOPs counted) once."""
        key = tuple(batch["audio"].shape)
        if key not in compiled:
            with goodput.phase("compile"):
                shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
                with jax.set_mesh(mesh):
                    lowered = train_step.lower(
                        params, model_vars, opt_state, batch, jnp.int32(step)
                    )
                exe = lowered.compile()
                flops = step_flops(config, tokenizer.vocab_size, tokenizer.blank_id, shapes)
                compiled[key] = (exe, flops)
                log(describe_compiled(exe, shapes, flops, sr))
        return compiled[key]

    def run_eval(step: int) -> dict:
        with goodput.phase("eval"), jax.set_mesh(mesh):
            result = eval_lib.evaluate_split(
                config=config,
                decode_fn=decode_fn,
                params=params,
                model_vars=model_vars,
                mesh=mesh,
                data_dir=config.data.dir,
                split=config.data.eval_split,
                tokenizer_dir=tokenizer_dir,
            )
        eval_lib.write_result(workdir, result, step)
        writer.scalars(
            step,
            {
                f"eval/{result['split']}/wer": result["wer"],
                f"eval/{result['split']}/cer": result["cer"],
            },
        )
        log(
            f"eval step {step}: {result['split']} WER {result['wer']:.2%} CER {result['cer']:.2%} "
            f"({result['num_utts']} utts, {result['eval_seconds']}s)"
        )
        for ex in result["examples"]:
            log(f"  ref: {ex['ref']}\n  hyp: {ex['hyp']}")
        return result

    # At least monitor.num_samples rows, a multiple of the batch shards and processes.
    peek_unit = math.lcm(mesh_lib.num_batch_shards(mesh), jax.process_count())
    peek_rows_global = peek_unit * max(1, math.ceil(mon.num_samples / peek_unit))
    peek_samples = int(math.ceil(max(spec.boundaries) * sr))

    def show_samples(step: int, local: dict) -> None:
        """Decoded training rows next to their references, and spectrograms of a few rows
        before and after SpecAugment, to the console and TensorBoard."""
        with goodput.phase("eval"), jax.set_mesh(mesh):
            rows = peek_rows(local, peek_rows_global // jax.process_count(), peek_samples)
            arrays = mesh_lib.host_to_global(mesh, {k: rows[k] for k in ("audio", "audio_len")})
            out = decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
            out = {k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()}
            hyps = eval_lib.hypotheses(out, config, tokenizer.blank_id)
            key = jax.random.fold_in(jax.random.key(config.seed + 2), step)
            clean, augmented, lengths = features_fn(
                params, model_vars, arrays["audio"], arrays["audio_len"], key
            )
            clean, augmented, lengths = (
                mesh_lib.to_host_local(mesh, x) for x in (clean, augmented, lengths)
            )
        lines = []
        for i in range(min(mon.num_samples, len(hyps))):
            if not rows["weight"][i]:
                continue
            ref = tokenizer.decode(rows["labels"][i, : rows["label_len"][i]].tolist())
            lines.append(f"  ref: {ref}\n  hyp: {tokenizer.decode(hyps[i])}")
        log(f"samples at step {step}:\n" + "\n".join(lines))
        writer.text(step, "samples", "\n\n".join(ln.replace("\n", "  \n") for ln in lines))
        n = int(lengths[0])
        writer.image(
            step,
            "spectrogram/clean_vs_augmented",
            images.stack_images(
                [images.spectrogram_image(clean[0, :n]), images.spectrogram_image(augmented[0, :n])]
            ),
        )

    # ---------------------------------------------------------- loop
    log(
        f"training steps {start} -> {num_steps}; {len(spec.boundaries)} batch shapes: "
        f"{spec.shapes()}" + (f"; {grad_accum} micro-batches per step" if grad_accum > 1 else "")
    )
    pending: list[dict] = []
    t_start, steps_window, flops_window = time.time(), 0, 0.0
    # train.run_steps > 0 ends this invocation early (job queues with wall-time limits:
    # resubmit the same command and it resumes); the schedule still spans num_steps.
    stop = min(num_steps, start + tr.run_steps) if tr.run_steps else num_steps
    nonfinite_run = nonfinite_total = 0
    ids_log = BatchIdLog(workdir) if mon.log_batch_ids else None
    result: dict = {}

    def save(done: int, why: str, eval_result: dict | None) -> None:
        t0 = time.time()
        with goodput.phase("checkpoint"):
            ckpt.save(
                done,
                model={"params": params, "model_vars": model_vars},
                # Replicated global arrays: Orbax refuses host-local arrays on many hosts.
                train={
                    "opt_state": opt_state,
                    "step": jax.device_put(np.int32(done), replicated),
                    "rng": jax.device_put(rng, replicated),
                },
                data_iter=train_iter,
                meta={"config": json.loads(config.to_json_best_effort()), "reason": why},
                metrics={ckpt_lib.BEST_METRIC: eval_result["wer"]} if eval_result else None,
            )
        log(f"checkpoint {done} ({why}): saving in the background ({time.time() - t0:.1f}s)")

    for step in range(start, stop):
        with goodput.phase("data"):
            local = next(train_iter)
            ids = local.pop("id", None)
            local.pop("text", None)
            audio_s = float(np.sum(local["audio_len"] * local["weight"])) / sr
            batch = mesh_lib.host_to_global(mesh, local)
        if ids_log is not None:
            ids_log.write(step + 1, [i for i, w in zip(ids, local["weight"]) if w])
        exe, flops = compiled_step(batch, step)
        with goodput.phase("compute"):
            params, opt_state, metrics = exe(params, model_vars, opt_state, batch, jnp.int32(step))
            # Waiting here splits data wait from compute; the loader's threads and
            # workers keep reading ahead meanwhile.
            skipped = bool(metrics["nonfinite"])
        done = step + 1
        if skipped:
            nonfinite_run, nonfinite_total = nonfinite_run + 1, nonfinite_total + 1
            log(
                f"step {done}: non-finite loss or gradient (loss {float(metrics['loss'])}, "
                f"grad norm {float(metrics['grad_norm'])}): update skipped, state unchanged "
                f"({nonfinite_run} in a row, {nonfinite_total} in this run)"
            )
            if nonfinite_run >= tr.max_nonfinite_steps:
                report = write_nonfinite_diagnostics(
                    workdir,
                    done,
                    make_grads_fn(graphdef, tokenizer.blank_id, config.loss),
                    params,
                    model_vars,
                    batch,
                    local,
                    metrics,
                    config.seed,
                )
                ckpt.wait()
                raise TrainingDiverged(
                    f"{nonfinite_run} steps in a row ({done - nonfinite_run + 1}..{done}) had a "
                    f"non-finite loss or gradient (train.max_nonfinite_steps="
                    f"{tr.max_nonfinite_steps}); diagnostics in {report}. The last checkpoint "
                    f"is step {ckpt.latest_step()}: lower optim.peak_lr, check the data named "
                    "there, or raise the limit."
                )
        else:
            nonfinite_run = 0
        pending.append(metrics | {"audio_seconds": audio_s})
        steps_window += 1
        flops_window += flops
        if done % tr.log_every == 0 or done in (num_steps, stop):
            fetched = jax.device_get(pending)
            times = goodput.window()
            # Means over the steps that updated (a skipped step's loss is not finite).
            good = [p for p in fetched if not p["nonfinite"]] or fetched
            m = {k: float(np.mean([p[k] for p in good])) for k in fetched[0]}
            sums = {
                k: float(np.sum([p[k] for p in fetched]))
                for k in (
                    "audio_seconds",
                    "skipped_infeasible",
                    "skipped_label_overflow",
                    "nonfinite",
                )
            }
            wall = times["wall"]
            audio_per_s = sums["audio_seconds"] * jax.process_count() / wall
            rate = steps_window / wall
            mfu = perf.mfu(flops_window, times["compute"], jax.device_count(), peak)
            step_ms = 1000 * times["compute"] / steps_window
            wait_ms = 1000 * times["data"] / steps_window
            parts = {k[5:]: v for k, v in m.items() if k.startswith("loss_")}
            scalars = {f"train/loss_{k}": v for k, v in parts.items()} | {
                "train/loss": m["loss"],
                "train/utt_loss": m["utt_loss"],
                "train/grad_norm": m["grad_norm"],
                "train/param_norm": m["param_norm"],
                "train/lr": float(schedule(step)),
                "train/steps_per_s": rate,
                "train/audio_s_per_s": audio_per_s,
                "train/audio_hours_per_s": audio_per_s / 3600,
                "train/skipped_infeasible": sums["skipped_infeasible"],
                "train/skipped_label_overflow": sums["skipped_label_overflow"],
                "train/skipped_nonfinite_steps": sums["nonfinite"],
                "perf/step_compute_ms": step_ms,
                "perf/data_wait_ms": wait_ms,
                "perf/goodput": goodput.goodput(),
            }
            scalars |= {f"perf/seconds_{k}": v for k, v in times.items() if k != "wall"}
            if mfu is not None:
                scalars["perf/mfu"] = mfu
            writer.scalars(done, scalars)
            log(
                f"{perf.progress_line(done, num_steps, rate)} | loss {m['loss']:.3f} "
                f"(utt {m['utt_loss']:.1f}"
                + "".join(f", {k} {v:.3f}" for k, v in parts.items() if len(parts) > 1)
                + f") | grad {m['grad_norm']:.2f} | lr {float(schedule(step)):.2e} | "
                f"{audio_per_s:.0f} audio s/s | step {step_ms:.0f} ms + data wait {wait_ms:.0f} ms"
                + (f" | MFU {mfu:.1%}" if mfu is not None else "")
                + f" | goodput {goodput.goodput():.0%}"
                + (
                    f" | skipped {sums['skipped_infeasible']:.0f} infeasible, "
                    f"{sums['skipped_label_overflow']:.0f} too long"
                    if sums["skipped_infeasible"] or sums["skipped_label_overflow"]
                    else ""
                )
                + (
                    f" | {sums['nonfinite']:.0f} non-finite steps skipped"
                    if sums["nonfinite"]
                    else ""
                )
            )
            pending, steps_window, flops_window = [], 0, 0.0
        # Evaluate before saving, so the checkpoint carries its WER (best-checkpoint keeping).
        eval_result = None
        if (tr.eval_every and done % tr.eval_every == 0 and done < num_steps) or (
            done == num_steps and tr.eval_at_end
        ):
            eval_result = run_eval(done)
            result = eval_result if done == num_steps else result
        preempted = preemption.reached(done)  # every process, every step
        why = (
            "preemption"
            if preempted
            else ("end of this run" if done in (num_steps, stop) else ckpt.due(done))
        )
        if why:
            save(done, why, eval_result)
        if preempted:
            with goodput.phase("checkpoint"):
                ckpt.close()
            preemption.close()
            writer.close()
            print(  # every process: each host's log shows where it stopped
                f"preempted: all processes stopped after step {done} and saved checkpoint "
                f"{done}; rerun the same command to resume",
                flush=True,
            )
            return {"preempted_at_step": done}
        if mon.samples_every and done % mon.samples_every == 0:
            show_samples(done, local)
    with goodput.phase("checkpoint"):
        ckpt.wait()
    preemption.close()
    if stop > start:
        totals = goodput.totals()
        log(
            f"trained steps {start} -> {stop} in {(time.time() - t_start) / 60:.1f} min; "
            f"goodput {goodput.goodput():.0%} ("
            + ", ".join(f"{k} {v:.0f}s" for k, v in totals.items() if k != "wall" and v >= 0.5)
            + ")"
            + (f"; {nonfinite_total} non-finite steps skipped" if nonfinite_total else "")
        )
    if stop < num_steps:
        log(f"stopping at step {stop} of {num_steps} (train.run_steps); rerun to resume")
        writer.close()
        ckpt.close()
        return {}

    # ---------------------------------------------------------- final evaluation
    if stop == start and tr.eval_at_end:  # a finished run, rerun: evaluate again
        result = run_eval(num_steps)
    writer.close()
    ckpt.close()
    return result


# ---------------------------------------------------------------- CLI
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, logs, assets.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None or _WORKDIR.value is None:
        raise app.UsageError("--config and --workdir are required")
    try:
        try:
            how = mesh_lib.initialize()  # before anything touches a device
        except mesh_lib.DistributedConfigError as e:
            raise UserError(str(e)) from e
        if how != "single":  # every process says it joined
            print(
                f"jax.distributed: process {jax.process_index()} of {jax.process_count()} "
                f"({how}), pid {os.getpid()}",
                flush=True,
            )
        train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except TrainingDiverged as e:
        print(f"error: training diverged: {e}", file=sys.stderr)
        sys.exit(3)
    except Exception as e:
        if jax.process_count() == 1:
            raise
        # In a multi-process job the usual cause is a peer that died: its collectives fail
        # here (or the heartbeat times out). Say so, and leave at once: JAX's shutdown
        # barrier would otherwise wait for the dead peer until the heartbeat timeout.
        import traceback

        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:400]
        print(
            f"error: process {jax.process_index()} of {jax.process_count()} stopped: "
            f"{type(e).__name__}: {first}\n(if another process died or was killed, this is "
            "how the others stop: see its log; the job resumes from the last checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(4)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with config mistakes (unknown key, bad value) as one clear line."""
    try:
        rest = flags.FLAGS(argv)
        if _CONFIG.value is not None:  # the config file loads lazily: load it now
            _CONFIG.value.to_dict()
        return rest
    except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
        # ml_collections nests the cause's traceback in the message: keep its last line.
        lines = [ln.strip() for ln in str(e).replace("\\n", "\n").splitlines() if ln.strip()]
        msg = " ".join(lines) if len(lines) <= 3 else lines[-1]
        msg = msg.replace("\\'", "'").strip("'")
        print(f"error: bad command line: {msg}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    app.run(main, flags_parser=parse_flags)
