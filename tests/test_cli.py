"""The command lines behave alike (`jaxspeech.common.cli`): `--help` exits 0 and lists the tool's
own flags (not absl's, grain's or orbax's); `python -m jaxspeech.status` takes
`--workdir RUN` or `RUN` with the launchers' exit codes; `train --config_help` lists every
config key with its default and comment; known library noise (Orbax's read-only notes,
Beam's routine lines) stays off the console and everything else reaches it.

The absl entry points' `--help` and `--config_help` run in one subprocess, each as
`python -m` runs it (runpy, as __main__), so their shared imports load once: run this
module as a program to see it (`python -m tests.test_cli '[["jaxspeech.train", ["--help"]]]'`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import runpy
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each absl entry point, and flags of its own (its module's, multi-host, decoding) that
# its --help must list.
OWN_FLAGS = {
    "jaxspeech.train": ["--config", "--workdir", "--[no]config_help", "--coordinator_address"],
    "jaxspeech.evaluate": ["--workdir", "--data", "--split", "--[no]watch", "--method"],
    "jaxspeech.transcribe": ["--workdir", "--[no]json", "--window_s", "--lm", "--beam"],
    "jaxspeech.export": ["--workdir", "--output", "--format", "--[no]int8", "--process_id"],
    "jaxspeech.status": ["--workdir"],
    "jaxspeech.devices": ["--config", "--coordinator_address", "--heartbeat_timeout_s"],
    "jaxspeech.launch_local": ["--num_processes", "--devices_per_process", "--grace_s"],
    "jaxspeech.teach": ["--teacher", "--workdir", "--top_k", "--num_processes"],
    "jaxspeech.synthesize": ["--workdir", "--artifact", "--text_file", "--speaker", "--output"],
}
LIBRARY_FLAGS = ("--verbosity", "--logtostderr", "--grain_", "--experimental_orbax", "--pdb")
RUNS = [[module, ["--help"]] for module in OWN_FLAGS] + [
    ["jaxspeech.train", ["--config_help"]],
    ["jaxspeech.train", ["--config", "configs/demo.py:tiny", "--config_help"]],
    ["jaxspeech.train", ["--helpfull"]],
]


def run_entry_points(runs: list[list]) -> list[dict]:
    """Runs each [module, args] as `python -m module args` does, in this process, and
    returns each one's exit code and stdout. The flags a run defined are deleted after it
    (the next entry point defines its own), the libraries' stay (imported once)."""
    from absl import app, flags

    app.define_help_flags()
    for module, _ in runs:
        __import__(module)  # the libraries' flags are defined on import: keep them
    base = set(flags.FLAGS)
    results = []
    for module, args in runs:
        sys.argv = [module, *args]  # runpy puts the module's path in sys.argv[0]
        out, code = io.StringIO(), None
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code
        results.append({"code": code, "stdout": out.getvalue()})
        for name in set(flags.FLAGS) - base:
            if name in flags.FLAGS:
                delattr(flags.FLAGS, name)
    return results


