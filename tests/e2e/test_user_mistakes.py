"""User mistakes give one clear error before any work: checked in process through the
trainer's own entry function (`train_and_evaluate`, what `python -m jaxspeech.train`
runs), and through the command lines only where the command line itself is the subject
(flag parsing, exit codes, no traceback)."""

import pytest

from jaxspeech import tasks
from jaxspeech.common import cli
from jaxspeech.common.errors import TrainingDiverged, UserError
from jaxspeech.evaluation import run as eval_run
from tests.e2e.cli import run_module, tiny_config, train_args

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["--config.data.dir=/nonexistent/data"], "'/nonexistent/data' does not exist"),
        (["--config.mesh.data=3"], "needs 3 devices, but 8 are available"),
        (["--config.mesh.replica=3"], "cannot use 8 devices"),
        (["--config.mesh.rules.embed=fdsp"], r"mesh.rules.embed: unknown mesh axes \['fdsp'\]"),
        (["--config.model.head=attention"], "unknown head 'attention'"),
        (["--config.train.grad_accum=0"], "train.grad_accum must be >= 1"),
        (["--config.data.loader_shards=-1"], "data.loader_shards=-1 must be 0"),
    ],
)
def test_config_mistakes_are_one_user_error(corpus, tmp_path, overrides, message):
    _, shards = corpus
    config = tiny_config(shards, *overrides)
    with pytest.raises(UserError, match=message):
        tasks.train_and_evaluate(config, str(tmp_path / "run"))


def test_run_job_maps_failures_to_exit_codes(capsys):
    def fail(exc):
        def job():
            raise exc

        return job

    for exc, code, text in [
        (UserError("bad thing"), 2, "error: bad thing"),
        (TrainingDiverged("3 steps in a row"), 3, "error: training diverged: 3 steps in a row"),
    ]:
        with pytest.raises(SystemExit) as e:
            cli.run_job(fail(exc))
        assert e.value.code == code
        assert capsys.readouterr().err.strip() == text
    with pytest.raises(RuntimeError):  # a bug in one process: its traceback, not a message
        cli.run_job(fail(RuntimeError("bug")))
    with pytest.raises(SystemExit) as e:
        cli.usage_error("--config and --workdir are required")
    assert e.value.code == 2
    assert (
        capsys.readouterr().err == "error: bad command line: --config and --workdir are required\n"
    )


def test_evaluate_mistakes_are_one_user_error(tiny_run, tmp_path):
    with pytest.raises(UserError, match="not a jaxspeech run directory"):
        eval_run.evaluate_workdir(str(tmp_path / "d"), None, None, None)
    with pytest.raises(UserError, match="needs a model with that head"):
        eval_run.evaluate_workdir(str(tiny_run[0]), None, None, None, method="rnnt_beam")
    with pytest.raises(UserError, match="no committed checkpoint 5 in "):
        eval_run.evaluate_workdir(str(tiny_run[0]), None, None, 5)
    with pytest.raises(UserError, match="decoding.streaming needs a streaming encoder"):
        eval_run.evaluate_workdir(str(tiny_run[0]), None, None, None, decoding={"streaming": True})
    with pytest.raises(UserError, match="chunk_size must be >= 0"):
        eval_run.evaluate_workdir(str(tiny_run[0]), None, None, None, decoding={"chunk_size": -2})
    with pytest.raises(UserError, match="no language model file"):
        lm = {"lm_path": str(tmp_path / "missing.arpa")}
        eval_run.evaluate_workdir(str(tiny_run[0]), None, None, None, "ctc_beam", decoding=lm)


def test_command_lines_exit_2_with_one_line(corpus, tmp_path):
    _, shards = corpus
    bad_key = run_module(
        "jaxspeech.train", *train_args(tmp_path / "a", shards, "--config.model.dimm=3"), check=False
    )
    assert bad_key.returncode == 2 and "Traceback" not in bad_key.stderr
    assert bad_key.stderr.startswith("error: bad command line:") and "dimm" in bad_key.stderr
    no_run = run_module("jaxspeech.evaluate", "--workdir", str(tmp_path / "d"), check=False)
    assert no_run.returncode == 2 and "Traceback" not in no_run.stderr
    assert no_run.stderr.strip().startswith("error:") and "not a jaxspeech run" in no_run.stderr
    no_flag = run_module("jaxspeech.evaluate", "--split", "test", check=False)
    assert no_flag.returncode == 2 and "Traceback" not in no_flag.stderr
    assert no_flag.stderr.startswith("error: bad command line:") and "workdir" in no_flag.stderr
