"""The vocoder's training step and evaluation function (`config.task = "vocoder"`).

The batch (`jaxspeech.vocoder.batch`) holds waveforms; on the device each becomes a
vocoder batch (`device_batch`): the audio zero-padded to T * hop samples and its raw
log-mel by the run's own front end (`config.features`: the recognizer's, so the vocoder
inverts exactly what FastSpeech2 predicts once denormalized), or, on rows that have them,
FastSpeech2's own ground-truth-aligned frames of that audio (`config.vocoder.gta_mels`).

One step, as HiFi-GAN's: the discriminators' update on the generator's current output
(its gradient stopped), then the generator's update against the *updated* discriminators
(least squares adversarial + feature matching + mel L1, `config.vocoder`'s weights). Each
model has its own AdamW (`make_optimizers`) and its own guarded update: a non-finite loss
or gradient of either model leaves that model and its optimizer state as they were.
Neither generator uses dropout: the step draws no random numbers.

Before step `vocoder.adversarial_start` the generator learns from the mel L1 alone and the
discriminators rest (ParallelWaveGAN's discriminator_train_start_steps): a step then
costs the generator's pass only. For Vocos that is 75 ms for 4 segments against 4.7 s with
the demo's discriminators (the loaded 2-core VM), so a few CPU minutes buy thousands of
steps of the reconstruction loss before the adversarial ones refine it. Both branches are
compiled (one `lax.cond` on the step), one runs; with no warm-up (0) there is no branch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from ml_collections import ConfigDict

from jaxspeech.audio import features
from jaxspeech.audio.features import LogMelConfig
from jaxspeech.parallel.rules import map_batch_shards
from jaxspeech.training import optim
from jaxspeech.training.state import TrainState
from jaxspeech.training.update import guarded_update, step_metrics
from jaxspeech.vocoder import losses as vl

MODELS = ("generator", "discriminator")


# Each model's optimizer section (ESPnet's GAN tasks' optim / optim2): one shape, one builder.
OPTIMIZER_SECTIONS = {"generator": "optim", "discriminator": "optim2"}


def make_optimizers(config: ConfigDict) -> tuple[dict, optax.Schedule]:
    """({"generator": tx, "discriminator": tx}, the generator's schedule, which the
    trainer logs): `optim.make_optimizer` of config.optim and config.optim2. Their
    defaults are HiFi-GAN's AdamW (b1 0.8, b2 0.99, weight decay 0.01 on every parameter)
    at 2e-4 decayed by 0.999 per "epoch", with no warm-up and no clipping, as the paper's."""
    steps = int(config.train.num_steps)
    built = {m: optim.make_optimizer(config[s], steps) for m, s in OPTIMIZER_SECTIONS.items()}
    return {m: tx for m, (tx, _) in built.items()}, built["generator"][1]


def loss_weights(config: ConfigDict) -> dict[str, float]:
    v = config.vocoder
    return {
        "adversarial_weight": float(v.adversarial_weight),
        "feature_weight": float(v.feature_weight),
        "mel_weight": float(v.mel_weight),
    }


def make_vocoder_step(
    graphdef, txs: dict, cfg: LogMelConfig, weights: dict, adversarial_start: int = 0
) -> Callable:
    """(state, batch) -> (state + 1 step, metrics): the discriminators' update, then the
    generator's; before step `adversarial_start` the generator's on the mel L1 alone (see
    the module docstring). state.params / opt_state: {"generator", "discriminator"}.
    Metrics: the generator's objective as "loss" (its parts as "loss_mel",
    "loss_adversarial", "loss_feature", unweighted), the discriminators' as "loss_disc"
    ("loss_disc_real", "loss_disc_fake"; 0 while they rest), each model's gradient norm,
    and the shared counts of `update.step_metrics`."""

    def merged(gen_params, disc_params):
        model = nnx.merge(graphdef, {"generator": gen_params, "discriminator": disc_params})
        return model.generator, model.discriminator

    def disc_objective(disc_params, gen_params, batch):
        gen, disc = merged(gen_params, disc_params)
        fake = vl.generate(gen, batch, cfg)
        return vl.discriminator_loss(disc, batch, fake)

    def gen_objective(gen_params, disc_params, batch):
        gen, disc = merged(gen_params, disc_params)
        return vl.generator_loss(gen, disc, batch, cfg, **weights)

    def mel_objective(gen_params, disc_params, batch):  # the warm-up's: no discriminator
        gen, disc = merged(gen_params, disc_params)
        mel_only = weights | {"adversarial_weight": 0.0, "feature_weight": 0.0}
        return vl.generator_loss(gen, disc, batch, cfg, **mel_only)

    def disc_update(p, o, vb):
        (d_loss, d_parts), d_grads = jax.value_and_grad(disc_objective, has_aux=True)(
            p["discriminator"], p["generator"], vb
        )
        d_params, d_opt, d_finite, d_norm = guarded_update(
            txs["discriminator"], d_grads, d_loss, p["discriminator"], o["discriminator"]
        )
        return d_params, d_opt, d_finite, d_norm, d_loss, d_parts

    def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        vb = device_batch(batch, cfg)
        p, o = state.params, state.opt_state
        branch = functools.partial(warm_up_branch, adversarial_start, state.step)
        d_params, d_opt, d_finite, d_norm, d_loss, d_parts = branch(
            disc_update, resting(disc_update), p, o, vb
        )
        (g_loss, g_parts), g_grads = branch(
            jax.value_and_grad(gen_objective, has_aux=True),
            jax.value_and_grad(mel_objective, has_aux=True),
            p["generator"],
            d_params,
            vb,
        )
        g_params, g_opt, g_finite, g_norm = guarded_update(
            txs["generator"], g_grads, g_loss, p["generator"], o["generator"]
        )
        params = {"generator": g_params, "discriminator": d_params}
        sums = {
            "objective": g_loss,
            "tokens": jnp.float32(1.0),  # the losses are means already
            "utterances": jnp.sum(batch["weight"]),
            "skipped_infeasible": jnp.float32(0.0),
            "skipped_label_overflow": jnp.float32(0.0),
            "skipped_corrupt": jnp.sum(batch["corrupt"]).astype(jnp.float32),
        }
        sums |= {f"loss_{k}": v for k, v in g_parts.items()}
        sums |= {"loss_disc": d_loss} | {f"loss_disc_{k}": v for k, v in d_parts.items()}
        # The trainer's non-finite accounting reads one flag: a step skipped by either model.
        metrics = step_metrics(sums, g_norm, optax.tree.norm(g_params), g_finite & d_finite)
        metrics["disc_grad_norm"] = d_norm
        new = state.replace(
            step=state.step + 1,
            params=params,
            opt_state={"generator": g_opt, "discriminator": d_opt},
        )
        return new, metrics

    return train_step