@pytest.fixture(scope="module")
def outputs() -> dict:
    """{(module, args...): {"code", "stdout"}} of RUNS, from one subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.test_cli", json.dumps(RUNS)],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    return {(m, *a): r for (m, a), r in zip(RUNS, results, strict=True)}


@pytest.mark.parametrize("module", list(OWN_FLAGS))
def test_help_exits_0_with_the_usage_and_the_tools_own_flags(outputs, module):
    result = outputs[(module, "--help")]
    text = result["stdout"]
    assert result["code"] == 0, text
    assert f"python -m {module}" in text  # the usage: the module's docstring
    listed = set(re.findall(r"^  (--[\w\[\]]+):", text, re.M))
    assert set(OWN_FLAGS[module]) <= listed, listed
    assert not [f for f in listed if f.startswith(LIBRARY_FLAGS)], listed
    if module != "jaxspeech.status":  # the only one that imports no library with flags
        assert "--helpfull" in text


def test_helpfull_adds_the_libraries_flags(outputs):
    result = outputs[("jaxspeech.train", "--helpfull")]
    assert result["code"] == 0
    assert "--[no]config_help" in result["stdout"] and "--verbosity" in result["stdout"]


def test_train_help_points_to_the_config_keys(outputs):
    text = outputs[("jaxspeech.train", "--help")]["stdout"]
    assert "--config.KEY=VALUE" in text and "--config_help" in text


def test_train_config_help_lists_the_keys_and_exits_without_training(outputs):
    from jaxspeech.config import keys

    result = outputs[("jaxspeech.train", "--config_help")]
    assert result["code"] in (0, None), result["stdout"]  # absl: sys.exit(main(argv))
    assert result["stdout"].strip() == "\n".join(keys.describe_keys())
    given = outputs[("jaxspeech.train", "--config", "configs/demo.py:tiny", "--config_help")]
    assert "train.num_steps = 8  (default: 1350)" in given["stdout"]


def test_describe_keys_gives_every_key_its_default_and_comment():
    from jaxspeech.config import defaults, keys

    text = "\n".join(keys.describe_keys())
    flat_text = " ".join(text.split())
    comments = keys.key_comments()
    for key, value in keys.flat(defaults.get_config().to_dict()).items():
        assert f"{key} = {value!r}" in text, key
        assert comments[key] and " ".join(comments[key].split()) in flat_text, key
    assert "[mesh.rules] Logical axis -> mesh axes" in text  # a table: one comment for all


# ---------------------------------------------------------------- status
FINISHED = {"event": "finished", "time": 1, "step": 8}


def _run(tmp_path, *events: dict) -> str:
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(run)


def test_status_takes_workdir_or_a_positional_run(tmp_path, capsys):
    from jaxspeech import status

    run = _run(tmp_path, {"event": "started", "time": 0, "step": 0}, FINISHED)
    for argv in (["status", run], ["status", "--workdir", run], ["status", f"--workdir={run}"]):
        assert status.main(argv) == 0
        out, err = capsys.readouterr()
        assert out.startswith("state=finished step=8") and err == ""


def test_status_of_an_unfinished_run_exits_1(tmp_path, capsys):
    from jaxspeech import status

    run = _run(tmp_path, {"event": "preempted", "time": 1, "step": 4})
    assert status.main(["status", "--workdir", run]) == 1
    assert capsys.readouterr().out.startswith("state=preempted step=4")


def test_status_of_a_running_run_reports_the_step_its_job_reached(tmp_path, capsys):
    """The `started` event holds the step the job started from; the job's progress is in
    its lease, renewed with each heartbeat (`Lease.check(step)`)."""
    from jaxspeech import status
    from jaxspeech.runs import lease

    run = _run(tmp_path, {"event": "started", "time": 0, "step": 0})
    held = lease.Lease(os.path.join(run, lease.LEASE), "train", 60.0, warn=print)
    held.acquire()
    try:
        held.check(52)
        held.heartbeat()
        assert status.main(["status", run]) == 1
        assert capsys.readouterr().out.startswith("state=running step=52 ")
    finally:
        held.release()


def test_ctrl_c_in_a_read_only_tool_is_one_line_and_exit_130(tmp_path):
    """`cli.run_job` (evaluate, transcribe, export; status and data_prep's commands use
    `interrupt_as_one_line` directly): no traceback, the tool's name, exit code 130."""
    tool = tmp_path / "evaluate.py"  # the tool's name comes from its module's file
    tool.write_text(
        "import os, signal, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # not the shell's ignore\n"
        "from jaxspeech.common import cli\n"
        "def job():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(60)\n"
        "cli.run_job(job)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(tool)], capture_output=True, text=True, env=env, timeout=300
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "evaluate: interrupted\n")


def test_status_of_a_missing_directory_is_none_and_says_so(tmp_path, capsys):
    from jaxspeech import status

    missing = str(tmp_path / "nowhere")
    assert status.main(["status", missing]) == 1  # the launchers then start the run
    out, err = capsys.readouterr()
    assert out.startswith("state=none")
    assert err.count("\n") == 1 and f"{missing} does not exist" in err


