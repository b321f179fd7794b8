"""launch_tpu.sh against a fake `gcloud` (tests/fakes/tpu/gcloud) that records its calls and
plays a TPU slice whose workers are directories here: creating the slice, copying and
installing the code, the command on every worker, a preemption and a maintenance event
with the run restarted until it reports finished, deleting, --dry_run, usage errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch_tpu.sh")
FAKES = os.path.join(ROOT, "tests", "fakes", "tpu")
CREATE = ["--accelerator_type", "v5p-16", "--runtime_version", "v2-alpha-tpuv5"]
FAKE_TRAIN = ["--module", "tests.fakes.fake_train", "--until_finished"]


def _launch(tmp_path, *args, workers=2):
    env = dict(
        os.environ,
        PATH=f"{FAKES}:{os.environ['PATH']}",
        FAKE_GCLOUD_DIR=str(tmp_path),
        FAKE_GCLOUD_WORKERS=str(workers),
        FAKE_REAL_PYTHON=sys.executable,
        LAUNCH_TPU_POLL_S="0",
    )
    return subprocess.run(
        ["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=300
    )


def _calls(tmp_path):
    """The fake gcloud's calls, each as (group, verb) plus the argv."""
    path = tmp_path / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def _verbs(calls):
    """(group, verb, --worker) per call: the launcher's sequence of actions."""
    out = []
    for argv in calls:
        worker = next((a.split("=")[1] for a in argv if a.startswith("--worker=")), None)
        out.append(tuple(x for x in (argv[2], argv[3], worker) if x))
    return out


def _events(run):
    return [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]


def test_a_preempted_spot_slice_is_recreated_and_the_run_resumes_until_it_finishes(tmp_path):
    run = tmp_path / "shared" / "run"
    proc = _launch(
        tmp_path,
        "--tpu", "pod", "--zone", "us-z", "--project", "p", *CREATE, "--spot",
        "--sync", "--setup", "--delete_when_done", *FAKE_TRAIN,
        "--", "--workdir", str(run), "--scenario", "preempt",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ssh_all, ssh_0 = ("tpu-vm", "ssh", "all"), ("tpu-vm", "ssh", "0")
    incarnation = [
        ("tpu-vm", "describe"),
        ("tpu-vm", "create"),
        ("tpu-vm", "scp", "all"),
        ssh_all,  # unpack the code
        ssh_all,  # install
        ssh_all,  # run
    ]
    assert (
        _verbs(_calls(tmp_path))
        == [
            *incarnation,
            ("tpu-vm", "describe"),  # PREEMPTED: no status to ask for
            ("tpu-vm", "describe"),
            ("tpu-vm", "delete"),
            *incarnation[1:],  # recreated, the code copied and installed again, run again
            ("tpu-vm", "describe"),
            ssh_0,  # status: finished
            ("tpu-vm", "delete"),  # --delete_when_done
        ]
    )
    calls = _calls(tmp_path)
    create = calls[1]
    assert create[create.index("--accelerator-type") + 1] == "v5p-16"
    assert create[create.index("--version") + 1] == "v2-alpha-tpuv5" and "--spot" in create
    assert all(c[c.index("--zone") + 1] == "us-z" and "--project" in c for c in calls)
    # The run resumed where the preemption left it and finished; worker 0's output was
    # streamed, the other worker's only logged.
    assert _events(run) == ["started", "preempted", "resumed", "finished"]
    assert "fake_train: worker 0 attempt 2" in proc.stdout
    assert "fake_train: worker 1" not in proc.stdout
    log = (tmp_path / "workers" / "w1" / ".jaxspeech" / "run.log").read_text()
    assert "fake_train: worker 1 attempt 2" in log
    # The recreated slice got the code again and the TPU build installed.
    pip = (tmp_path / "workers" / "w1" / "pip_calls").read_text()
    assert "install --quiet -e .[tpu]" in pip
    assert (tmp_path / "workers" / "w0" / "jaxspeech" / "launch" / "tpu_worker.sh").exists()
    assert "restart 1 of 20" in proc.stderr and "has finished" in proc.stderr
    assert not (tmp_path / "slice.json").exists()  # deleted when done


def test_after_a_maintenance_event_the_command_restarts_on_the_same_slice(tmp_path):
    run = tmp_path / "run"
    first = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *CREATE, "--sync", "--setup",
        *FAKE_TRAIN, "--", "--workdir", str(run), "--scenario", "maintenance",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    verbs = _verbs(_calls(tmp_path))
    assert verbs.count(("tpu-vm", "create")) == 1 and ("tpu-vm", "delete") not in verbs
    assert verbs.count(("tpu-vm", "ssh", "all")) == 4  # unpack, install, 2 runs
    assert "exit_code=137 state=dead" in first.stderr
    assert _events(run) == ["started", "resumed", "finished"]
    # Run again on the existing slice: no create, no copy, no install; it is finished.
    os.remove(tmp_path / "calls.jsonl")
    again = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *FAKE_TRAIN, "--", "--workdir", str(run)
    )
    assert again.returncode == 0, again.stderr
    assert _verbs(_calls(tmp_path)) == [
        ("tpu-vm", "describe"),
        ("tpu-vm", "ssh", "all"),
        ("tpu-vm", "describe"),
        ("tpu-vm", "ssh", "0"),
    ]


