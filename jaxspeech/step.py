"""The training step: loss wiring, gradients (with accumulation), the guarded update.

`make_train_step` returns a pure function of (params, model_vars, opt_state, batch,
step) that `jax.jit` compiles once per batch shape; `step_flops` counts the model FLOPs
of one step (the MFU numerator). Built on `jaxspeech.state`; used by training, the
benchmarks and the tests alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from ml_collections import ConfigDict

from jaxspeech import optim
from jaxspeech import state as state_lib
from jaxspeech.losses import distill as distill_losses
from jaxspeech.models.frontend import FeatureStats
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules, sync

# Host batch arrays and their ranks: what the loader yields and the step reads.
BATCH_RANKS = {
    "audio": 2,
    "audio_len": 1,
    "labels": 2,
    "label_len": 1,
    "weight": 1,
    "label_overflow": 1,
    "corrupt": 1,
}


# With soft targets (config.distill.targets): a teacher's per-frame top-k for the rows of the
# untranscribed stream (zeros elsewhere): token indices and log-probabilities (B, T', k),
# the teacher's frame counts, and which rows learn from them.
SOFT_TARGET_RANKS = {
    "teacher_idx": 3,
    "teacher_logp": 3,
    "teacher_len": 1,
    "soft": 1,
    "no_target": 1,  # untranscribed rows the teacher could not label: counted, not trained
}


def batch_shardings(mesh: Mesh, *, soft_targets: bool = False) -> dict[str, NamedSharding]:
    """Every batch array split by rows over the mesh's batch axes."""
    ranks = BATCH_RANKS | (SOFT_TARGET_RANKS if soft_targets else {})
    return {k: mesh_lib.batch_sharding(mesh, nd) for k, nd in ranks.items()}


@dataclasses.dataclass(frozen=True)
class SoftTargets:
    """The soft-target loss of `config.distill` (jaxspeech.losses.distill.distill_loss):
    weight x (KL or cross-entropy to the teacher's top-k distribution) summed over frames."""

    weight: float = 1.0
    kind: str = "kl"
    rest: str = "spread"
    temperature: float = 1.0

    @classmethod
    def from_config(cls, distill_cfg) -> SoftTargets | None:
        """None unless `config.distill` names a targets directory."""
        if distill_cfg is None or not distill_cfg.get("targets"):
            return None
        out = cls(
            float(distill_cfg.weight),
            distill_cfg.loss,
            distill_cfg.rest,
            float(distill_cfg.temperature),
        )
        if out.kind not in distill_losses.LOSS_KINDS or out.rest not in distill_losses.REST_MODES:
            raise ValueError(
                f"distill.loss must be one of {distill_losses.LOSS_KINDS} and distill.rest one of "
                f"{distill_losses.REST_MODES}, got {out.kind!r} and {out.rest!r}"
            )
        if out.temperature <= 0 or out.weight < 0:
            raise ValueError("distill.temperature must be > 0 and distill.weight >= 0")
        return out


def normalizer(sums: dict) -> jax.Array:
    """What a step's summed objective is divided by: label tokens, plus the teacher frames
    of soft-target rows (a batch comes from one stream: per-token CTC or per-frame KL)."""
    n = sums["tokens"]
    if "soft_frames" in sums:
        n = n + sums["soft_frames"]
    return jnp.maximum(n, 1.0)


def soft_target_losses(
    model: nnx.Module, enc, enc_len, batch: dict, soft: SoftTargets
) -> tuple[jax.Array, dict]:
    """(B,) weighted soft-target losses and their sums: the student's CTC distribution
    against the teacher's top-k on the rows marked `soft` whose frame counts match the
    teacher's (others are counted in `skipped_frame_mismatch`)."""
    loss_b, ok_b = distill_losses.distill_loss(
        model.ctc_logits(enc),
        enc_len,
        batch["teacher_idx"],
        batch["teacher_logp"],
        batch["teacher_len"],
        rest=soft.rest,
        temperature=soft.temperature,
        kind=soft.kind,
    )
    rows = batch["soft"]
    w = rows * ok_b
    loss_b = jnp.where(w > 0, loss_b, 0.0)
    sums = {
        "soft_frames": jnp.sum(w * batch["teacher_len"]),
        "soft_utterances": jnp.sum(w),
        "skipped_frame_mismatch": jnp.sum(rows * (1.0 - ok_b)),
        "skipped_no_target": jnp.sum(batch["no_target"]).astype(jnp.float32),
        "loss_soft": jnp.sum(w * loss_b),
    }
    return soft.weight * w * loss_b, sums


