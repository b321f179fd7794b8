"""The neural vocoder as a task of the one trainer (`jaxspeech.training.task`): a generator
(HiFi-GAN's, `jaxspeech.vocoder.hifigan`, or Vocos's, `jaxspeech.vocoder.vocos`, by
config.vocoder.generator) against HiFi-GAN's discriminators (`vocoder.discriminators`)
learns to turn the run's front-end log-mel (`config.features`: the recognizer's, which
FastSpeech2 predicts) back into audio.

- assets: none (any prepared split serves; the front end is the config's, and its
  settings travel in every checkpoint as the model_vars, `vocoder.loading`);
- data: `jaxspeech.vocoder.batch`: one random `vocoder.segment_samples` window of
  every train utterance per epoch, `vocoder.batch_size` rows (shorter utterances padded
  and masked, none left out); with `vocoder.gta_mels`, a synthesizer's ground-truth-aligned
  frames of them as the input (`vocoder.gta`);
- state: params and opt_state {"generator": ..., "discriminator": ...}, a tree of two
  optax AdamWs in the setup, of config.optim and config.optim2 (`objective.make_optimizers`);
- step: the discriminators' update, then the generator's (`vocoder_objective`);
- evaluation and samples: `jaxspeech.vocoder.training_eval`; checkpoints rank by the
  first eval split's log-mel L1 ("eval_mel_l1", lower is better).
Unsupported settings (gradient accumulation, sync strategies other than all-reduce,
pipeline stages, another hop than HiFi-GAN's 160) are refused by
`config.validate` before any work.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import reader as reader_lib
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import sync as sync_lib
from jaxspeech.runs.events import log
from jaxspeech.runs.faults import FaultLog
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib
from jaxspeech.training.task import EvalResult
from jaxspeech.vocoder import batch as vocoder_batch
from jaxspeech.vocoder import gta as vocoder_gta
from jaxspeech.vocoder import loading as vocoder_loading
from jaxspeech.vocoder import vocos
from jaxspeech.vocoder.objective import (
    MODELS,
    loss_weights,
    make_optimizers,
    make_vocoder_step,
)
from jaxspeech.vocoder.training_eval import VocoderEvaluator

VOCODER_BATCH_RANKS = {"audio": 2, "audio_len": 1, "weight": 1, "corrupt": 1}
GTA_BATCH_RANKS = {"gta_mel": 3, "gta": 1}  # with config.vocoder.gta_mels
BEST_METRIC = "eval_mel_l1"


class VocoderTask:
    """The vocoder of config.vocoder (see the module docstring)."""

    name = "vocoder"
    best_metric_name = BEST_METRIC

    def __init__(self, config: ConfigDict, mesh: Mesh):
        self.config, self.mesh = config, mesh
        self.cfg = build.feature_config(config)

    # ------------------------------------------------------------------ assets and data
    def install_assets(self, workdir: str, every_process: bool) -> None:
        self.workdir = workdir  # samples are written under it; the vocoder has no assets

    def train_pipeline(self):
        config, v = self.config, self.config.vocoder
        self.gta = vocoder_gta.open_gta_mels(config, self.cfg) if v.gta_mels else None
        multiple_of = math.lcm(mesh_lib.num_batch_shards(self.mesh), jax.process_count())
        try:
            pipe = vocoder_batch.make_vocoder_pipeline(
                data_dir=config.data.dir,
                split=config.data.train_split,
                spec=None,
                segment_samples=int(v.segment_samples),
                batch_size=int(v.batch_size),
                seed=config.seed,
                train=True,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                loader_shards=int(config.data.loader_shards),
                multiple_of=multiple_of,
                num_workers=config.data.num_workers,
                prefetch=config.data.prefetch,
                retry=build.retry_policy(config),
                with_ids=bool(config.monitor.log_batch_ids),
                gta=self.gta,
                hop=self.cfg.hop_length,
                n_mels=self.cfg.num_mel_bins,
            )
        except (FileNotFoundError, reader_lib.ShardError, ValueError) as e:
            raise UserError(str(e)) from e
        if self.gta is not None:
            log(vocoder_gta.coverage(self.gta, pipe.index.num_records))
        rows = pipe.plan.spec.batch_sizes[0]
        log(
            f"train data: {pipe.index.num_records} utterances, {pipe.index.seconds / 3600:.2f} "
            f"h; {rows} segments of {v.segment_samples} samples per step (one random window "
            f"of each utterance per epoch, {pipe.plan.batches_per_epoch} steps/epoch)"
        )
        return pipe

    def check_eval_settings(self) -> None:
        self.eval_splits = parse_splits(self.config.data.eval_split)

    # ------------------------------------------------------------------ model and step
    def init_state(self) -> tuple[state_lib.TrainState, state_lib.TrainSetup]:
        """The generator and discriminators (seeded by config.seed), each with its own
        AdamW state, laid out on the mesh at step 0."""
        config, mesh = self.config, self.mesh
        try:
            strategy = sync_lib.strategy_from_config(config.get("sync"), dict(mesh.shape))
            spec = vocoder_loading.vocoder_spec(config, mesh)
        except ValueError as e:  # a bad model or sync setting
            raise UserError(f"config: {e}") from e

        def init():
            model = vocoder_loading.make_vocoder(config, config.seed)
            return nnx.to_pure_dict(nnx.state(model, nnx.Param))

        params = jax.jit(init, out_shardings=spec.param_shardings)()
        model_vars = jax.device_put(vocoder_loading.front_end_vars(self.cfg), spec.var_shardings)
        txs, schedule = make_optimizers(config)
        opt_state, opt_shard = {}, {}
        for name in MODELS:
            opt_state[name], opt_shard[name] = state_lib.init_opt_state(
                txs[name], params[name], mesh, spec.param_shardings[name]
            )
        replicated = NamedSharding(mesh, PartitionSpec())
        state = state_lib.TrainState(
            jax.device_put(jnp.int32(0), replicated), params, model_vars, opt_state, {}
        )
        shardings = state_lib.TrainState(
            replicated, spec.param_shardings, spec.var_shardings, opt_shard, {}
        )
        self.gen_graphdef = vocoder_loading.generator_graphdef(config)
        return state, state_lib.TrainSetup(spec, txs, schedule, strategy, shardings)

    def describe_model(self, setup: state_lib.TrainSetup) -> str:
        v, p = self.config.vocoder, setup.spec.params
        if vocoder_loading.generator_kind(self.config) == "vocos":
            n_fft = vocos.WINDOW_OVERLAP * int(self.config.features.hop_length)
            generator = (
                f"Vocos generator ({vocoder_loading.num_params(p['generator']):,} parameters, "
                f"{v.vocos_layers} ConvNeXt blocks of {v.vocos_dim} channels, inner "
                f"{v.vocos_intermediate_dim}, inverse STFT n_fft {n_fft})"
            )
        else:
            generator = (
                f"HiFi-GAN generator ({vocoder_loading.num_params(p['generator']):,} "
                f"parameters, {v.generator_channels} channels, {v.resblocks} residual blocks "
                "per stage, upsampling 5x4x4x2)"
            )
        return (
            f"model: {generator} and {v.discriminator} discriminators "
            f"({vocoder_loading.num_params(p['discriminator']):,} parameters), "
            f"{build.compute_dtype(self.config)} compute, float32 parameters"
        )

    def train_step(self, setup: state_lib.TrainSetup) -> step_lib.StepFn:
        weights, start = loss_weights(self.config), int(self.config.vocoder.adversarial_start)
        return make_vocoder_step(setup.spec.graphdef, setup.tx, self.cfg, weights, start)

    def batch_shardings(self) -> dict:
        ranks = VOCODER_BATCH_RANKS | (GTA_BATCH_RANKS if self.config.vocoder.gta_mels else {})
        return {k: mesh_lib.batch_sharding(self.mesh, nd) for k, nd in ranks.items()}

    def diagnostic_grads_fn(self, setup: state_lib.TrainSetup) -> Callable:
        """The generator's gradients of a batch (the diagnostics' (params, model_vars,
        batch, key, step) -> (gradients, sums)), against the current discriminators."""
        from jaxspeech.vocoder import losses as vl  # only when diagnosing
        from jaxspeech.vocoder.objective import device_batch

        graphdef, cfg, weights = setup.spec.graphdef, self.cfg, loss_weights(self.config)

        def grads_fn(params, model_vars, batch, key, step):
            del model_vars, key, step

            def objective(gen_params):
                model = nnx.merge(graphdef, params | {"generator": gen_params})
                vb = device_batch(batch, cfg)
                return vl.generator_loss(model.generator, model.discriminator, vb, cfg, **weights)

            (loss, parts), grads = jax.value_and_grad(objective, has_aux=True)(params["generator"])
            return grads, {"objective": loss, "tokens": jnp.float32(1.0)} | parts

        return grads_fn

    def step_flops(self, shapes: dict) -> float | None:
        return None  # not counted (logged once by init_monitoring)

    # ------------------------------------------------------------------ monitoring
    def init_monitoring(self, setup: state_lib.TrainSetup, writer: MetricWriter) -> None:
        self.writer = writer
        self.evaluator = VocoderEvaluator(self.config, self.mesh, self.gen_graphdef)
        if self.config.monitor.count_flops:
            log("MFU: model FLOPs are not counted for config.task=vocoder")

    def samples(self, step: int, params: dict, model_vars: dict, local: dict) -> None:
        self.evaluator.samples(step, params, local, self.writer, self.workdir)

    def evaluate_split(
        self, split: str, step: int, params: dict, model_vars: dict, fault_log: FaultLog
    ) -> EvalResult:
        raw = self.evaluator.evaluate_split(split, params, model_vars, fault_log)
        return eval_result(raw, step)


def eval_result(raw: dict, step: int) -> EvalResult:
    """The trainer's view of one split's result (`VocoderEvaluator.evaluate_split`); the
    checkpoints rank by its mel L1."""
    return EvalResult(
        split=raw["split"],
        scalars=eval_scalars(raw),
        description=describe_result(raw, step),
        headline={k: raw[k] for k in ("mel_l1", "mcd_dtw_db") if k in raw},
        best=raw["mel_l1"],
        raw=raw,
    )


def eval_scalars(result: dict) -> dict[str, float]:
    """The metric writers' scalars of a result (the figures it has)."""
    keys = (
        "mel_l1",
        "mel_l1_compared",
        "mcd_dtw_db",
        "griffin_lim_mel_l1",
        "griffin_lim_mcd_dtw_db",
    )
    split = result["split"]
    return {f"eval/{split}/{k}": result[k] for k in keys if result.get(k) is not None}


def describe_result(result: dict, step: int) -> str:
    """The console line of a result."""
    r = result
    compared = "no comparison (vocoder.eval_utterances=0)"
    if r["compared_utterances"]:

        def show(x):
            return "n/a" if x is None else f"{x:.2f}"

        compared = (
            f"on {r['compared_utterances']} of them: the vocoder's mel L1 "
            f"{show(r['mel_l1_compared'])}, MCD-DTW {show(r['mcd_dtw_db'])} dB; "
            f"Griffin-Lim mel L1 {show(r['griffin_lim_mel_l1'])}, MCD-DTW "
            f"{show(r['griffin_lim_mcd_dtw_db'])} dB"
        )
    return (
        f"eval {r['split']} at step {step}: log-mel L1 {r['mel_l1']:.4f} over "
        f"{r['num_utts']} utterances ({r['skipped']} skipped); {compared} "
        f"({r['eval_seconds']:.0f} s)"
    )
