"""Speech recognition as a task of the one trainer (`jaxspeech.training.task`): the
recognizer of `config.model`, its tokenizer, decoders and WER/CER evaluation. The
recognizer's models, decoding, losses and evaluation stay in the core rooms (`models`,
`decoding`, `losses`, `evaluation`), which distillation, long-form serving and export
share; this is the trainer's view of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.data.pipeline import Pipeline
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.decoding import search
from jaxspeech.distill import student
from jaxspeech.evaluation import scoring as eval_lib
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.losses.kernels import common as loss_kernels
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.runs import assets
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs.events import log
from jaxspeech.runs.faults import FaultLog
from jaxspeech.training import batch as batch_lib
from jaxspeech.training import flops as flops_lib
from jaxspeech.training import inputs, monitor
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib
from jaxspeech.training.objective import SoftTargets, make_grads_fn
from jaxspeech.training.task import EvalResult


class AsrTask:
    """Speech recognition: the recognizer of `config.model`, trained on transcripts
    tokenized by the corpus's tokenizer, scored by WER/CER on `data.eval_split`."""

    name = "asr"
    best_metric_name = ckpt_lib.BEST_METRIC

    def __init__(self, config: ConfigDict, mesh: Mesh):
        self.config, self.mesh = config, mesh
        self.soft: SoftTargets | None = None

    # ------------------------------------------------------------------ assets and data
    def install_assets(self, workdir: str, every_process: bool) -> None:
        """The tokenizer and feature statistics, copied into RUN/assets on the first run."""
        self.tokenizer_dir, self.mean, self.std = assets.install_assets(
            self.config, workdir, every_process=every_process
        )
        self.tokenizer = Tokenizer.load(self.tokenizer_dir)

    def train_pipeline(self) -> Pipeline:
        """The training loader (with a teacher's soft targets when config.distill names
        them)."""
        config = self.config
        try:
            self.soft = SoftTargets.from_config(config.get("distill"))
        except ValueError as e:
            raise UserError(f"config: {e}") from e
        extra = None
        if self.soft is not None:
            extra = student.targets_filler(config, self.tokenizer)
        pipe, augmenter = inputs.train_pipeline(config, self.mesh, self.tokenizer_dir, extra)
        log(f"train data: {pipe.describe()}")
        if augmenter is not None:
            log(f"waveform augmentation (host): {augmenter.cfg}")
        return pipe

    def check_eval_settings(self) -> None:
        """Mistakes in the evaluation settings stop the run now, not at its first
        evaluation."""
        self.eval_splits = parse_splits(self.config.data.eval_split)
        eval_lib.normalizer_from_config(self.config)

    # ------------------------------------------------------------------ model and step
    def init_state(self) -> tuple[state_lib.TrainState, state_lib.TrainSetup]:
        """The model, its optimizer and sync strategy, laid out on the mesh at step 0."""
        config = self.config
        try:
            search.uses_lm(config)  # checks the decoding method too
            return state_lib.init_train_state(
                config, self.tokenizer.vocab_size, self.mesh, self.mean, self.std
            )
        except ValueError as e:  # A bad model, loss, decoding or sync setting.
            raise UserError(f"config: {e}") from e

    def describe_model(self, setup: state_lib.TrainSetup) -> str:
        m = self.config.model
        line = f"model: {m.encoder} encoder, {m.head} head, {m.dtype} compute, float32 parameters"
        platform = self.mesh.devices.flat[0].platform
        kernel = loss_kernels.resolve(self.config.loss.get("kernel", "auto"), platform)
        if kernel == "pallas" and loss_kernels.interpret_on(platform):  # never silently
            line += f"; loss.kernel=pallas runs interpreted on {platform} (slow: for tests)"
        return line

    def train_step(self, setup: state_lib.TrainSetup) -> step_lib.StepFn:
        return step_lib.setup_train_step(
            setup, self.config, self.tokenizer.blank_id, soft=self.soft
        )

    def batch_shardings(self) -> dict:
        return batch_lib.batch_shardings(self.mesh, soft_targets=self.soft is not None)

    def diagnostic_grads_fn(self, setup: state_lib.TrainSetup) -> Callable:
        """The objective's gradients of one (micro-)batch, to find a non-finite step's
        source."""
        return make_grads_fn(setup.spec.graphdef, self.tokenizer.blank_id, self.config.loss)

    def step_flops(self, shapes: dict) -> float | None:
        """Model FLOPs of one step on a global batch of `shapes` (None: not countable)."""
        try:
            return flops_lib.step_flops(
                self.config, self.tokenizer.vocab_size, self.tokenizer.blank_id, shapes
            )
        except flops_lib.FlopCountUnavailable as e:  # a metric: train on
            log(f"no MFU for batch shape {tuple(shapes['audio'].shape)}: {e}")
            return None

    # ------------------------------------------------------------------ monitoring
    def init_monitoring(self, setup: state_lib.TrainSetup, writer: MetricWriter) -> None:
        """Decoding for samples and evaluation, and the sample viewer."""
        config, graphdef = self.config, setup.spec.graphdef
        self.decode_fn = search.make_decode_fn(graphdef, config, self.tokenizer.blank_id)
        self.searcher = search.Searcher(config, self.tokenizer, graphdef)
        longest = max(config.data.bucket_boundaries)
        self.viewer = monitor.SampleViewer(
            mesh=self.mesh,
            decode_fn=self.decode_fn,
            searcher=self.searcher,
            features_fn=monitor.make_features_fn(graphdef),
            tokenizer=self.tokenizer,
            writer=writer,
            num_samples=config.monitor.num_samples,
            samples=int(math.ceil(longest * config.features.sample_rate)),
            seed=config.seed,
        )

    def samples(self, step: int, params: dict, model_vars: dict, local: dict) -> None:
        self.viewer(step, params, model_vars, local)

    def evaluate_split(
        self, split: str, step: int, params: dict, model_vars: dict, fault_log: FaultLog
    ) -> EvalResult:
        """WER/CER of one split (the caller holds the mesh)."""
        raw = eval_lib.evaluate_split(
            config=self.config,
            decode_fn=self.decode_fn,
            params=params,
            model_vars=model_vars,
            mesh=self.mesh,
            data_dir=self.config.data.dir,
            split=split,
            tokenizer_dir=self.tokenizer_dir,
            fault_log=fault_log,
            searcher=self.searcher,
        )
        return eval_result(raw, step)


def eval_result(raw: dict, step: int) -> EvalResult:
    """The trainer's view of one split's WER/CER result (`scoring.evaluate_split`)."""
    split = raw["split"]
    return EvalResult(
        split=split,
        scalars={f"eval/{split}/wer": raw["wer"], f"eval/{split}/cer": raw["cer"]},
        description=eval_lib.describe_result(raw, step),
        headline={k: raw[k] for k in ("wer", "cer") if k in raw},
        best=raw["wer"],
        raw=raw,
    )