@pytest.mark.parametrize(
    "args,says",
    [
        (["--workdir", "{run}", "{run}"], "not both"),
        (["{run}", "extra"], "got 2 arguments"),
        ([], "no run given"),
        (["--no_such_flag", "{run}"], "no_such_flag"),
        (["{run}/events.jsonl"], "is not a directory"),
    ],
)
def test_status_usage_mistakes_are_one_line_and_exit_2(tmp_path, capsys, args, says):
    from jaxspeech import status

    run = _run(tmp_path, FINISHED)
    with pytest.raises(SystemExit) as exit_:
        status.main(["status", *(a.format(run=run) for a in args)])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err and err.startswith("error: ")


# ---------------------------------------------------------------- cli helpers
def test_help_after_a_double_dash_is_the_childrens(capsys):
    from jaxspeech.common import cli

    cli.exit_if_help(["launch_local", "--num_processes", "2", "--", "--help"])  # no exit
    with pytest.raises(SystemExit) as exit_:
        cli.exit_if_help(["launch_local", "-h", "--", "--config", "c.py"])
    assert exit_.value.code == 0 and capsys.readouterr().out


def test_an_unknown_config_key_is_named_in_full():
    from jaxspeech.common import cli

    error = "'\\'num_step\\'\\nDid you mean \"num_steps\" instead of \"num_step\"?'"
    message = cli._unknown_config_key(error, ["train", "--config.train.num_step=3"])
    assert message.startswith("unknown config key train.num_step (did you mean num_steps?)")
    assert "--config_help" in message
    assert cli._unknown_config_key("'other'", ["train", "--config.train.num_step=3"]) is None


def test_orbax_read_only_notes_are_dropped_and_other_warnings_kept():
    from jaxspeech.common import cli

    noise = cli._KnownLibraryNoise()

    def record(path: str, msg: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord("absl", level, path, 1, msg, None, None)

    orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
    assert not noise.filter(record(orbax, "Given directory is read only=/r/checkpoints"))
    assert not noise.filter(
        record(orbax, "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0.")
    )
    assert noise.filter(record(orbax, "Some other Orbax warning"))
    assert noise.filter(record(orbax, "Given directory is read only=/r", logging.ERROR))
    assert noise.filter(record("/jaxspeech/runs/checkpoint.py", "Given directory is read only"))


# ---------------------------------------------------------------- data_prep
def test_data_prep_help_exits_0_and_lists_the_commands_flags(capsys):
    from data_prep import lm, prepare, verify
    from data_prep.demo import synth

    assert prepare.main(["prepare", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f in out for f in ("--input", "--split", "--[no]verbose")), out
    assert lm.main(["lm", "--help"]) == 0
    assert "--order" in capsys.readouterr().out
    for main, flag in ((verify.main, "--verbose"), (synth.main, "--hours")):
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])
        assert exit_.value.code == 0 and flag in capsys.readouterr().out


def test_beam_routine_lines_are_dropped_from_this_process_and_its_children(capfd):
    from data_prep import runner

    child = (
        "import sys; sys.stderr.write('INFO:__main__:Logging handler created.\\n"
        "WARNING:root:apitools not found, and bigquery client libraries are not available\\n"
        "Traceback (most recent call last):\\n')"
    )
    with runner.quiet_beam_output():
        os.write(2, b"INFO:apache_beam.runners.worker.sdk_worker:Control channel established.\n")
        os.write(2, b"error: a real problem\n")
        subprocess.run([sys.executable, "-c", child], check=True)
    with runner.quiet_beam_output(enabled=False):  # --verbose
        os.write(2, b"INFO:apache_beam:kept\n")
    err = capfd.readouterr().err
    assert (
        err == "error: a real problem\nTraceback (most recent call last):\nINFO:apache_beam:kept\n"
    )


if __name__ == "__main__":
    print(json.dumps(run_entry_points(json.loads(sys.argv[1]))))
