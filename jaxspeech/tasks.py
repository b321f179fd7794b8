"""The task registry: what each `config.task` is, for the trainer and the commands.

Each task is a package above the core (`jaxspeech.asr`, `jaxspeech.tts`,
`jaxspeech.vocoder`); this table names, per task, its trainer `Task` and the functions
the commands dispatch to, as "module:attribute" strings imported only when used (a
recognizer's command never imports the synthesizer's code, and the other way round).

- `of_config(config, mesh)`: the trainer's `Task` of `config.task`;
- `of_run(workdir)`: the `TaskEntry` of a finished run (its saved config's task; "asr"
  for a run saved before the key existed), whose `function(command)` is what
  `python -m jaxspeech.{evaluate,export,transcribe}` call, or whose `refusal(command,
  workdir)` is their one line (a vocoder's run has no standalone evaluation);
- `train_and_evaluate(config, workdir)`: the trainer with the registry's task factory
  (what `python -m jaxspeech.train` runs).

The core (`jaxspeech.training` and below) never imports a task package or this module:
the trainer takes the factory as an argument (tests/test_layout.py checks).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jax.sharding import Mesh
from ml_collections import ConfigDict

from jaxspeech.common.errors import UserError
from jaxspeech.config import defaults
from jaxspeech.runs import loading

if TYPE_CHECKING:  # the training stack only when a task is built or trained
    from jaxspeech.training.task import Task

COMMANDS = ("evaluate", "export", "transcribe")  # what the commands ask of a task's run


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """One task of the table. `task` and the commands' functions are "module:attribute"
    paths, imported only when used (`load`); a command the task has no function for
    (None) has a one-line refusal instead, "{workdir}" filled in (`refusal`)."""

    name: str
    task: str  # the trainer's Task class: (config, mesh) -> Task
    evaluate: str | None  # scores a finished run's checkpoint on splits
    export: str  # writes a finished run's deployment artifact
    transcribe: str | None  # turns audio files into text with the run
    refusals: tuple[tuple[str, str], ...] = ()  # (command, one line) where the above is None

    def make_task(self, config: ConfigDict, mesh: Mesh) -> Task:
        """The trainer's `Task` of this entry."""
        return load(self.task)(config, mesh)

    def refusal(self, command: str, workdir: str) -> str | None:
        """The one line refusing `command` on this task's run in `workdir` (None: the task
        has a function for it)."""
        if getattr(self, command) is not None:
            return None
        return dict(self.refusals)[command].format(workdir=workdir)

    def function(self, command: str) -> Callable:
        """The library function of `command` (one of COMMANDS), imported now.

        Raises:
          UserError: the task has none (its refusal; "{workdir}" left as RUN).
        """
        path = getattr(self, command)
        if path is None:
            raise UserError(self.refusal(command, "RUN"))
        return load(path)


_NOT_A_RECOGNIZER = "transcribe takes a recognizer's run (config.task=asr)"
# In the order of `config.validate.TASKS` (which checks config.task; tests/test_tasks.py).
TABLE: dict[str, TaskEntry] = {
    "asr": TaskEntry(
        name="asr",
        task="jaxspeech.asr.task:AsrTask",
        evaluate="jaxspeech.evaluation.run:evaluate_splits",
        export="jaxspeech.serving.recognizer_export:export_run",
        transcribe="jaxspeech.serving.recognizer:transcribe_files",
    ),
    "tts": TaskEntry(
        name="tts",
        task="jaxspeech.tts.task:TtsTask",
        evaluate="jaxspeech.tts.evaluation:evaluate_tts_splits",
        export="jaxspeech.tts.artifact:export_tts_run",
        transcribe=None,
        refusals=(
            (
                "transcribe",
                "{workdir} is a synthesizer's run (config.task=tts); " + _NOT_A_RECOGNIZER,
            ),
        ),
    ),
    "vocoder": TaskEntry(
        name="vocoder",
        task="jaxspeech.vocoder.task:VocoderTask",
        evaluate=None,
        export="jaxspeech.vocoder.artifact:export_vocoder_run",
        transcribe=None,
        refusals=(
            (
                "evaluate",
                "{workdir} is a vocoder's run: its training evaluates it (RUN/eval); score it "
                "on a synthesizer's speech with --workdir TTS_RUN --vocoder_workdir",
            ),
            (
                "transcribe",
                "{workdir} is a vocoder's run (config.task=vocoder); " + _NOT_A_RECOGNIZER,
            ),
        ),
    ),
}


def load(path: str) -> Any:
    """A "package.module:attribute" path -> that attribute (the module imported now)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def entry(name: str) -> TaskEntry:
    """The table's entry of task `name`.

    Raises:
      UserError: an unknown task (one line listing the choices).
    """
    if name not in TABLE:
        raise UserError(f"config.task: unknown task {name!r}; choose one of {', '.join(TABLE)}")
    return TABLE[name]


def of_config(config: ConfigDict, mesh: Mesh) -> Task:
    """The trainer's `Task` for `config.task` ("asr" for a config without the key)."""
    return entry(defaults.lookup(config, "task")).make_task(config, mesh)


def of_run(workdir: str, *, default: str | None = None) -> TaskEntry:
    """The entry of the run in `workdir`: its saved config's task ("asr" for a run saved
    before the key existed). `default`: the task to answer for a directory that holds no
    run (the recognizer's commands then report it in their own words, after checking
    their flags); None: such a directory is one UserError line.

    Raises:
      UserError: `workdir` holds no run (and no `default`), or its task is unknown.
    """
    try:
        config = loading.load_run_config(workdir)
    except FileNotFoundError as e:
        if default is None:
            raise UserError(str(e)) from e
        return entry(default)
    return entry(defaults.lookup(config, "task"))


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
    """`jaxspeech.training.trainer.train_and_evaluate` with the registry's task of
    `config.task`: trains `config` in `workdir` (resuming from its checkpoints); returns
    the final evaluation (see there)."""
    from jaxspeech.training import trainer  # noqa: PLC0415 (the commands need no trainer)

    return trainer.train_and_evaluate(config, workdir, of_config)
