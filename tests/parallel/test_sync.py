"""Sync strategies (jaxspeech.parallel.sync) on the 8-device mesh: the update rules against
the numpy references of tests/parallel/sync_reference.py, the degenerate settings against
all-reduce, each learner's local step against the single-device step on its rows, and the
config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import demo
from jaxspeech.config import build
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules, sync
from jaxspeech.training import state as state_lib
from jaxspeech.training.step import jit_train_step, make_train_step
from tests.parallel import sync_reference as ref

VOCAB = 8
LR = 0.05


# ------------------------------------------------------------------ update rules
def _sizes(shape) -> dict:
    """(replica, data, fsdp, tensor) sizes -> the mesh's axis sizes (no pipeline stage)."""
    return dict(zip(("replica", "data", "fsdp", "tensor"), shape))


def _mesh(shape):
    return mesh_lib.make_mesh(_sizes(shape), devices=jax.devices()[: int(np.prod(shape))])


def _tree(rng, n=None, shapes=((4, 6), (8,), (3, 2, 4))):
    """A small parameter tree (or learner-stacked with a leading n)."""
    lead = () if n is None else (n,)
    return {
        "a": {"w": rng.standard_normal(lead + shapes[0]).astype(np.float32)},
        "b": rng.standard_normal(lead + shapes[1]).astype(np.float32),
        "c": rng.standard_normal(lead + shapes[2]).astype(np.float32),
    }


# Parameter specs on the mesh: "a.w" sharded over fsdp on its first dim, "c" over tensor.
SPECS = {
    "a": {"w": PartitionSpec("fsdp")},
    "b": PartitionSpec(),
    "c": PartitionSpec(None, "tensor"),
}


def _put(tree, mesh, axes=None):
    def put(x, spec):
        spec = sync.learner_spec(spec, axes) if axes is not None else spec
        return jax.device_put(x, NamedSharding(mesh, spec))

    return jax.tree.map(put, tree, SPECS, is_leaf=lambda x: isinstance(x, np.ndarray))


def _close(got, want, **kw):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), w, **kw), got, want)


def _strategy(name, shape, **kw):
    return sync.strategy_from_config({"strategy": name} | kw, _sizes(shape), rules.DEFAULT_RULES)


@pytest.mark.parametrize("nesterov", [True, False])
def test_bmuf_block_matches_reference(nesterov):
    shape = (2, 2, 2, 1)  # 4 learners (replica x data), parameters over fsdp
    mesh, rng = _mesh(shape), np.random.default_rng(0)
    learners, global_, momentum = _tree(rng, 4), _tree(rng), _tree(rng)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda *a: sync.bmuf_block(*a, 0.75, 0.9, nesterov))(
            _put(learners, mesh, sync.LEARNER_AXES), _put(global_, mesh), _put(momentum, mesh)
        )
    want = ref.bmuf_tree(learners, global_, momentum, 0.75, 0.9, nesterov)
    for g, w in zip(got, want):
        _close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (2, 2, 1, 2), (1, 8, 1, 1)])
def test_gossip_mix_matches_reference(shape, overlap):
    """Ring mixing of 2 (fully connected), 4 and 8 learners, each learner's model sharded
    over the remaining axes."""
    mesh, rng = _mesh(shape), np.random.default_rng(1)
    n = shape[0] * shape[1]
    before, after = _tree(rng, n), _tree(rng, n)
    axes = sync.LEARNER_AXES
    with jax.set_mesh(mesh):
        got = jax.jit(
            lambda b, a: sync.gossip_mix(b, a, mesh=mesh, specs=SPECS, axes=axes, overlap=overlap)
        )(_put(before, mesh, axes), _put(after, mesh, axes))
    _close(got, ref.gossip_tree(before, after, overlap), rtol=1e-5, atol=1e-6)