def device_batch(batch: dict, cfg: LogMelConfig) -> dict[str, jax.Array]:
    """`losses.make_batch` of the batch's audio, its input log-mel replaced by the
    synthesizer's ground-truth-aligned frames on the rows that have them ("gta_mel",
    "gta": `vocoder.batch`). The mel L1 still compares the output with the real audio."""
    vb = vl.make_batch(batch["audio"], batch["audio_len"], cfg)
    if "gta_mel" in batch:
        t = vb["mel"].shape[1]
        has = batch["gta"][:, None, None] > 0
        vb["mel"] = jnp.where(has, batch["gta_mel"][:, :t].astype(vb["mel"].dtype), vb["mel"])
    return vb


def warm_up_branch(start: int, step: jax.Array, adversarial_fn, warm_up_fn, *args):
    """adversarial_fn(*args) from step `start` on, warm_up_fn(*args) before it: one
    `lax.cond` (both compiled, one runs); no branch at all when `start` <= 0."""
    if start <= 0:  # no warm-up: HiFi-GAN's step, unbranched
        return adversarial_fn(*args)
    return jax.lax.cond(step >= start, adversarial_fn, warm_up_fn, *args)


def resting(disc_update: Callable) -> Callable:
    """The warm-up's stand-in for `disc_update` ((params, opt_state, batch) -> (its params,
    opt_state, finite, norm, loss, parts)): the discriminators and their optimizer state
    unchanged, finite, zero norm and losses (shaped as `disc_update`'s)."""

    def rest(p, o, vb):
        shapes = jax.eval_shape(disc_update, p, o, vb)[3:]
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return p["discriminator"], o["discriminator"], jnp.bool_(True), *zeros

    return rest


def make_eval_fn(gen_graphdef, cfg: LogMelConfig) -> Callable:
    """jit (generator params (`gen_graphdef`'s), (B, S) audio, (B,) audio_len) -> the
    generator's output from the audio's own log-mel and per-row scores: "vocoded"
    (B, T * hop) audio (zero past each length), "mel" (B, T, M) the real raw log-mel (0
    past the valid frames),
    "mel_abs" (B,) the summed |log-mel difference| over the valid frames x bins and
    "frames" (B,) those frames (1 + len // hop)."""

    @jax.jit
    def eval_fn(gen_params, audio_bs, audio_len_b):
        vb = vl.make_batch(audio_bs, audio_len_b, cfg)
        fake = vl.generate(nnx.merge(gen_graphdef, gen_params), vb, cfg)
        t = vb["mel"].shape[1]
        both = map_batch_shards(
            lambda a: features.log_mel(a, cfg)[:, :t], vl.interleave(vb["audio"], fake)
        )
        real_mel, fake_mel = vl.deinterleave(both)
        mask = vl.frame_mask(audio_len_b, t, cfg.hop_length)[..., None]
        diff = jnp.where(mask, jnp.abs(real_mel - fake_mel), 0.0)
        return {
            "vocoded": fake,
            "mel": jnp.where(mask, vb["mel"], 0.0),
            "mel_abs": jnp.sum(diff, axis=(1, 2)),
            "frames": jnp.sum(mask[..., 0], axis=1).astype(jnp.float32),
        }

    return eval_fn
