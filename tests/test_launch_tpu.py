"""launch_tpu.sh against a fake `gcloud`: the command every TPU worker runs, its quoting
(executed by a shell as the workers would), and the usage errors."""

import os
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch_tpu.sh")


def _exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _launch(tmp_path, *args):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # The fake gcloud records its arguments, one per line (NUL-free, none contain newlines).
    _exe(bin_dir / "gcloud", f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/gcloud_args\n')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run(
        ["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_every_worker_runs_the_train_module_with_the_arguments_intact(tmp_path):
    run_args = ["--config", "configs/conformer.py:L", "--workdir", "gs://b/run one", "--x='q'"]
    proc = _launch(tmp_path, "--tpu", "pod", "--zone", "us-z", "--project", "p", "--", *run_args)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "gcloud_args").read_text().splitlines()
    assert argv[:5] == ["compute", "tpus", "tpu-vm", "ssh", "pod"]
    assert "--worker=all" in argv and argv[argv.index("--zone") + 1] == "us-z"
    assert argv[argv.index("--project") + 1] == "p"
    remote = argv[argv.index("--command") + 1]
    # Run the remote command the way a worker's shell would, in a fake checkout whose
    # python prints the arguments it receives.
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    _exe(repo / ".venv" / "bin" / "python", '#!/bin/sh\nprintf "%s\\n" "$@"\n')
    remote = remote.replace("cd ~/jaxspeech", f"cd {repo}")
    out = subprocess.run(["bash", "-c", remote], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["-m", "jaxspeech.train", *run_args]


def test_setup_installs_the_tpu_build_first_and_dry_run_only_prints(tmp_path):
    proc = _launch(
        tmp_path, "--tpu", "pod", "--zone", "z", "--setup", "--dry_run", "--", "--config", "c.py"
    )
    assert proc.returncode == 0 and not (tmp_path / "gcloud_args").exists()
    assert "pip install --quiet -e '.[tpu]'" in proc.stdout.replace("\\", "")
    assert "gcloud compute tpus tpu-vm ssh pod" in proc.stdout


def test_usage_mistakes_are_one_clear_error(tmp_path):
    for args, message in [
        (["--zone", "z", "--", "--config", "c"], "--tpu and --zone are required"),
        (["--tpu", "t", "--zone", "z"], "no arguments for jaxspeech.train"),
        (["--tpu", "t", "--zone", "z", "--config", "c"], "unknown option --config"),
    ]:
        proc = _launch(tmp_path, *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