GTC_CASES = {
    # fixed tau, room for all that pass: no overflow
    "sign_fixed": dict(gtc_values="sign", gtc_tau=0.8, gtc_density=0.0, gtc_capacity=1.0),
    # fixed tau with 2 slots per 8-24 elements: the excess stays in the residual
    "sign_overflow": dict(gtc_values="sign", gtc_tau=0.3, gtc_density=0.0, gtc_capacity=0.1),
    # adaptive tau: the k-th largest magnitude, k = ceil(0.2 n)
    "sign_adaptive": dict(gtc_values="sign", gtc_tau=0.0, gtc_density=0.2, gtc_capacity=0.25),
    "float_overflow": dict(gtc_values="float", gtc_tau=0.5, gtc_density=0.0, gtc_capacity=0.15),
}


@pytest.mark.parametrize("case", sorted(GTC_CASES))
def test_gtc_exchange_matches_reference(case):
    """8 learners (parameters not sharded within a learner, so a device's block is the
    whole leaf, as in the reference): messages, residuals, the summed update, counts."""
    kw = GTC_CASES[case]
    shape = (1, 8, 1, 1)
    s = _strategy("gtc", shape, **kw)
    mesh, rng = _mesh(shape), np.random.default_rng(2)
    residual, grads = _tree(rng, 8), _tree(rng, 8)
    axes = s.learner_axes
    specs = jax.tree.map(
        lambda _: PartitionSpec(), SPECS, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    put = lambda t: jax.tree.map(  # noqa: E731
        lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec(axes))), t
    )
    with jax.set_mesh(mesh):
        agg, new_res, counts = jax.jit(
            lambda r, g: sync.gtc_exchange(r, g, s=s, mesh=mesh, specs=specs)
        )(put(residual), put(grads))
    want = ref.gtc_exchange_tree(
        residual, grads, kw["gtc_tau"], kw["gtc_density"], kw["gtc_capacity"], kw["gtc_values"]
    )
    _close(agg, want["aggregate"], rtol=1e-6, atol=1e-6)
    _close(new_res, want["new_residuals"], rtol=1e-6, atol=1e-6)
    assert float(counts["sent"]) == want["sent"].sum()
    assert float(counts["overflow"]) == want["overflow"].sum()
    if "overflow" in case:
        assert want["overflow"].sum() > 0


def test_gtc_exchange_on_sharded_parameters():
    """Parameters sharded over fsdp and tensor inside 2 learners: with room for every
    element that passes, per-block messages give the whole-leaf reference's result."""
    shape = (1, 2, 2, 2)
    kw = dict(gtc_values="sign", gtc_tau=0.7, gtc_density=0.0, gtc_capacity=1.0)
    s = _strategy("gtc", shape, **kw)
    mesh, rng = _mesh(shape), np.random.default_rng(3)
    residual, grads = _tree(rng, 2), _tree(rng, 2)
    with jax.set_mesh(mesh):
        agg, new_res, counts = jax.jit(
            lambda r, g: sync.gtc_exchange(r, g, s=s, mesh=mesh, specs=SPECS)
        )(_put(residual, mesh, s.learner_axes), _put(grads, mesh, s.learner_axes))
    want = ref.gtc_exchange_tree(residual, grads, 0.7, 0.0, 1.0, "sign")
    _close(agg, want["aggregate"], rtol=1e-6, atol=1e-6)
    _close(new_res, want["new_residuals"], rtol=1e-6, atol=1e-6)
    assert float(counts["sent"]) == want["sent"].sum() > 0


def test_payload_arithmetic():
    shape = (1, 4, 1, 1)
    mesh = _mesh(shape)
    params = {"w": jax.ShapeDtypeStruct((100, 10), jnp.float32)}
    shard = {"w": NamedSharding(mesh, PartitionSpec())}
    dense = ref.allreduce_sent_bytes(4000, 4)
    gtc = _strategy("gtc", shape, gtc_values="sign", gtc_density=0.001, gtc_capacity=0.002)
    got = sync.payload_bytes(gtc, params, shard, mesh)
    assert got["dense_bytes_per_step"] == dense
    assert got["bytes_per_step"] == ref.gtc_sent_bytes(1000, 0.002, "sign", 4)
    bmuf = _strategy("bmuf", shape, block_steps=10)
    assert sync.payload_bytes(bmuf, params, shard, mesh)["bytes_per_step"] == dense / 10
    gossip = _strategy("gossip", shape)
    assert sync.payload_bytes(gossip, params, shard, mesh)["bytes_per_step"] == 2 * 4000


