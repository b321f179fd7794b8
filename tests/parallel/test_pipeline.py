"""Pipeline parallelism (jaxspeech.parallel.pipeline) on the 8-device CPU mesh: the
schedules against the layers applied in order (outputs and gradients), the pipelined
Conformer train step against the unpipelined one (loss, gradient, GPipe and circular,
several microbatch counts, data/FSDP/tensor sharding inside the stages, inside gradient
accumulation), the config's mistakes as one line each, and a checkpoint saved on 4 stages
restored bitwise on 1 and 2."""

import jax
import jax.extend.core
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


def _pipelined_step(
    mesh_sizes: dict, schedule="gpipe", microbatches=2, rows=16, accum=1, head="ctc"
):
    """One plain (identity-optimizer) train step of a 4-layer scanned Conformer-CTC (with
    `head` ctc+aed: and a 2-layer scanned attention decoder, without dropout) on
    `mesh_sizes`: (loss, grad norm, gradient, parameters, the schedules the step traced)."""
    config = demo.get_config("tiny")
    config.model.conformer.update(dim=16, num_heads=2, num_layers=4, scan_layers=True)
    config.model.head = head
    config.model.decoder.update(dim=16, num_heads=2, num_layers=2, scan_layers=True, dropout=0.0)
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


def test_the_attention_decoder_is_pipelined_too():
    """ctc+aed on 2 stages x 4 data: the encoder's and the decoder's layer stacks are each
    pipelined (two traced schedules), the decoder's encodings and masks travelling with its
    microbatches; loss and gradients equal one device's."""
    loss1, norm1, grads1, _, none = _pipelined_step({"data": 1}, head="ctc+aed")
    loss, norm, grads, params, traced = _pipelined_step(
        {"stage": 2, "data": 4}, microbatches=2, head="ctc+aed"
    )
    assert none == [] and traced == [pipeline.Schedule(2, 2, 1)] * 2
    np.testing.assert_allclose(loss, loss1, rtol=1e-5)
    np.testing.assert_allclose(norm, norm1, rtol=1e-4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4), grads, grads1)
    assert params["decoder"]["blocks"]["ff"]["up"]["kernel"].sharding.spec[0] == "stage"


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


@pytest.mark.parametrize(
    "decoder,line",
    [
        (
            {"scan_layers": False, "num_layers": 2},
            "mesh.stage=2 pipelines the attention decoder's layer stack too: set "
            "model.decoder.scan_layers=True",
        ),
        (
            {"scan_layers": True, "num_layers": 3},
            "model.decoder.num_layers=3 does not split into 2 stages: it must be a multiple of 2",
        ),
    ],
)
def test_a_decoder_that_cannot_be_pipelined_is_one_line(decoder, line):
    config = _tiny()
    config.model.head = "ctc+aed"
    config.model.decoder.update(**decoder)
    assert validate.mistakes(config, devices=8) == [line]


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


def _loop_all_gather_bytes(once: bool) -> float:
    """Bytes all-gathered per step inside loops (ops run more than once) by the compiled
    train step of a 4-layer Conformer on 2 stages x FSDP 4, circular schedule."""
    from benchmarks import pipeline as bench
    from benchmarks.lib import hlo

    config = bench.make_config("tiny", True, ("t", 2, 4, "circular", 4, 2, once))
    text = bench.compile_layout(config, (16, 1.0, 32))["hlo"]
    ops = hlo.parse_collectives(text)
    return sum(
        o["bytes"] * o["executions"]
        for o in ops
        if o["kind"] == "all-gather" and o["executions"] > 1
    )


def test_fsdp_weights_are_gathered_once_per_step_not_per_iteration():
    """pipeline.gather_weights_once: the stage's FSDP-sharded weights are all-gathered
    before the loop; left to XLA, the gathers sit in the loop body and run at every one of
    its M R + S - 1 iterations (forward and backward). What still crosses devices inside
    the loop with them gathered once is the microbatch's activations (a few KiB here)."""
    once, every = _loop_all_gather_bytes(True), _loop_all_gather_bytes(False)
    assert every > 0
    assert once < 0.1 * every, (once, every)


@pytest.mark.parametrize("stages,microbatches,repeats", [(2, 4, 1), (2, 4, 2)])
def test_the_backward_pass_keeps_the_weights_once_not_per_iteration(stages, microbatches, repeats):
    """The forward loop saves each slot's input for the backward pass; the stage's weights
    are loop-invariant and must be saved once, not sliced and stacked per iteration (with
    weights gathered once, a per-iteration copy cost Conformer-XL 7 GiB on 2 stages). So no
    loop of the differentiated program outputs more than the weights' size."""
    w = jax.random.normal(jax.random.key(0), (L, D, D))
    x = jax.random.normal(jax.random.key(1), (B, D))
    mask = jnp.ones(B)
    schedule = pipeline.Schedule(stages, microbatches, repeats)
    mesh = mesh_lib.make_mesh({"stage": stages, "data": 8 // stages})
    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(
            jax.grad(lambda w: jnp.sum(pipeline.run(_apply_group, w, x, mask, schedule) ** 2))
        )(w)

    def scans(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                yield eqn
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from scans(sub)

    loops = list(scans(jaxpr.jaxpr))
    assert len(loops) >= 2  # the schedule's forward loop and its transpose
    group = (L // (stages * repeats), D, D)  # one layer group's weights
    for eqn in loops:
        weights = [v.aval for v in eqn.outvars if v.aval.shape[-3:] == group]
        # Only the gradient's accumulators (R, S, L / G, D, D): all layers' size, once.
        assert all(a.size <= w.size for a in weights), (schedule, [a.shape for a in weights])
