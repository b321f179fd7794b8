"""Text-to-speech as a task of the one trainer (`jaxspeech.training.task`): FastSpeech2
(`jaxspeech.tts.model`) on the phonemes and durations of the train split, one speaker
embedding per train speaker.

- assets: the phoneme and speaker tables, the pitch and feature statistics
  (`jaxspeech.tts.assets`), in RUN/assets;
- data: `jaxspeech.tts.batch` over the recognizer's bucket plan (config.data);
- state: the model's parameters laid out by the run's rules; its `model_vars` are the
  statistics the targets are normalized by ({"frontend": {"mean", "std"}, "pitch":
  {"mean", "std"}}: constants that travel in every checkpoint);
- step: `step.make_step` of `tts_objective.make_tts_grads_fn` (all-reduce);
- evaluation and samples: `jaxspeech.tts.training_eval`; checkpoints rank by the first
  eval split's mel L1 ("eval_mel_l1", lower is better).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common import storage
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
from jaxspeech.tts import assets as tts_assets
from jaxspeech.tts import batch as tts_batch
from jaxspeech.tts.loading import model_arguments, target_stats
from jaxspeech.tts.model import FastSpeech2
from jaxspeech.tts.objective import make_tts_grads_fn
from jaxspeech.tts.training_eval import TtsEvaluator

# The loader's arrays (`jaxspeech.tts.batch`) and their ranks: each split by rows.
TTS_BATCH_RANKS = {
    "audio": 2,
    "audio_len": 1,
    "tokens": 2,
    "token_len": 1,
    "durations": 2,
    "speaker": 1,
    "pitch": 2,
    "weight": 1,
    "label_overflow": 1,
    "corrupt": 1,
}
BEST_METRIC = "eval_mel_l1"


class TtsTask:
    """The synthesizer of config.tts (see the module docstring)."""

    name = "tts"
    best_metric_name = BEST_METRIC

    def __init__(self, config: ConfigDict, mesh: Mesh):
        self.config, self.mesh = config, mesh
        self.cfg = build.feature_config(config)

    # ------------------------------------------------------------------ assets and data
    def install_assets(self, workdir: str, every_process: bool) -> None:
        self.workdir = workdir  # samples are written under it
        self.assets = tts_assets.install_tts_assets(self.config, workdir, every_process)
        a = self.assets
        log(
            f"text-to-speech: {a.table.size} phoneme ids (<pad>, <unk> and the train "
            f"split's {a.table.size - 2}), {len(a.speakers)} speakers; log F0 mean "
            f"{a.pitch_mean:.3f} (= {np.exp(a.pitch_mean):.0f} Hz), std {a.pitch_std:.3f}"
        )

    def train_pipeline(self):
        config = self.config
        try:
            pipe = tts_batch.make_tts_pipeline(
                data_dir=config.data.dir,
                split=config.data.train_split,
                table=self.assets.table,
                speakers=self.assets.speakers,
                spec=build.train_bucket_spec(config, self.mesh),
                hop_length=self.cfg.hop_length,
                seed=config.seed,
                train=True,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                loader_shards=int(config.data.loader_shards),
                num_workers=config.data.num_workers,
                prefetch=config.data.prefetch,
                retry=build.retry_policy(config),
                with_ids=bool(config.monitor.log_batch_ids),
            )
        except (FileNotFoundError, reader_lib.ShardError, ValueError) as e:
            raise UserError(str(e)) from e
        log(f"train data: {pipe.describe()}")
        return pipe

    def check_eval_settings(self) -> None:
        """The evaluation splits now, not at the first evaluation: each must carry
        phonemes and only voices of the run's speaker table."""
        config, tr = self.config, self.config.train
        self.eval_splits = parse_splits(config.data.eval_split)
        if not (tr.eval_every or tr.eval_at_end):
            return
        data_dir = storage.local_data(config.data.dir, *self.eval_splits)
        for split in self.eval_splits:
            try:
                speakers = set(tts_assets.split_speakers(data_dir, split))
            except FileNotFoundError as e:  # not prepared: the message says how
                raise UserError(str(e)) from e
            tts_assets.read_inventory(data_dir, split)
            unknown = sorted(speakers - set(self.assets.speakers))
            if unknown:
                s = "s" if len(unknown) > 1 else ""
                raise UserError(
                    f"{data_dir}/{split} has {len(unknown)} speaker{s} the train split lacks "
                    f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}): a "
                    "synthesizer speaks only its training voices; evaluate on a split of "
                    "train speakers (config.data.eval_split)"
                )

    # ------------------------------------------------------------------ model and step
    def make_model(self, seed: int) -> FastSpeech2:
        a = self.assets
        kwargs = model_arguments(self.config, a.table.size, len(a.speakers))
        return FastSpeech2(**kwargs, rngs=nnx.Rngs(params=seed))

    def init_state(self) -> tuple[state_lib.TrainState, state_lib.TrainSetup]:
        """FastSpeech2 (seeded by config.seed), the target statistics and the optimizer,
        laid out on the mesh at step 0."""
        config = self.config
        stats = target_stats(self.assets)
        try:
            strategy = sync_lib.strategy_from_config(config.get("sync"), dict(self.mesh.shape))
            spec = build.model_spec(self.make_model, stats, self.mesh)
        except ValueError as e:  # a bad model or sync setting
            raise UserError(f"config: {e}") from e

        def init():
            return nnx.to_pure_dict(nnx.state(self.make_model(config.seed), nnx.Param))

        params = jax.jit(init, out_shardings=spec.param_shardings)()
        model_vars = jax.device_put(stats, spec.var_shardings)
        return state_lib.state_on_mesh(config, strategy, spec, params, model_vars)

    def describe_model(self, setup: state_lib.TrainSetup) -> str:
        m = self.config.tts.model
        return (
            f"model: FastSpeech2, {m.encoder_layers} + {m.decoder_layers} Conformer blocks of "
            f"dim {m.dim}, {self.assets.table.size} phoneme ids, {len(self.assets.speakers)} "
            f"speakers, {build.compute_dtype(self.config)} compute, float32 parameters"
        )

    def grads_fn(self, setup: state_lib.TrainSetup, grad_accum: int = 1) -> Callable:
        return make_tts_grads_fn(setup.spec.graphdef, self.cfg, self.config.tts.loss, grad_accum)

    def train_step(self, setup: state_lib.TrainSetup) -> step_lib.StepFn:
        grads = self.grads_fn(setup, int(self.config.train.grad_accum))
        return step_lib.make_step(
            grads,
            setup.tx,
            self.config.seed,
            strategy=setup.strategy,
            param_shardings=setup.spec.param_shardings,
        )

    def batch_shardings(self) -> dict:
        return {k: mesh_lib.batch_sharding(self.mesh, nd) for k, nd in TTS_BATCH_RANKS.items()}

    def diagnostic_grads_fn(self, setup: state_lib.TrainSetup) -> Callable:
        return self.grads_fn(setup)

    def step_flops(self, shapes: dict) -> float | None:
        return None  # not counted (logged once by init_monitoring)

    # ------------------------------------------------------------------ monitoring
    def init_monitoring(self, setup: state_lib.TrainSetup, writer: MetricWriter) -> None:
        self.writer = writer
        self.evaluator = TtsEvaluator(self.config, self.mesh, setup.spec.graphdef, self.assets)
        if self.config.monitor.count_flops:
            log("MFU: model FLOPs are not counted for config.task=tts")

    def samples(self, step: int, params: dict, model_vars: dict, local: dict) -> None:
        self.evaluator.samples(step, params, model_vars, local, self.writer, self.workdir)

    def evaluate_split(
        self, split: str, step: int, params: dict, model_vars: dict, fault_log: FaultLog
    ) -> EvalResult:
        raw = self.evaluator.evaluate_split(split, params, model_vars, fault_log)
        return eval_result(raw, step)


def eval_result(raw: dict, step: int) -> EvalResult:
    """The trainer's view of one split's result (`TtsEvaluator.evaluate_split`); the
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
    keys = ("mel_l1", "mel_l1_db", "duration_error_frames", "mcd_dtw_db")
    split = result["split"]
    return {f"eval/{split}/{k}": result[k] for k in keys if result.get(k) is not None}


def describe_result(result: dict, step: int) -> str:
    """The console line of a result."""
    r = result
    mcd = (
        f"MCD-DTW {r['mcd_dtw_db']:.2f} dB over {r['mcd_utterances']} synthesized"
        if r["mcd_dtw_db"] is not None
        else "no MCD (tts.mcd_utterances=0)"
    )
    return (
        f"eval {r['split']} at step {step}: mel L1 {r['mel_l1']:.4f} ({r['mel_l1_db']:.2f} "
        f"dB), duration error {r['duration_error_frames']:.2f} frames/phoneme, {mcd} "
        f"({r['num_utts']} utterances, {r['skipped']} skipped, {r['eval_seconds']:.0f} s)"
    )