def rnnt_loss_scales(loss_cfg: ConfigDict, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(simple, pruned) loss weights at `step`: icefall's warm-up from (1, 0.1) to
    (simple_scale, 1) over rnnt_warmup_steps; the pruning bounds only mean something
    once the simple joiner has learned an alignment."""
    frac = jnp.clip(step / max(loss_cfg.rnnt_warmup_steps, 1), 0.0, 1.0)
    return 1.0 - frac * (1.0 - loss_cfg.simple_scale), 0.1 + 0.9 * frac


def scale_gradient(x: jax.Array, scale: jax.Array) -> jax.Array:
    """x unchanged (bitwise) in the forward pass; its gradient multiplied by `scale`."""
    frozen = jax.lax.stop_gradient(x)
    return frozen + scale * (x - frozen)


def transducer_encoder_scale(loss_cfg: ConfigDict, step: jax.Array) -> jax.Array:
    """How much of the transducer losses' gradient reaches the encoder at `step`: 0 -> 1
    over rnnt_warmup_steps (loss.rnnt_encoder_warmup; 1 when it is off).

    Before any alignment exists, the transducer's predictor lowers its loss without the
    audio, and every variation of the encoder output over time is then only noise to the
    joiner: its gradient flattens the encoder output (measured on the demo: time
    variation 0.20 of the output's mean norm at step 200, against 0.43 in a run that
    learned), and the encoder never learns alignments. Whether learning outran that
    collapse depended on the step's random draws (README, "Models, losses and decoders").
    So an acoustic-only loss teaches the encoder first: CTC when the model has a CTC head,
    else the simple joiner's acoustic half (`am_only_weight`).
    """
    if not loss_cfg.get("rnnt_encoder_warmup", True):
        return jnp.float32(1.0)
    return jnp.clip(step / max(loss_cfg.rnnt_warmup_steps, 1), 0.0, 1.0).astype(jnp.float32)


def am_only_weight(loss_cfg: ConfigDict, step: jax.Array, has_ctc: bool) -> jax.Array | None:
    """Weight of the acoustic-only transducer loss (`ASRModel.forward_am_only`) at `step`:
    1 - the encoder scale during the warm-up of a transducer without a CTC head, so the
    objective after the warm-up is the ordinary one; None when it does not apply."""
    if has_ctc or not loss_cfg.get("rnnt_encoder_warmup", True):
        return None
    return 1.0 - transducer_encoder_scale(loss_cfg, step)


def model_losses(
    model: nnx.Module,
    batch: dict,
    key: jax.Array,
    step: jax.Array,
    loss_cfg: ConfigDict,
    blank_id: int,
    soft: SoftTargets | None = None,
) -> tuple[jax.Array, dict]:
    """Summed training objective of a (micro-)batch and the sums that normalize it.

    Returns (objective, sums): objective = sum over utterances of weight x loss;
    sums = {"tokens", "utterances", "skipped_infeasible", "skipped_label_overflow",
    "skipped_corrupt", "loss_<part>" (summed like the objective)}. Sums, not means, so
    micro-batches add up to exactly the full batch; the step divides by the batch's
    tokens. Utterances whose loss is infeasible (CTC: more labels than frames allow) or
    not finite get weight 0 and are counted, never averaged in.
    """
    enc, enc_len = model(batch["audio"], batch["audio_len"], train=True, rngs=nnx.Rngs(key))
    labels, label_len = batch["labels"], batch["label_len"]
    weight = batch["weight"]
    parts, valid = {}, jnp.ones_like(weight, bool)
    if model.ctc is not None:
        parts["ctc"], ctc_ok = model.forward_ctc(enc, enc_len, labels, label_len, blank_id=blank_id)
        valid = valid & ctc_ok
    if model.transducer is not None:
        rnnt_parts, rnnt_ok = model.forward_transducer(
            scale_gradient(enc, transducer_encoder_scale(loss_cfg, step)),
            enc_len,
            labels,
            label_len,
            blank_id=blank_id,
            rnnt_loss=loss_cfg.rnnt,
            prune_range=loss_cfg.prune_range,
            frames_per_chunk=loss_cfg.frames_per_chunk,
        )
        parts |= rnnt_parts
        if "rnnt_pruned" in parts:
            simple_w, pruned_w = rnnt_loss_scales(loss_cfg, step)
            parts["rnnt"] = simple_w * parts["rnnt_simple"] + pruned_w * parts["rnnt_pruned"]
        valid = valid & rnnt_ok
        am_w = am_only_weight(loss_cfg, step, model.ctc is not None)
        if am_w is not None:  # the encoder's first teacher when there is no CTC head
            parts["rnnt_am"], am_ok = model.forward_am_only(
                enc, enc_len, labels, label_len, blank_id=blank_id
            )
            parts["rnnt"] = parts["rnnt"] + am_w * parts["rnnt_am"]
            valid = valid & am_ok
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
        "skipped_corrupt": jnp.sum(batch["corrupt"]).astype(jnp.float32),
    }
    for name, part in parts.items():
        sums[f"loss_{name}"] = jnp.sum(w * part)
    objective = jnp.sum(w * total_b)
    if soft is not None:  # rows of untranscribed audio learn the teacher's distribution
        soft_b, soft_sums = soft_target_losses(model, enc, enc_len, batch, soft)
        objective = objective + jnp.sum(soft_b)
        sums |= soft_sums
    return objective, sums


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


def make_grads_fn(
    graphdef, blank_id: int, loss_cfg: ConfigDict, soft: SoftTargets | None = None
) -> Callable:
    """(params, model_vars, batch, key, step) -> (summed gradients, sums incl. "objective")."""

    def objective(params, model_vars, batch, key, step):
        model = nnx.merge(graphdef, params, model_vars)
        return model_losses(model, batch, key, step, loss_cfg, blank_id, soft)

    def grads_and_sums(params, model_vars, batch, key, step):
        (total, sums), grads = jax.value_and_grad(objective, has_aux=True)(
            params, model_vars, batch, key, step
        )
        return grads, sums | {"objective": total}

    return grads_and_sums


def make_accumulated_grads(grads_and_sums: Callable, grad_accum: int) -> Callable:
    """(params, model_vars, batch, key, step) -> (summed gradients, sums) over the batch,
    in `grad_accum` micro-batches (a `lax.scan`: activation memory of one micro-batch;
    gradients and sums accumulate in float32). Micro-batch i draws `key` folded with i."""
    if grad_accum < 1:
        raise ValueError(f"train.grad_accum must be >= 1, got {grad_accum}")

    def accumulated(params, model_vars, batch, key, step):
        if grad_accum == 1:
            return grads_and_sums(params, model_vars, batch, jax.random.fold_in(key, 0), step)
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
        return grads, sums

    return accumulated


def guarded_update(tx: optax.GradientTransformation, grads, objective, params, opt_state):
    """The optimizer update, or nothing where the objective or the gradient norm is not
    finite. Returns (params, opt_state, finite, gradient norm)."""
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(objective) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # Skipped, not clipped: a NaN anywhere would otherwise spread into every weight.
    params, opt_state = jax.tree.map(
        lambda new, old: jnp.where(finite, new, old),
        (new_params, new_opt_state),
        (params, opt_state),
    )
    return params, opt_state, finite, grad_norm


def step_metrics(sums: dict, grad_norm, param_norm, finite) -> dict:
    """The step's metrics from its (summed) loss sums: per-token and per-utterance losses,
    norms, the non-finite flag (or share of learners that skipped) and the counts."""
    tokens = normalizer(sums)
    metrics = {
        "loss": sums["objective"] / tokens,
        "utt_loss": sums["objective"] / jnp.maximum(sums["utterances"], 1.0),
        "grad_norm": grad_norm,
        "param_norm": param_norm,
        "nonfinite": 1.0 - finite.astype(jnp.float32),
    }
    for k, v in sums.items():
        metrics[k] = v / tokens if k.startswith("loss_") else v
    return metrics


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    seed: int,
    blank_id: int,
    loss_cfg: ConfigDict,
    *,
    grad_accum: int = 1,
    soft: SoftTargets | None = None,
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
    accumulated = make_accumulated_grads(
        make_grads_fn(graphdef, blank_id, loss_cfg, soft), grad_accum
    )

    def train_step(params, model_vars, opt_state, batch, step):
        key = jax.random.fold_in(step_key(seed), step)
        grads, sums = accumulated(params, model_vars, batch, key, step)
        # Per-token objective: buckets of different batch sizes get the same gradient scale.
        tokens = normalizer(sums)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        params, opt_state, finite, grad_norm = guarded_update(
            tx, grads, sums["objective"], params, opt_state
        )
        return params, opt_state, step_metrics(sums, grad_norm, optax.tree.norm(params), finite)

    return train_step


def make_sync_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    seed: int,
    blank_id: int,
    loss_cfg: ConfigDict,
    strategy: sync.Strategy,
    param_shardings: dict,
    *,
    grad_accum: int = 1,
    soft: SoftTargets | None = None,
) -> Callable:
    """(params, model_vars, opt_state, sync_state, batch, step) -> (params, opt_state,
    sync_state, metrics): the training step under `strategy` (jaxspeech.parallel.sync).

    - allreduce: `make_train_step`, unchanged; sync_state is {} and passes through.
    - bmuf / gossip (and hierarchical): sync_state["learners"] (n, ...) are the learners'
      parameters and opt_state their optimizer states (n, ...). Each learner takes a
      local step on its block of the batch (a `vmap` over the learner axis with
      `spmd_axis_name`, so each learner's arrays stay on its devices), normalized by its
      own tokens and skipped alone if not finite; then BMUF's block update every
      `block_steps` steps (params = the global model W_g) or the ring mix every step
      (params pass through unchanged: `model_params` gives the learners' mean).
    - gtc: one shared model; opt_state holds each learner's optimizer state (n, ...).
      Each learner turns the gradient of its own rows (normalized by its own tokens) into
      its optimizer's update at the shared parameters; the updates go through
      `sync.gtc_exchange` with sync_state["residual"] (n, ...) (error feedback: what is
      not sent waits there), and the model moves by the mean of the messages. The
      compression works on updates, not gradients: AdamW fed sparse +-tau gradient
      spikes moves a weight a few learning-rate steps per message where the dense
      gradient moves it one per step (1-bit Adam compresses after the optimizer for the
      same reason). With SGD it is Strom's GTC on lr-scaled gradients.

    metrics add "sync_bytes_per_step" (payload arithmetic) and, for GTC, "sync_density"
    (sent / all elements) and "sync_overflow" (elements that found no slot).
    """
    if strategy.method == "allreduce":
        plain = make_train_step(
            graphdef, tx, seed, blank_id, loss_cfg, grad_accum=grad_accum, soft=soft
        )

        def allreduce_step(params, model_vars, opt_state, sync_state, batch, step):
            params, opt_state, metrics = plain(params, model_vars, opt_state, batch, step)
            return params, opt_state, sync_state, metrics

        return allreduce_step

    accumulated = make_accumulated_grads(
        make_grads_fn(graphdef, blank_id, loss_cfg, soft), grad_accum
    )
    axes, n = strategy.learner_axes, strategy.num_learners
    mesh = jax.tree.leaves(param_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))[0].mesh
    specs = jax.tree.map(
        lambda s: s.spec, param_shardings, is_leaf=lambda x: isinstance(x, NamedSharding)
    )

    def payload(params) -> jax.Array:
        """Bytes per device per step of the exchange (static: from shapes at trace time)."""
        out = sync.payload_bytes(strategy, params, param_shardings, mesh)["bytes_per_step"]
        return jnp.float32(out)

    def learners(fn, in_axes):
        """fn vmapped over the learner axis, traced with the learners' rules."""

        def run(*args):
            with rules.learner_axes(axes):
                return jax.vmap(fn, in_axes=in_axes, spmd_axis_name=axes)(*args)

        return run

    def local_step(params, model_vars, opt_state, batch, key, step):
        grads, sums = accumulated(params, model_vars, batch, key, step)
        tokens = normalizer(sums)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        params, opt_state, finite, grad_norm = guarded_update(
            tx, grads, sums["objective"], params, opt_state
        )
        return params, opt_state, sums, grad_norm, optax.tree.norm(params), finite

    def learner_step(params, model_vars, opt_state, sync_state, batch, step):
        key = jax.random.fold_in(step_key(seed), step)
        before = sync_state["learners"]
        after, opt_state, sums, grad_norm, param_norm, finite = learners(
            local_step, (0, None, 0, 0, 0, None)
        )(
            before,
            model_vars,
            opt_state,
            sync.split_batch(batch, n, axes),
            sync.learner_keys(key, n),
            step,
        )
        sync_state = dict(sync_state)
        if strategy.method == "gossip":
            sync_state["learners"] = sync.gossip_mix(
                before, after, mesh=mesh, specs=specs, axes=axes, overlap=strategy.overlap
            )
        else:

            def block(args):
                learners_, global_, momentum = args
                g, m, start = sync.bmuf_block(
                    learners_,
                    global_,
                    momentum,
                    strategy.block_momentum,
                    strategy.block_lr,
                    strategy.nesterov,
                )
                return start, g, m

            boundary = (step + 1) % strategy.block_steps == 0
            sync_state["learners"], params, sync_state["momentum"] = jax.lax.cond(
                boundary, block, lambda a: a, (after, params, sync_state["momentum"])
            )
        sums = jax.tree.map(jnp.sum, sums)
        metrics = step_metrics(sums, jnp.mean(grad_norm), jnp.mean(param_norm), finite)
        metrics["nonfinite"] = 1.0 - jnp.mean(finite.astype(jnp.float32))
        metrics["sync_bytes_per_step"] = payload(params)
        return params, opt_state, sync_state, metrics

    def local_update(params, model_vars, opt_state, batch, key, step):
        """One learner's optimizer update at the shared params from its own rows (zero,
        with its optimizer state unchanged, where not finite)."""
        grads, sums = accumulated(params, model_vars, batch, key, step)
        grads = jax.tree.map(lambda g: g / normalizer(sums), grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(sums["objective"]) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: jnp.where(finite, u, 0.0), updates)
        opt_state = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new_opt, opt_state)
        return updates, opt_state, sums, grad_norm, finite

    def gtc_step(params, model_vars, opt_state, sync_state, batch, step):
        key = jax.random.fold_in(step_key(seed), step)
        updates, opt_state, sums, grad_norm, finite = learners(
            local_update, (None, None, 0, 0, 0, None)
        )(
            params,
            model_vars,
            opt_state,
            sync.split_batch(batch, n, axes),
            sync.learner_keys(key, n),
            step,
        )
        sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), sums)
        summed, residual, counts = sync.gtc_exchange(
            sync_state["residual"], updates, s=strategy, mesh=mesh, specs=specs
        )
        params = jax.tree.map(lambda p, u: p + u / n, params, summed)
        metrics = step_metrics(sums, jnp.mean(grad_norm), optax.tree.norm(params), finite)
        metrics["nonfinite"] = 1.0 - jnp.mean(finite.astype(jnp.float32))
        metrics["sync_bytes_per_step"] = payload(params)
        metrics["sync_density"] = counts["sent"] / (
            n * sum(x.size for x in jax.tree.leaves(params))
        )
        metrics["sync_overflow"] = counts["overflow"]
        return params, opt_state, {"residual": residual}, metrics

    return learner_step if strategy.per_learner_models else gtc_step


