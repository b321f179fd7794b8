"""The training objective: the model's losses on a (micro-)batch, summed with the counts
that normalize them, the transducer's warm-up weights, soft targets from a teacher, and
gradients accumulated over micro-batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.losses import attention as attention_losses
from jaxspeech.losses import distill as distill_losses
from jaxspeech.losses.kernels import common as loss_kernels
from jaxspeech.parallel import rules


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
    collapse depended on the step's random draws (docs/results/asr.md, section 1).
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


def loss_kernel(loss_cfg: ConfigDict) -> str:
    """loss.kernel resolved for the devices the step is being traced for: "xla" or
    "pallas" ("auto": pallas on GPUs; jaxspeech.losses.kernels.common)."""
    return loss_kernels.resolve(loss_cfg.get("kernel", "auto"), loss_kernels.trace_platform())


def combine_parts(parts: dict, loss_cfg: ConfigDict) -> jax.Array:
    """(B,) per-utterance objective from the heads' (B,) losses: ctc+aed ESPnet's joint
    ctc_weight * CTC + (1 - ctc_weight) * attention (both over the same token
    normalizer); ctc+rnnt the transducer's plus ctc_weight * CTC; else the one part."""
    if "att" in parts and "ctc" not in parts:  # aed alone
        return parts["att"]
    if "att" in parts:
        return attention_losses.joint_ctc_attention(parts["ctc"], parts["att"], loss_cfg.ctc_weight)
    if "ctc" in parts and "rnnt" in parts:
        return parts["rnnt"] + loss_cfg.ctc_weight * parts["ctc"]
    return parts.get("rnnt", parts.get("ctc"))


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
    rngs = nnx.Rngs(key)  # the encoder draws first, then the attention decoder (ctc+aed)
    enc, enc_len = model(batch["audio"], batch["audio_len"], train=True, rngs=rngs)
    labels, label_len = batch["labels"], batch["label_len"]
    weight = batch["weight"]
    parts, valid = {}, jnp.ones_like(weight, bool)
    if model.ctc is not None:
        parts["ctc"], ctc_ok = model.forward_ctc(
            enc, enc_len, labels, label_len, blank_id=blank_id, kernel=loss_kernel(loss_cfg)
        )
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
            kernel=loss_kernel(loss_cfg),
        )
        parts |= rnnt_parts
        if "rnnt_pruned" in parts:
            simple_w, pruned_w = rnnt_loss_scales(loss_cfg, step)
            parts["rnnt"] = simple_w * parts["rnnt_simple"] + pruned_w * parts["rnnt_pruned"]
        valid = valid & rnnt_ok
        am_w = am_only_weight(loss_cfg, step, model.ctc is not None)
        if am_w is not None:  # the encoder's first teacher when there is no CTC head
            parts["rnnt_am"], am_ok = model.forward_am_only(
                enc, enc_len, labels, label_len, blank_id=blank_id, kernel=loss_kernel(loss_cfg)
            )
            parts["rnnt"] = parts["rnnt"] + am_w * parts["rnnt_am"]
            valid = valid & am_ok
    if getattr(model, "decoder", None) is not None:  # ctc+aed, aed
        parts["att"], att_ok = model.forward_attention(
            enc,
            enc_len,
            labels,
            label_len,
            label_smoothing=loss_cfg.label_smoothing,
            deterministic=False,
            rngs=rngs,
        )
        valid = valid & att_ok
    total_b = combine_parts(parts, loss_cfg)
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