# ------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    "kw,shape,match",
    [
        (dict(strategy="gossip"), (1, 1, 8, 1), "one learner"),
        (dict(strategy="bmuf", block_steps=0), (1, 4, 2, 1), "block_steps must be >= 1"),
        (dict(strategy="gtc", gtc_capacity=0.0), (1, 4, 2, 1), "gtc_capacity"),
        (dict(strategy="gtc", gtc_tau=0.0, gtc_density=0.0), (1, 4, 2, 1), "sign sends"),
        (dict(strategy="gtc", gtc_values="int8"), (1, 4, 2, 1), "gtc_values"),
        (dict(strategy="hierarchical"), (1, 4, 2, 1), "mesh.replica >= 2"),
        (dict(strategy="hierarchical", outer="gtc"), (2, 2, 2, 1), "sync.outer"),
        (dict(strategy="ring"), (1, 4, 2, 1), "sync.strategy must be one of"),
        (dict(strategy="bmuf", block_momentum=1.0), (1, 4, 2, 1), "block_momentum"),
        (dict(strategy="bmuf", block_gain=0.0), (1, 4, 2, 1), "block_gain"),
        (dict(strategy="bmuf", block_lr=0.0), (1, 4, 2, 1), "block_lr must be > 0"),
        (dict(strategy="bmuf", blocks=3), (1, 4, 2, 1), "unknown sync keys"),
    ],
)
def test_config_errors(kw, shape, match):
    with pytest.raises(sync.SyncConfigError, match=match):
        sync.strategy_from_config(kw, _sizes(shape), rules.DEFAULT_RULES)


def test_rules_that_shard_parameters_over_learners_are_refused():
    table = dict(rules.DEFAULT_RULES) | {"embed": "data"}
    with pytest.raises(sync.SyncConfigError, match="mesh.rules.embed"):
        sync.strategy_from_config(
            {"strategy": "bmuf"}, {"data": 4, "fsdp": 2}, tuple(table.items())
        )


def test_bmuf_default_is_plain_averaging_and_minus_one_follows_the_rule():
    s = _strategy("bmuf", (2, 2, 2, 1))  # the default: eta 0, zeta 1 (gain 1)
    assert s.num_learners == 4 and (s.block_momentum, s.block_lr) == (0.0, 1.0)
    r = _strategy("bmuf", (2, 2, 2, 1), block_momentum=-1.0)  # the reference's rule
    assert r.block_momentum == ref.bmuf_default_momentum(4)
    h = _strategy("hierarchical", (2, 2, 2, 1), outer="bmuf", block_momentum=-1.0)
    assert h.learner_axes == ("replica",) and h.num_learners == 2 and h.block_momentum == 0.5
    # zeta from the default gain of 1: (1 - eta) / (1 + eta) with Nesterov
    assert r.block_lr == pytest.approx(0.25 / 1.75)
    assert _strategy("bmuf", (2, 2, 2, 1), block_lr=2.0).block_lr == 2.0  # given: kept


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("eta,gain", [(0.75, 1.0), (0.5, 4.0), (0.0, 1.0)])
def test_bmuf_gain_is_the_steady_state_move_per_block(eta, gain, nesterov):
    """Learners that always move the same G from where they start: after many blocks the
    global model (the numpy reference's update) moves gain x G per block."""
    zeta = sync.bmuf_block_lr(eta, gain, nesterov)
    assert sync.bmuf_gain(eta, zeta, nesterov) == pytest.approx(gain)
    g = {"w": np.array([1.0, -2.0])}
    global_, momentum = {"w": np.zeros(2)}, {"w": np.zeros(2)}
    for _ in range(200):
        learners = {"w": (global_["w"] + g["w"])[None].repeat(3, 0)}
        before = global_["w"]
        global_, momentum, _ = ref.bmuf_tree(learners, global_, momentum, eta, zeta, nesterov)
    np.testing.assert_allclose(global_["w"] - before, gain * g["w"], rtol=1e-6)


