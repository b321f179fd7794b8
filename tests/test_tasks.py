"""The task registry (`jaxspeech.tasks`): the table, a run's task, the commands' dispatch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jaxspeech import tasks
from jaxspeech.common.errors import UserError
from jaxspeech.config import validate


def a_run(tmp_path, config: dict) -> str:
    """A directory holding only a run's saved config (all `of_run` reads)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_registry_holds_the_tasks_config_task_may_name():
    assert tuple(tasks.TABLE) == validate.TASKS
    assert all(name == e.name for name, e in tasks.TABLE.items())


@pytest.mark.parametrize("name", validate.TASKS)
def test_every_function_of_the_table_resolves_or_is_refused_in_one_line(name):
    entry = tasks.TABLE[name]
    assert isinstance(tasks.load(entry.task), type)
    for command in tasks.COMMANDS:
        refusal = entry.refusal(command, "RUN")
        if getattr(entry, command) is None:
            assert "RUN" in refusal and "\n" not in refusal
            with pytest.raises(UserError, match="RUN"):
                entry.function(command)
        else:
            assert refusal is None and callable(entry.function(command))


def test_a_runs_task_comes_from_its_saved_config(tmp_path):
    assert tasks.of_run(a_run(tmp_path / "t", {"task": "tts"})).name == "tts"
    assert tasks.of_run(a_run(tmp_path / "v", {"task": "vocoder"})).name == "vocoder"
    # a run saved before config.task existed is a recognizer's
    assert tasks.of_run(a_run(tmp_path / "old", {"seed": 0})).name == "asr"


def test_no_run_or_an_unknown_task_is_one_line(tmp_path):
    with pytest.raises(UserError, match="is not a jaxspeech run directory") as e:
        tasks.of_run(str(tmp_path / "nothing"))
    assert "\n" not in str(e.value)
    # the commands' default: the recognizer's path, which reports a missing run itself
    assert tasks.of_run(str(tmp_path / "nothing"), default="asr").name == "asr"
    with pytest.raises(UserError, match="unknown task 'nope'; choose one of asr, tts, vocoder"):
        tasks.of_run(a_run(tmp_path / "odd", {"task": "nope"}))


def test_transcribe_refuses_a_synthesizers_run_in_one_line(tmp_path):
    run = a_run(tmp_path / "tts", {"task": "tts"})
    proc = subprocess.run(
        [sys.executable, "-m", "jaxspeech.transcribe", "--workdir", run, "a.wav"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {run} is a synthesizer's run (config.task=tts); transcribe takes a "
        "recognizer's run (config.task=asr)\n"
    )
