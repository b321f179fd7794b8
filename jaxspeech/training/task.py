"""What a training run learns, behind one small interface: the trainer's seam between
tasks (`config.task`).

The trainer (`jaxspeech.training.trainer`) owns everything tasks share: the mesh, the
loop, checkpoints and their restore, preemption, the fault budget, the lease, events,
goodput and the metric writers. A `Task` owns what differs: the run's assets, the train
loader and its batch shardings, the model and its state, the gradient function of the
step, the FLOP count, in-loop evaluation and the periodic samples.

The tasks live in packages above the core (`jaxspeech.asr`, `jaxspeech.tts`,
`jaxspeech.vocoder`); the registry (`jaxspeech.tasks`) hands the trainer a `TaskFactory`,
so nothing here imports a task.

The trainer calls, in this order: `install_assets` -> `train_pipeline` ->
`check_eval_settings` -> `init_state` (+ `describe_model`) -> `train_step` and
`batch_shardings` -> `init_monitoring`; then per step `step_flops` (once per batch
shape), `samples`, and per evaluation `evaluate_split`, whose `EvalResult` carries all
the trainer writes of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.data.pipeline import Pipeline
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.runs.faults import FaultLog
from jaxspeech.training import state as state_lib
from jaxspeech.training import step as step_lib


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """One split's in-loop evaluation, as the trainer writes it.

    split: the split's name; scalars: {"eval/<split>/<name>": value} for the metric
    writers (TensorBoard, trackers); description: the console line(s); headline: the
    figures the "evaluated" and "finished" events carry; best: the checkpoints' ranking
    metric (`Task.best_metric_name`, lower is better); raw: the task's result dict, as
    RUN/eval/ files hold it and `train_and_evaluate` returns it.
    """

    split: str
    scalars: dict[str, float]
    description: str
    headline: dict
    best: float
    raw: dict


class Task(Protocol):
    """What the trainer asks of a task (see the module docstring for the order)."""

    name: str
    eval_splits: list[str]
    best_metric_name: str  # the checkpoints' ranking metric (lower is better)

    def install_assets(self, workdir: str, every_process: bool) -> None: ...
    def train_pipeline(self) -> Pipeline: ...
    def check_eval_settings(self) -> None: ...
    def init_state(self) -> tuple[state_lib.TrainState, state_lib.TrainSetup]: ...
    def describe_model(self, setup: state_lib.TrainSetup) -> str: ...
    def train_step(self, setup: state_lib.TrainSetup) -> step_lib.StepFn: ...
    def batch_shardings(self) -> dict: ...
    def diagnostic_grads_fn(self, setup: state_lib.TrainSetup) -> Callable: ...
    def step_flops(self, shapes: dict) -> float | None: ...
    def init_monitoring(self, setup: state_lib.TrainSetup, writer: MetricWriter) -> None: ...
    def samples(self, step: int, params: dict, model_vars: dict, local: dict) -> None: ...
    def evaluate_split(
        self, split: str, step: int, params: dict, model_vars: dict, fault_log: FaultLog
    ) -> EvalResult: ...


# config, mesh -> the run's task (`jaxspeech.tasks.of_config`).
TaskFactory = Callable[[ConfigDict, Mesh], Task]