# ------------------------------------------------------------------ whole steps
def _batch(b=8, s=16000, u=5):
    """Equal label lengths and weights: every learner's block has the same tokens, so the
    mean of the learners' per-token gradients is the all-reduce gradient."""
    rng = np.random.default_rng(0)
    return {
        "audio": (0.1 * rng.standard_normal((b, s))).astype(np.float32),
        "audio_len": np.full(b, s, np.int32),
        "labels": rng.integers(1, VOCAB, (b, u)).astype(np.int32),
        "label_len": np.full(b, u, np.int32),
        "weight": np.ones(b, np.float32),
        "label_overflow": np.zeros(b, np.int32),
        "corrupt": np.zeros(b, np.int32),
    }


def _config(shape, **sync_kw):
    config = demo.get_config("tiny")
    config.model.conformer.dim = 16
    config.model.conformer.num_heads = 2
    config.specaug.enabled = False  # no randomness: learners and all-reduce see the same data
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    config.sync.update(sync_kw)
    return config


def _run(shape, steps=2, batch=None, **sync_kw):
    """`steps` training steps with SGD; returns (model params, metrics, train state)."""
    config = _config(shape, **sync_kw)
    mesh = build.mesh_from_config(config, devices=jax.devices()[: int(np.prod(shape))])
    mean, std = (
        np.full(config.features.num_mel_bins, -5.0),
        np.full(config.features.num_mel_bins, 3.0),
    )
    with rules.axis_rules(build.rules_from_config(config)):
        state, setup = state_lib.init_train_state(config, VOCAB, mesh, mean, std, tx=optax.sgd(LR))
        step = jit_train_step(
            setup,
            make_train_step(
                setup.spec.graphdef,
                setup.tx,
                0,
                0,
                config.loss,
                strategy=setup.strategy,
                param_shardings=setup.spec.param_shardings,
            ),
        )
        host = batch if batch is not None else _batch()
        metrics = []
        with jax.set_mesh(mesh):
            for _ in range(steps):
                state, m = step(state, mesh_lib.host_to_global(mesh, host))
                metrics.append(jax.device_get(m))
        model = jax.tree.map(np.asarray, setup.model_params(state))
    return model, metrics, state


@pytest.fixture(scope="module")
def allreduce():
    return _run((1, 4, 2, 1))


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 4, 2, 1), dict(strategy="bmuf", block_steps=1, block_momentum=0.0, block_lr=1.0)),
        (
            (1, 4, 2, 1),
            dict(
                strategy="gtc",
                gtc_values="float",
                gtc_tau=0.0,
                gtc_density=0.0,
                gtc_capacity=1.0,
                gtc_dense_steps=0,
            ),
        ),
        ((1, 2, 4, 1), dict(strategy="gossip")),
        ((2, 1, 2, 2), dict(strategy="hierarchical", outer="gossip")),
    ],
    ids=["bmuf_block1_eta0_zeta1", "gtc_tau0_full", "gossip_2", "hierarchical_gossip_2"],
)
def test_degenerate_strategies_equal_allreduce(allreduce, shape, kw):
    want, want_metrics, _ = allreduce
    got, metrics, _ = _run(shape, **kw)
    _close(got, want, rtol=1e-4, atol=2e-6)
    for m, w in zip(metrics, want_metrics):
        np.testing.assert_allclose(m["loss"], w["loss"], rtol=1e-5)
        assert m["sync_bytes_per_step"] > 0 and m["nonfinite"] == 0
    if kw["strategy"] == "gtc":
        assert metrics[0]["sync_density"] == 1.0 and metrics[0]["sync_overflow"] == 0


