"""Tiny end-to-end run through the CLIs: synthesize, prepare, train, resume, evaluate."""

import json
import os

import jax
import numpy as np
import pytest

from jaxspeech import checkpoint as ckpt_lib
from jaxspeech import evaluate as eval_lib
from jaxspeech.data.tokenizer import Tokenizer
from jaxspeech.parallel import mesh as mesh_lib
from tests.e2e.cli import run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow


def run(*args, check=True):
    return run_module(*args, check=check)


def train(workdir, shards, *extra):
    return run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(workdir),
        f"--config.data.dir={shards}",
        *extra,
    )


def final_params(workdir):
    config = eval_lib.load_run_config(str(workdir))
    tok = Tokenizer.load(os.path.join(workdir, "assets", "tokenizer"))
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    _, abs_params, abs_vars, _, _ = eval_lib.abstract_model(config, tok.vocab_size, mesh)
    ckpt = ckpt_lib.Checkpointer(str(workdir), async_save=False)
    step = ckpt.latest_step()
    out = ckpt.restore(step, abstract_model={"params": abs_params, "model_vars": abs_vars})
    ckpt.close()
    return step, jax.tree.map(np.asarray, out["model"])


def test_train_resume_matches_uninterrupted_and_evaluates(corpus):
    root, shards = corpus
    straight, resumed = root / "straight", root / "resumed"
    out = train(straight, shards).stdout
    assert "100% 8/8" in out and "eval step 8: dev" in out

    first = train(resumed, shards, "--config.train.run_steps=4").stdout
    assert "stopping at step 4 of 8" in first
    second = train(resumed, shards).stdout
    assert "resumed from step 4" in second and "100% 8/8" in second

    step_a, a = final_params(straight)
    step_b, b = final_params(resumed)
    assert step_a == step_b == 8
    # Same topology, same data order, same per-step randomness: identical to the bit.
    jax.tree.map(np.testing.assert_array_equal, a, b)
    # The feature statistics of the corpus travel inside the checkpoint.
    stats = json.load(open(shards / "train" / "stats.json"))
    np.testing.assert_allclose(
        a["model_vars"]["frontend"]["mean"], np.array(stats["sum"]) / stats["count"], rtol=1e-5
    )

    # Rerunning a finished run trains nothing more and evaluates again (idempotent `make demo`).
    third = train(resumed, shards).stdout
    assert "training steps 8 -> 8" in third and "eval step 8" in third

    ev = run(
        "jaxspeech.evaluate", "--workdir", str(resumed), "--data", str(shards), "--split", "test"
    )
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    num_test = json.load(open(shards / "test" / "index.json"))["num_records"]
    assert result["split"] == "test" and result["num_utts"] == num_test
    assert 0.0 <= result["cer"] and 0.0 <= result["wer"]
    saved = json.load(open(resumed / "eval" / "test-step8.json"))
    assert saved["cer"] == result["cer"]
    assert any(
        name.startswith("events.out.tfevents") for name in os.listdir(resumed / "tensorboard")
    )
    # A decoder the model has no head for is one clear error, before any work.
    bad = run("jaxspeech.evaluate", "--workdir", str(resumed), "--method", "rnnt_beam", check=False)
    assert bad.returncode == 2 and "needs a model with that head" in bad.stderr


def test_transducer_head_trains_and_decodes_every_way(corpus):
    """A CTC+RNN-T model trains with the pruned loss, and every decoder scores the split."""
    root, shards = corpus
    workdir = root / "transducer"
    out = train(workdir, shards, "--config.model.head=ctc+rnnt").stdout
    assert "ctc+rnnt head" in out and "rnnt_pruned" in out and "eval step 8: dev" in out
    assert json.load(open(workdir / "eval" / "dev-step8.json"))["decoding"] == "rnnt_greedy"
    num_test = json.load(open(shards / "test" / "index.json"))["num_records"]
    for method in ("rnnt_beam", "ctc_beam", "ctc_greedy"):
        ev = run(
            "jaxspeech.evaluate",
            "--workdir",
            str(workdir),
            "--split",
            "test",
            "--method",
            method,
            "--beam",
            "2",
        )
        result = json.loads(ev.stdout.strip().splitlines()[-1])
        assert result["decoding"] == method and result["num_utts"] == num_test
        assert (workdir / "eval" / f"test-step8-{method}-beam2.json").exists()


def test_user_mistakes_give_one_clear_error(corpus, tmp_path):
    _, shards = corpus
    bad_key = run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(tmp_path / "a"),
        "--config.model.dimm=3",
        check=False,
    )
    assert (
        bad_key.returncode == 2 and "dimm" in bad_key.stderr and "Traceback" not in bad_key.stderr
    )
    missing = run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(tmp_path / "b"),
        "--config.data.dir=/nonexistent/data",
        check=False,
    )
    assert (
        missing.returncode == 2
        and "/nonexistent/data" in missing.stderr
        and "Traceback" not in missing.stderr
    )
    mesh = run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(tmp_path / "c"),
        f"--config.data.dir={shards}",
        "--config.mesh.data=3",
        check=False,
    )
    assert mesh.returncode == 2 and "mesh" in mesh.stderr and "Traceback" not in mesh.stderr
    head = run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(tmp_path / "e"),
        f"--config.data.dir={shards}",
        "--config.model.head=attention",
        check=False,
    )
    assert head.returncode == 2 and "unknown head" in head.stderr and "Traceback" not in head.stderr
    no_run = run("jaxspeech.evaluate", "--workdir", str(tmp_path / "d"), check=False)
    assert no_run.returncode == 2 and "not a jaxspeech run directory" in no_run.stderr


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--coordinator_address=127.0.0.1:1234"], "missing --num_processes, --process_id"),
        (["--config.train.grad_accum=0"], "train.grad_accum must be >= 1"),
        (["--config.data.loader_shards=-1"], "data.loader_shards=-1"),
        (["--config.mesh.replica=3"], "cannot use 1 devices"),
    ],
)
def test_distributed_settings_mistakes_give_one_clear_error(corpus, tmp_path, extra, message):
    _, shards = corpus
    proc = run(
        "jaxspeech.train",
        "--config",
        "configs/demo.py:tiny",
        "--workdir",
        str(tmp_path / "run"),
        f"--config.data.dir={shards}",
        *extra,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