def jit_sync_train_step(
    ts: state_lib.TrainState, step_fn: Callable, batch_shardings=None, *, donate: bool = False
) -> Callable:
    """`jax.jit` of a `make_sync_train_step` function with `ts`'s shardings in and out
    (donating parameters, optimizer and sync state when `donate`)."""
    spec = ts.spec
    return jax.jit(
        step_fn,
        in_shardings=(
            spec.param_shardings,
            spec.var_shardings,
            ts.opt_shardings,
            ts.sync_shardings,
            batch_shardings,
            None,
        ),
        out_shardings=(spec.param_shardings, ts.opt_shardings, ts.sync_shardings, None),
        donate_argnums=(0, 2, 3) if donate else (),
    )


def step_key(seed: int) -> jax.Array:
    """The base key of the training step's randomness (dropout, SpecAugment)."""
    return jax.random.key(seed + 1)


def micro_batch_key(seed: int, step: int | jax.Array, index: int | jax.Array) -> jax.Array:
    """The random key of micro-batch `index` of `step` (index 0 without accumulation)."""
    return jax.random.fold_in(jax.random.fold_in(step_key(seed), step), index)


class FlopCountUnavailable(RuntimeError):
    """XLA's cost analysis gave no FLOP count for the step (MFU cannot be reported)."""


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
    model = nnx.eval_shape(lambda: state_lib.make_model(c, vocab_size, 0))
    graphdef, params, model_vars = nnx.split(model, nnx.Param, FeatureStats)
    params, model_vars = nnx.to_pure_dict(params), nnx.to_pure_dict(model_vars)
    tx, _ = optim.make_optimizer(c.optim, int(c.train.num_steps))
    opt_state = jax.eval_shape(tx.init, params)
    step = make_train_step(graphdef, tx, 0, blank_id, c.loss)
    # Lowered for the host's CPU backend whatever the run's devices: GPU plugins (PJRT C
    # API) do not implement a lowered program's cost analysis (jax returns None there), and
    # model FLOPs are the program's, not the device's.
    with jax.default_device(jax.devices("cpu")[0]):
        lowered = jax.jit(step).lower(params, model_vars, opt_state, batch_shapes, jnp.int32(0))
        analysis = lowered.cost_analysis()
    if not analysis or "flops" not in analysis:
        raise FlopCountUnavailable(f"XLA's cost analysis gave no FLOP count: {analysis!r}")
    return float(analysis["flops"])