def test_learners_step_on_their_own_rows():
    """bmuf without a block boundary: learner l's parameters after one step are the
    single-device SGD step on rows [2l, 2l + 2) of the batch alone."""
    batch = _batch()
    _, _, state = _run((1, 4, 2, 1), steps=1, batch=batch, strategy="bmuf", block_steps=100)
    learners = jax.tree.map(np.asarray, state.sync["learners"])
    for learner in (0, 3):
        rows = {k: v[2 * learner : 2 * learner + 2] for k, v in batch.items()}
        want, _, _ = _run((1, 1, 1, 1), steps=1, batch=rows)
        got = jax.tree.map(lambda x, i=learner: x[i], learners)
        _close(got, want, rtol=1e-4, atol=2e-6)
    # no block yet: the global model is still the initial one
    assert np.abs(state.sync["momentum"]["ctc"]["kernel"]).max() == 0
    assert int(state.step) == 1


def test_allreduce_strategy_is_the_plain_step():
    config = _config((1, 4, 2, 1))
    s = sync.strategy_from_config(config.sync, {"data": 4, "fsdp": 2})
    assert s.method == "allreduce" and not s.has_state
    fn = make_train_step(None, optax.sgd(1.0), 0, 0, config.loss, strategy=s)
    assert fn.__name__ == "train_step"


def test_bmuf_averages_every_step_for_its_warm_up_then_runs_blocks(allreduce):
    """sync.block_dense_steps=2 on BMUF with long blocks: steps 1-2 average the learners'
    models (with SGD learners: the all-reduce step, so the losses follow all-reduce's)
    and leave no block momentum; step 3 is a local step of each learner."""
    _, want_metrics, _ = allreduce
    kw = dict(strategy="bmuf", block_steps=100, block_momentum=0.5, block_dense_steps=2)
    _, metrics, state = _run((1, 4, 2, 1), steps=3, **kw)
    for m, w in zip(metrics[:2], want_metrics):
        np.testing.assert_allclose(m["loss"], w["loss"], rtol=1e-5)
    assert metrics[0]["sync_bytes_per_step"] == 100 * metrics[2]["sync_bytes_per_step"]
    momentum = jax.tree.leaves(jax.tree.map(np.asarray, state.sync["momentum"]))
    assert max(float(np.abs(m).max()) for m in momentum) == 0
    learners = jax.tree.map(np.asarray, state.sync["learners"])
    kernel = learners["ctc"]["kernel"]  # (learners, ...): apart after a local step
    assert np.abs(kernel[0] - kernel[1]).max() > 0
    _, metrics2, state2 = _run((1, 4, 2, 1), steps=2, **kw)
    for learner in jax.tree.leaves(jax.tree.map(np.asarray, state2.sync["learners"])):
        np.testing.assert_array_equal(learner, np.broadcast_to(learner[0], learner.shape))


def test_gtc_exchanges_dense_updates_for_its_warm_up_then_compresses(allreduce):
    """sync.gtc_dense_steps=2 on a lossy GTC (1-bit, 20% density): steps 1-2 exchange every
    learner's whole update (with SGD learners: the all-reduce step, so the losses follow
    all-reduce's), step 3 compresses and leaves a residual."""
    _, want_metrics, _ = allreduce
    lossy = dict(strategy="gtc", gtc_values="sign", gtc_density=0.2, gtc_capacity=0.25)
    _, metrics, state = _run((1, 4, 2, 1), steps=3, gtc_dense_steps=2, **lossy)
    for m, w in zip(metrics[:2], want_metrics):
        np.testing.assert_allclose(m["loss"], w["loss"], rtol=1e-5)
    assert [m["sync_density"] for m in metrics[:2]] == [1.0, 1.0]
    assert 0 < metrics[2]["sync_density"] <= 0.25
    assert metrics[0]["sync_bytes_per_step"] > metrics[2]["sync_bytes_per_step"]  # all-reduce
    residual = jax.tree.leaves(jax.tree.map(np.asarray, state.sync["residual"]))
    assert max(float(np.abs(r).max()) for r in residual) > 0
