"""The synthesizer's objective on a text-to-speech batch (`jaxspeech.tts.batch`):
targets computed on device, FastSpeech2's loss, and its gradients for the shared step.

Targets, from the batch's waveform with the recognizer's own front end
(`models.frontend.Frontend`, no augmentation, normalized by the train split's feature
statistics): exactly the features a recognizer of the same config sees.
- mel: (B, T, M) normalized log-mel frames (the model's output units);
- energy: each frame's mean normalized log-mel (FastPitch's mel-domain energy, in the
  same units), averaged over each phoneme's frames;
- pitch: log F0 of the voiced frames (the loader's F0, 0 = unvoiced), normalized by the
  run's pitch statistics, averaged over each phoneme's *voiced* frames: a phoneme with no
  voiced frame gets 0, the corpus mean (ESPnet's token-averaged F0 averages only nonzero
  frames; FastPitch likewise), so unvoiced frames never pull a target towards 0 Hz.

The objective is FastSpeech2's mean over the global batch (`tts.losses.fastspeech2_loss`:
mel L1 over frames x bins, the others over phonemes), so the step's normalizer is 1. With
grad_accum = k, each micro-batch's parts are weighted by its share of the whole batch's
frames and phonemes (counted from the batch first): the k micro-batches add up to the
single-pass mean, up to summation order.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.audio.features import LogMelConfig
from jaxspeech.models.frontend import Frontend
from jaxspeech.training.objective import split_micro_batches
from jaxspeech.tts import length_regulator
from jaxspeech.tts.losses import PARTS, fastspeech2_loss
from jaxspeech.tts.model import durations_from_log

DB_PER_NEPER = 10.0 / jnp.log(10.0)  # natural-log power -> decibels


def features(audio_bs, audio_len_b, model_vars: dict, cfg: LogMelConfig):
    """(B, S) audio -> (B, T, M) normalized log-mel (0 past each row's frames) and (B,)
    frame counts: the recognizer's front end with the run's statistics."""
    frontend = Frontend(cfg)  # holds no parameters: only the statistics, set here
    frontend.mean[...] = model_vars["frontend"]["mean"]
    frontend.std[...] = model_vars["frontend"]["std"]
    return frontend(audio_bs, audio_len_b, train=False, rngs=None)


def targets(batch: dict, model_vars: dict, cfg: LogMelConfig) -> dict:
    """The batch's targets: "mel" (B, T, M), "frames" (B,), "durations" (B, N), and the
    phonemes' "pitch" and "energy" (B, N) (see the module docstring)."""
    mel, frames = features(batch["audio"], batch["audio_len"], model_vars, cfg)
    frame_mask = jnp.arange(mel.shape[1])[None, :] < frames[:, None]
    energy = jnp.where(frame_mask, jnp.mean(mel, axis=-1), 0.0)
    f0 = batch["pitch"].astype(jnp.float32)
    voiced = f0 > 0
    stats = model_vars["pitch"]
    log_f0 = (jnp.log(jnp.where(voiced, f0, 1.0)) - stats["mean"]) / stats["std"]
    durations = batch["durations"]
    return {
        "mel": mel,
        "frames": frames,
        "durations": durations,
        "pitch": length_regulator.token_average(jnp.where(voiced, log_f0, 0.0), durations, voiced),
        "energy": length_regulator.token_average(energy, durations, frame_mask),
    }


def forward(model, batch: dict, model_vars: dict, cfg: LogMelConfig, *, key=None):
    """(targets, teacher-forced predictions with the masks of rows of weight > 0);
    `key`: dropout's (None: deterministic)."""
    tgt = targets(batch, model_vars, cfg)
    rngs = None if key is None else nnx.Rngs(key)
    pred = model(
        batch["tokens"],
        batch["speaker"],
        tgt["durations"],
        tgt["pitch"],
        tgt["energy"],
        tgt["mel"].shape[1],
        key is None,
        rngs=rngs,
    )
    rows = (batch["weight"] > 0)[:, None]  # skipped rows (overflow, corrupt, padding)
    pred = pred | {
        "frame_mask": pred["frame_mask"] & rows,
        "token_mask": pred["token_mask"] & rows,
    }
    return tgt, pred


def batch_counts(pred: dict, n_mels: int) -> dict:
    """What each part of the loss averages over: "mel" frames x bins, the others phonemes."""
    frames = jnp.sum(pred["frame_mask"].astype(jnp.float32)) * n_mels
    tokens = jnp.sum(pred["token_mask"].astype(jnp.float32))
    return {"mel": frames} | {k: tokens for k in PARTS if k != "mel"}


def losses(
    model, batch: dict, model_vars: dict, key, cfg: LogMelConfig, loss_cfg, totals=None
) -> tuple[jax.Array, dict]:
    """(objective, sums) of a (micro-)batch. `totals`: the whole batch's counts
    (`batch_counts`) when this is one of several micro-batches, else None."""
    tgt, pred = forward(model, batch, model_vars, cfg, key=key)
    _, parts = fastspeech2_loss(pred, tgt)
    if totals is not None:  # this micro-batch's share of the whole batch's means
        counts = batch_counts(pred, cfg.num_mel_bins)
        parts = {k: v * counts[k] / jnp.maximum(totals[k], 1.0) for k, v in parts.items()}
    weights = {k: float(loss_cfg[f"{k}_weight"]) for k in PARTS}
    objective = sum(weights[k] * parts[k] for k in PARTS)
    sums = {
        "tokens": jnp.float32(1.0),  # the objective is a mean already
        "utterances": jnp.sum(batch["weight"]),
        "skipped_infeasible": jnp.float32(0.0),
        "skipped_label_overflow": jnp.sum(batch["label_overflow"]).astype(jnp.float32),
        "skipped_corrupt": jnp.sum(batch["corrupt"]).astype(jnp.float32),
    }
    return objective, sums | {f"loss_{k}": v for k, v in parts.items()}


def make_tts_grads_fn(
    graphdef, cfg: LogMelConfig, loss_cfg: ConfigDict, grad_accum: int = 1
) -> Callable:
    """(params, model_vars, batch, key, step) -> (gradients, sums incl. "objective") of the
    whole batch, in `grad_accum` micro-batches (a `lax.scan`; micro-batch i draws `key`
    folded with i, as the recognizer's)."""
    if grad_accum < 1:
        raise ValueError(f"train.grad_accum must be >= 1, got {grad_accum}")

    def objective(params, model_vars, batch, key, totals):
        model = nnx.merge(graphdef, params)
        return losses(model, batch, model_vars, key, cfg, loss_cfg, totals)

    def grads_and_sums(params, model_vars, batch, key, totals=None):
        (total, sums), grads = jax.value_and_grad(objective, has_aux=True)(
            params, model_vars, batch, key, totals
        )
        return grads, sums | {"objective": total}

    def accumulated(params, model_vars, batch, key, step):
        del step  # no schedule inside the objective
        if grad_accum == 1:
            return grads_and_sums(params, model_vars, batch, jax.random.fold_in(key, 0))
        totals = whole_batch_counts(batch, cfg)
        micro = split_micro_batches(batch, grad_accum)

        def body(acc, xs):
            i, mb = xs
            out = grads_and_sums(params, model_vars, mb, jax.random.fold_in(key, i), totals)
            return jax.tree.map(jnp.add, acc, out), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(grads_and_sums, params, model_vars, first, key, totals)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(grad_accum), micro))
        return grads, sums | {"tokens": jnp.float32(1.0)}

    return accumulated


