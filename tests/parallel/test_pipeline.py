"""Pipeline parallelism (jaxspeech.parallel.pipeline) on the 8-device CPU mesh: the
schedules against the layers applied in order (outputs and gradients), the pipelined
Conformer train step against the unpipelined one (loss, gradient, GPipe and circular,
several microbatch counts, data/FSDP/tensor sharding inside the stages, inside gradient
accumulation), the config's mistakes as one line each, and a checkpoint saved on 4 stages
restored bitwise on 1 and 2."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import demo
from jaxspeech.config import build, validate
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import pipeline, rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.training import optim
from jaxspeech.training import state as state_lib
from tests import test_checkpoint as checkpoint_tests
from tests.parallel import test_equivalence as equivalence

L, B, D = 8, 16, 6


def _layer(w, x, m):
    return jnp.tanh(x @ w) * m[:, None] + x


def _apply_group(p, x, mask, group, microbatch):
    return jax.lax.scan(lambda x, w: (_layer(w, x, mask), None), x, p)[0]


@pytest.mark.parametrize(
    "stages,microbatches,repeats", [(2, 4, 1), (4, 2, 1), (8, 1, 1), (2, 4, 2), (4, 4, 2)]
)
def test_each_schedule_equals_the_layers_in_order(stages, microbatches, repeats):
    w = jax.random.normal(jax.random.key(0), (L, D, D)) / np.sqrt(D)
    x = jax.random.normal(jax.random.key(1), (B, D))
    mask = (jnp.arange(B) % 3 != 0).astype(jnp.float32)  # travels with the microbatches

    def plain(w, x):
        for i in range(L):
            x = _layer(w[i], x, mask)
        return x

    schedule = pipeline.Schedule(stages, microbatches, repeats)
    mesh = mesh_lib.make_mesh({"stage": stages, "data": 8 // stages})
    with jax.set_mesh(mesh):
        piped = jax.jit(lambda w, x: pipeline.run(_apply_group, w, x, mask, schedule))
        grad = jax.jit(jax.grad(lambda w, x: jnp.sum(piped(w, x) ** 2)))
        y, g = piped(w, x), grad(w, x)
    np.testing.assert_allclose(y, plain(w, x), atol=1e-5)
    want = jax.grad(lambda w: jnp.sum(plain(w, x) ** 2))(w)
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)
    assert schedule.bubble == pytest.approx((stages - 1) / (microbatches * repeats + stages - 1))


def _pipelined_step(mesh_sizes: dict, schedule="gpipe", microbatches=2, rows=16, accum=1):
    """One plain (identity-optimizer) train step of a 4-layer scanned Conformer-CTC on
    `mesh_sizes`: (loss, grad norm, gradient, parameters, the schedules the step traced)."""
    config = demo.get_config("tiny")
    config.model.conformer.update(dim=16, num_heads=2, num_layers=4, scan_layers=True)
    config.specaug.enabled = False
    config.pipeline.update(microbatches=microbatches, schedule=schedule, repeats=2)
    for axis in rules.MESH_AXES:
        config.mesh[axis] = mesh_sizes.get(axis, 1)
    n = int(np.prod(list(mesh_sizes.values())))
    assert validate.mistakes(config, devices=n) == []
    mesh = build.mesh_from_config(config, devices=jax.devices()[:n])
    mean, std = np.full(80, -5.0), np.full(80, 3.0)
    batch = equivalence._batch(b=rows)
    orig, run = equivalence._batch, pipeline.run
    traced = []

    def recording_run(apply_group, params, x, extras, schedule):
        traced.append(schedule)
        return run(apply_group, params, x, extras, schedule)

    equivalence._batch = lambda: batch  # the same rows on every mesh
    pipeline.run = recording_run
    try:
        with rules.axis_rules(build.rules_from_config(config)):
            loss, norm, grads, params = equivalence._step_on(
                config, mesh, mean, std, optax.identity(), accum, False
            )
    finally:
        equivalence._batch, pipeline.run = orig, run
    return loss, norm, grads, params, traced


@pytest.fixture(scope="module")
def unpipelined():
    return _pipelined_step({"data": 1})


@pytest.mark.parametrize(
    "sizes,schedule,microbatches,accum",
    [
        ({"stage": 2, "data": 4}, "gpipe", 2, 1),
        ({"stage": 2, "data": 2, "fsdp": 2}, "gpipe", 4, 1),
        ({"stage": 4, "data": 1, "tensor": 2}, "gpipe", 1, 1),
        ({"stage": 2, "data": 2, "tensor": 2}, "circular", 2, 1),
        ({"stage": 2, "data": 4}, "circular", 4, 1),
        ({"stage": 2, "data": 4}, "gpipe", 2, 2),  # inside gradient accumulation
    ],
)
def test_a_pipelined_step_equals_the_unpipelined_step(
    unpipelined, sizes, schedule, microbatches, accum
):
    loss1, norm1, grads1, _, none = unpipelined
    loss, norm, grads, params, traced = _pipelined_step(sizes, schedule, microbatches, accum=accum)
    assert none == []  # one device: the plain scan
    repeats = 2 if schedule == "circular" else 1
    assert set(traced) == {pipeline.Schedule(sizes["stage"], microbatches, repeats)}
    np.testing.assert_allclose(loss, loss1, rtol=1e-5)
    np.testing.assert_allclose(norm, norm1, rtol=1e-4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4), grads, grads1)
    # The stacked layers really are split over the stages.
    ff = params["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert ff.sharding.spec[0] == "stage"


def _tiny(**settings):
    config = demo.get_config("tiny")
    config.model.conformer.update(num_layers=4, scan_layers=True)
    config.mesh.data, config.mesh.stage = 4, 2
    for key, value in settings.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


@pytest.mark.parametrize(
    "settings,line",
    [
        ({"model.encoder": "lstm"}, "pipelines the Conformer's scanned layer stack"),
        ({"pipeline.microbatches": 0}, "pipeline.microbatches must be >= 1"),
        ({"pipeline.schedule": "zigzag"}, "pipeline.schedule: unknown schedule 'zigzag'"),
        (
            {"pipeline.schedule": "circular", "pipeline.microbatches": 1},
            "needs pipeline.microbatches >= mesh.stage=2",
        ),
        (
            {"pipeline.schedule": "circular", "pipeline.repeats": 4},
            "does not split into 2 stages x 4 groups",
        ),
        ({"sync.strategy": "bmuf"}, "runs with sync.strategy=allreduce only"),
    ],
)
def test_pipeline_config_mistakes_are_one_line(settings, line):
    assert validate.mistakes(_tiny(), devices=8) == []
    found = validate.mistakes(_tiny(**settings), devices=8)
    assert len(found) == 1 and line in found[0], found


def test_layers_that_do_not_split_into_the_stages_are_one_line():
    config = _tiny()
    config.model.conformer.num_layers = 3
    found = validate.mistakes(config, devices=8)
    assert found == [
        "model.conformer.num_layers=3 does not split into 2 stages: it must be a multiple of 2"
    ]


def _scanned_config():
    config = demo.get_config("tiny")
    config.model.conformer.update(dim=16, num_heads=2, num_layers=4, scan_layers=True)
    return config


@pytest.fixture(scope="module")
def saved_on_4_stages(tmp_path_factory):
    """The scanned tiny model with Adam moments, on a (stage 4, data 2) mesh, saved at step
    5. Returns the run dir and host copies of what was saved."""
    config = _scanned_config()
    mesh = mesh_lib.make_mesh({"stage": 4, "data": 2})
    spec = build.abstract_model(config, checkpoint_tests.VOCAB, mesh)
    rng = np.random.default_rng(3)
    fill = lambda x: (  # noqa: E731 (any bits: no compilation)
        rng.standard_normal(x.shape).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating)
        else np.full(x.shape, 2, x.dtype)
    )
    params = jax.device_put(jax.tree.map(fill, spec.params), spec.param_shardings)
    kernel = params["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert kernel.sharding.spec[0] == "stage" and kernel.shape[0] == 4  # a layer per stage
    tx = optim.make_optimizer(config.optim, 10)[0]
    opt_state, o_shard = state_lib.init_opt_state(tx, params, mesh, spec.param_shardings)
    opt_state = jax.device_put(jax.tree.map(fill, opt_state), o_shard)
    model_vars = jax.device_put(
        build.feature_stats(rng.standard_normal(80), rng.standard_normal(80)), spec.var_shardings
    )
    run = str(tmp_path_factory.mktemp("run"))
    ckpt = ckpt_lib.Checkpointer(run)
    replicated = NamedSharding(mesh, PartitionSpec())
    ckpt.save(
        5,
        model={"params": params, "model_vars": model_vars},
        train={
            "opt_state": opt_state,
            "step": jax.device_put(np.int32(5), replicated),
            "rng": jax.device_put(np.array([1, 2], np.uint32), replicated),
        },
        data_iter=checkpoint_tests._iterator(),
        meta={"reason": "test"},
    )
    ckpt.close()
    host = checkpoint_tests._host
    return {"run": run, "config": config, "tx": tx, "params": host(params), "opt": host(opt_state)}


@pytest.mark.parametrize("sizes,n", [({"data": 1}, 1), ({"stage": 2, "data": 4}, 8)])
def test_a_run_saved_on_4_stages_restores_bitwise_on_1_and_2(saved_on_4_stages, sizes, n):
    saved = saved_on_4_stages
    mesh = mesh_lib.make_mesh(sizes, devices=jax.devices()[:n])
    abs_model, abs_train = checkpoint_tests._targets(saved, mesh)
    ckpt = ckpt_lib.Checkpointer(saved["run"], read_only=True)
    step, out = ckpt.restore_latest(
        warn=lambda step, msg: pytest.fail(msg),
        abstract_model=abs_model,
        abstract_train=abs_train,
        data_iter=checkpoint_tests._iterator(),
    )
    ckpt.close()
    assert step == 5
    checkpoint_tests._assert_bitwise(out["model"]["params"], saved["params"])
    checkpoint_tests._assert_bitwise(out["train"]["opt_state"], saved["opt"])
    kernel = out["model"]["params"]["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    stages = sizes.get("stage", 1)
    assert len({str(s.index[0]) for s in kernel.addressable_shards}) == stages
