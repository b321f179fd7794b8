"""A real 2-process `jax.distributed` run on 127.0.0.1 (4 CPU devices each) against the
same training in one process with 8 devices: the same loss trajectory and parameters.
The mesh puts each process's devices on its own pipeline stage (mesh.stage=2, the
outermost axis after replica) with FSDP and tensor parallelism inside the stages, so
the activations cross processes between the stages (tests/parallel/test_pipeline.py
checks the pipelined step against the unpipelined one on one process). Resuming a
2-process checkpoint (both processes' data iterators, a sync strategy's state) is
tests/e2e/test_faults.py's SIGTERM test; the run here saves at its end.

The 2-process run's directory is on an S3 server (tests/e2e/conftest.py `store`): each
process writes its checkpoint shards there through Orbax and works in its own local copy
of the run's other files (runs/remote.py), as on hosts without a shared file system; the
single-process run's is local. Local multi-host run directories are tested by
tests/e2e/test_faults.py."""

import json
import os

import jax
import numpy as np
import pytest

from jaxspeech.common import storage
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import loading, remote
from tests.e2e.cli import cpu_env, run_module, tiny_train_args

pytestmark = pytest.mark.slow

STEPS = 6


def _train_args(workdir, shards, *extra):
    return tiny_train_args(
        workdir,
        shards,
        f"--config.train.num_steps={STEPS}",
        # Saved at its end only: each save of an 8-device run blocks for seconds.
        "--config.train.checkpoint_every=0",
        # Two loader shards either way: the 1-process run reads both, each of the two
        # processes one, and the global batches are the same.
        "--config.data.loader_shards=2",
        "--config.mesh.stage=2",
        "--config.mesh.data=1",
        "--config.mesh.fsdp=-1",
        "--config.mesh.tensor=2",
        "--config.model.conformer.scan_layers=True",  # the pipeline splits a scanned stack
        "--config.pipeline.microbatches=2",
        # One batch shape (utterances up to 3 s): each shape is a compilation in every
        # process, and process 1 cannot load process 0's from the persistent cache.
        "--config.data.bucket_boundaries=(3.0,)",
        *extra,
    )


def _losses(workdir) -> dict[int, float]:
    local = remote.read_copy(str(workdir))  # a run on the store: a pulled copy
    rows = [json.loads(line) for line in open(os.path.join(local, "metrics.jsonl"))]
    return {r["step"]: r["train/loss"] for r in rows}


def _params(workdir):
    mesh = mesh_lib.make_mesh({"data": 1}, devices=jax.devices()[:1])
    return jax.tree.map(np.asarray, loading.load_run(str(workdir), mesh=mesh).params)


def test_two_processes_match_one_process(corpus, store, tmp_path):
    _, shards = corpus
    single, multi = tmp_path / "single", storage.join(store[0], "runs", "multi")
    one = run_module("jaxspeech.train", *_train_args(single, shards), env=cpu_env(8))
    assert "8 x cpu, 1 process(es)" in one.stdout

    launch = ["jaxspeech.launch_local", "--num_processes=2", "--devices_per_process=4", "--"]
    two = run_module(*launch, *_train_args(multi, shards), env=cpu_env() | store[1])
    assert "[p0] devices: 8 x cpu, 2 process(es)" in two.stdout
    assert "[p1] jax.distributed: process 1 of 2" in two.stdout
    assert "[p0] " in two.stdout and "100% 6/6" in two.stdout

    want, got = _losses(single), _losses(multi)
    assert sorted(want) == sorted(got) == list(range(1, STEPS + 1))
    # Same global batches and the same arithmetic up to the order of cross-process sums.
    np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=1e-5)
    # Adam divides each gradient by its running RMS, so where a gradient is ~0 a 1e-7
    # difference in summation order moves that weight by up to ~lr per step. A real
    # mismatch (a wrong batch, a missing all-reduce) moves weights by ~lr everywhere; so:
    # every weight within half the peak learning rate (2e-3), and all but a rare few
    # (< 1%) within a tenth of it.
    a, b = _params(multi), _params(single)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-3), a, b)
    far = sum(
        int(np.sum(np.abs(x - y) > 2e-4)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )
    assert far < 0.01 * sum(x.size for x in jax.tree.leaves(a)), far
    # Both processes' shards and the commit are on the store; no lease is left.
    names = storage.list_files(multi)
    assert f"checkpoints/{STEPS}/commit_success.txt" in names and "lease.json" not in names
    shards_written = {n.split("/")[3] for n in names if "/ocdbt.process_" in n}
    assert shards_written == {"ocdbt.process_0", "ocdbt.process_1"}, shards_written