def whole_batch_counts(batch: dict, cfg: LogMelConfig) -> dict:
    """`batch_counts` of a whole batch from its arrays (before it is split): the frames
    the durations cover (up to the bucket's) and the phonemes, of rows of weight > 0."""
    rows = (batch["weight"] > 0).astype(jnp.float32)
    t = batch["pitch"].shape[1]
    covered = jnp.minimum(jnp.sum(batch["durations"], axis=1), t).astype(jnp.float32)
    frames = jnp.sum(rows * covered) * cfg.num_mel_bins
    tokens = jnp.sum(rows * batch["token_len"].astype(jnp.float32))
    return {"mel": frames} | {k: tokens for k in PARTS if k != "mel"}


# ---------------------------------------------------------------- evaluation
def make_eval_fn(graphdef, cfg: LogMelConfig) -> Callable:
    """jit (params, model_vars, batch) -> per-row (B,) sums of the teacher-forced model:
    "mel_abs" (normalized units), "mel_abs_db" (log-mel dB), "frames", "phonemes",
    "duration_abs" (|predicted - target| frames, predictions rounded as at synthesis) and
    the normalized log-mel "target" and "predicted" (B, T, M)."""

    @jax.jit
    def eval_fn(params, model_vars, batch):
        model = nnx.merge(graphdef, params)
        tgt, pred = forward(model, batch, model_vars, cfg)
        fmask = pred["frame_mask"][..., None]
        diff = jnp.where(fmask, jnp.abs(pred["mel"] - tgt["mel"]), 0.0)
        std = model_vars["frontend"]["std"]
        tmask = pred["token_mask"]
        predicted = durations_from_log(pred["log_duration"], tmask, 1.0, tgt["mel"].shape[1])
        dur_err = jnp.abs(predicted - tgt["durations"]).astype(jnp.float32)
        return {
            "mel_abs": jnp.sum(diff, axis=(1, 2)),
            "mel_abs_db": jnp.sum(diff * std, axis=(1, 2)) * DB_PER_NEPER,
            "frames": jnp.sum(pred["frame_mask"], axis=1).astype(jnp.float32),
            "phonemes": jnp.sum(tmask, axis=1).astype(jnp.float32),
            "duration_abs": jnp.sum(jnp.where(tmask, dur_err, 0.0), axis=1),
            "target": jnp.where(fmask, tgt["mel"], 0.0),
            "predicted": jnp.where(fmask, pred["mel"], 0.0),
        }

    return eval_fn