def test_a_user_error_is_not_retried_and_a_missing_slice_needs_its_type(tmp_path):
    run = tmp_path / "run"
    proc = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *CREATE, "--sync", "--setup",
        *FAKE_TRAIN, "--", "--workdir", str(run), "--scenario", "user_error",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "exited with code 2" in proc.stderr and "not restarting" in proc.stderr
    assert _verbs(_calls(tmp_path)).count(("tpu-vm", "ssh", "all")) == 3
    other = tmp_path / "other"
    other.mkdir()
    proc = _launch(other, "--tpu", "pod", "--zone", "z", "--", "--config", "c", "--workdir", "w")
    assert proc.returncode == 2 and "give --accelerator_type and --runtime_version" in proc.stderr


def test_queued_resources_create_wait_and_delete(tmp_path):
    run = tmp_path / "run"
    proc = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *CREATE, "--queued", "--sync", "--setup",
        *FAKE_TRAIN, "--", "--workdir", str(run), "--scenario", "maintenance",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = _calls(tmp_path)
    create = next(c for c in calls if c[3] == "create")
    assert create[2] == "queued-resources" and create[create.index("--node-id") + 1] == "pod"
    assert create[create.index("--runtime-version") + 1] == "v2-alpha-tpuv5"
    assert ("queued-resources", "describe") in _verbs(calls)  # waited until ACTIVE
    proc = _launch(tmp_path, "--tpu", "pod", "--zone", "z", "--queued", "--delete")
    assert proc.returncode == 0, proc.stderr
    assert _calls(tmp_path)[-1][2:4] == ["queued-resources", "delete"]
    assert "--force" in _calls(tmp_path)[-1] and not (tmp_path / "slice.json").exists()


def test_another_module_runs_once_with_its_arguments_intact(tmp_path):
    run_args = ["--workdir", str(tmp_path / "run one"), "--x='q'", "a b", "$HOME", "--scenario"]
    proc = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *CREATE, "--sync", "--setup",
        "--module", "tests.fakes.fake_train", "--", *run_args, "user_error",
    )  # fmt: skip
    assert proc.returncode == 2  # the module's own exit code; no restart without --until_finished
    argv = next(ln for ln in proc.stdout.splitlines() if ln.startswith("argv "))
    assert json.loads(argv[5:]) == [*run_args, "user_error"]
    assert _verbs(_calls(tmp_path))[-1] == ("tpu-vm", "ssh", "all")


def test_dry_run_prints_every_step_and_runs_none(tmp_path):
    proc = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", *CREATE, "--spot", "--sync", "--setup",
        "--delete_when_done", "--dry_run", "--", "--config", "c.py", "--workdir", "/mnt/r",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "calls.jsonl").exists()
    printed = [ln for ln in proc.stderr.splitlines() if ln.startswith("+ ")]
    text = "\n".join(printed).replace("\\", "")
    for expected in [
        "gcloud compute tpus tpu-vm create pod --zone z --accelerator-type v5p-16",
        "gcloud compute tpus tpu-vm scp",
        "pip install --quiet -e '.[tpu]'",
        "launch/tpu_worker.sh run jaxspeech.train --config c.py --workdir /mnt/r",
        "launch/tpu_worker.sh status /mnt/r",
        "gcloud compute tpus tpu-vm delete pod --zone z --quiet",
    ]:
        assert expected in text, (expected, text)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--zone", "z", "--", "--config", "c"], "--tpu and --zone are required"),
        (["--tpu", "t", "--zone", "z"], "no arguments for jaxspeech.train"),
        (["--tpu", "t", "--zone", "z", "--config", "c"], "unknown option --config"),
        (["--tpu", "t", "--zone", "z", "--", "--config", "c"], "needs --workdir"),
        (["--tpu", "t", "--zone", "z", "--accelerator_type", "v5p-8", "--", "--workdir", "w"],
         "go together"),
        (["--tpu", "t", "--zone", "z", "--max_restarts", "x", "--", "--workdir", "w"],
         "whole number"),
    ],
)  # fmt: skip
def test_usage_mistakes_are_one_clear_error(tmp_path, args, message):
    proc = _launch(tmp_path, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "calls.jsonl").exists()
