"""jaxspeech.runs.checkpoint: the sharding-free content fingerprint (against a numpy
re-implementation), shape checks against Orbax metadata, bitwise restores onto other
meshes, corrupt-checkpoint fallback, retention, the save schedule, `load_model`,
`Preemption`; and the train step's skip of non-finite steps."""

import hashlib
import json
import os
import shutil
import signal
import time

import grain
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from configs import demo
from jaxspeech.config import build
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.training import optim
from jaxspeech.training import state as state_lib
from jaxspeech.training.state import TrainState, init_opt_state
from jaxspeech.training.step import make_train_step

VOCAB = 30


# ---------------------------------------------------------------- helpers
def _np_fmix32(h: np.ndarray) -> np.ndarray:
    h = h.astype(np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _np_leaf_fingerprint(x: np.ndarray) -> np.ndarray:
    """numpy reference of `_leaf_fingerprint`: uint32 arithmetic wraps like the device's."""
    x = np.ascontiguousarray(x)
    view = {4: np.uint32, 2: np.uint16, 1: np.uint8}[x.dtype.itemsize]
    bits = x.view(view).reshape(-1).astype(np.uint32)
    pos = np.arange(bits.size, dtype=np.uint32)
    lanes = []
    for seed in (0x9E3779B9, 0x7F4A7C15):
        mixed = _np_fmix32(bits ^ _np_fmix32(pos * np.uint32(2) + np.uint32(seed)))
        lanes.append(np.sum(mixed, dtype=np.uint32))
    return np.array(lanes, np.uint32)


def _np_fingerprint(tree: dict) -> str:
    """numpy reference of `fingerprint` for a flat dict of numpy arrays."""
    h = hashlib.sha256()
    for k in sorted(tree):
        x = tree[k]
        h.update(f"[{k!r}]:{x.shape}:{jnp.dtype(x.dtype)}:".encode())
        h.update(_np_leaf_fingerprint(x).tobytes())
    return h.hexdigest()[:32]


def _iterator(advance: int = 0):
    it = iter(grain.MapDataset.range(10).to_iter_dataset())
    for _ in range(advance):
        next(it)
    return it


def _host(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def _assert_bitwise(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want
    )


def _flat_shapes(tree: dict, prefix: str = "") -> dict[str, tuple]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat_shapes(v, f"{prefix}{k}/"))
        else:
            out[prefix + str(k)] = tuple(v.shape)
    return out


def _small(value: float) -> dict:
    """A small model item for the tests that do not need the real model."""
    return {
        "params": {"w": jnp.full((4, 3), value, jnp.float32), "b": jnp.arange(3.0) + value},
        "model_vars": {"mean": jnp.zeros(2)},
    }


def _small_abstract():
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _small(0.0))


def _save_small(ckpt, step, value, metrics=None):
    ckpt.save(
        step,
        model=_small(value),
        train={"step": jnp.int32(step)},
        data_iter=_iterator(step % 10),
        metrics=metrics,
    )


def _tiny_config(dim: int = 32):
    config = demo.get_config("tiny")
    config.model.conformer.dim = dim
    return config


def _mesh(sizes: dict, n: int):
    return mesh_lib.make_mesh(sizes, devices=jax.devices()[:n])


# ---------------------------------------------------------------- fingerprint
@pytest.mark.parametrize("dtype", [np.float32, np.int32, ml_dtypes.bfloat16, np.uint8])
def test_leaf_fingerprint_equals_numpy_reference(dtype):
    rng = np.random.default_rng(0)
    x = (100 * rng.standard_normal((37, 5))).astype(dtype)
    got = np.asarray(ckpt_lib._leaf_fingerprint(jnp.asarray(x)))
    np.testing.assert_array_equal(got, _np_leaf_fingerprint(x))
    assert got.dtype == np.uint32 and got[0] != got[1]


def test_fingerprint_independent_of_sharding_and_sensitive_to_bits_and_names():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.standard_normal((5,)).astype(np.float32)
    want = _np_fingerprint({"w": x, "y": y})
    mesh8 = _mesh({"data": 8}, 8)
    mesh42 = jax.make_mesh((4, 2), ("a", "b"), devices=jax.devices())
    layouts = [
        jax.device_put(x, jax.devices()[0]),
        jax.device_put(x, NamedSharding(mesh8, PartitionSpec("data"))),
        jax.device_put(x, NamedSharding(mesh42, PartitionSpec("a", "b"))),
    ]
    assert len(layouts[2].addressable_shards) == 8
    assert layouts[2].addressable_shards[0].data.shape == (4, 4)
    for arr in layouts:
        assert ckpt_lib.fingerprint({"w": arr, "y": jnp.asarray(y)}) == want

    def fp(w, name="w"):
        return ckpt_lib.fingerprint({name: jnp.asarray(w), "y": jnp.asarray(y)})

    flipped = x.copy()
    flipped.view(np.uint32)[3, 5] ^= 1
    swapped = x.copy()
    swapped[[2, 7]] = swapped[[7, 2]]
    others = {fp(flipped), fp(swapped), fp(x, name="v"), fp(x.reshape(8, 16))}
    assert want not in others and len(others) == 4

    bf = rng.standard_normal((6, 3)).astype(ml_dtypes.bfloat16)
    ints = rng.integers(-1000, 1000, (7,)).astype(np.int32)
    mixed = ckpt_lib.fingerprint({"b": jnp.asarray(bf), "i": jnp.asarray(ints)})
    assert mixed == _np_fingerprint({"b": bf, "i": ints})
    bf2 = bf.copy()
    bf2.view(np.uint16)[0, 0] ^= 1
    assert ckpt_lib.fingerprint({"b": jnp.asarray(bf2), "i": jnp.asarray(ints)}) != mixed


# ---------------------------------------------------------------- shape_mismatches
def test_shape_mismatches_against_orbax_metadata(tmp_path):
    params = {
        "enc": {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)},
        "out": {"kernel": jnp.ones((3, 5))},
    }
    tx = optax.adamw(1e-3)
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(
        1,
        model={"params": params, "model_vars": {}},
        train={"opt_state": tx.init(params)},
        data_iter=_iterator(),
    )
    stored = ckpt.manager.item_metadata(1)["train"].tree["opt_state"]
    ckpt.close()
    assert ckpt_lib.shape_mismatches(jax.eval_shape(tx.init, params), stored) == []

    reshaped = dict(params, enc={"w": jnp.ones((4, 4)), "b": jnp.zeros(3)})
    assert ckpt_lib.shape_mismatches(jax.eval_shape(tx.init, reshaped), stored) == [
        f"0/{m}/enc/w: checkpoint float32[4, 3], this run float32[4, 4]" for m in ("mu", "nu")
    ]
    extra = dict(params, extra=jnp.zeros(2, jnp.int32))
    assert ckpt_lib.shape_mismatches(jax.eval_shape(tx.init, extra), stored) == [
        f"0/{m}/extra: not in the checkpoint" for m in ("mu", "nu")
    ]
    missing = {"enc": params["enc"]}
    assert ckpt_lib.shape_mismatches(jax.eval_shape(tx.init, missing), stored) == [
        f"0/{m}/out/kernel: only in the checkpoint" for m in ("mu", "nu")
    ]


# ---------------------------------------------------------------- a saved tiny model
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """The tiny model with Adam moments made non-zero, on an 8-way FSDP mesh, saved at
    step 5 with an iterator that has yielded 0, 1, 2. Returns the run dir, the config
    and host copies of what was saved."""
    config = _tiny_config()
    mesh = _mesh({"data": 1, "fsdp": 8}, 8)
    spec = build.abstract_model(config, VOCAB, mesh)
    abs_params, p_shard, v_shard = spec.params, spec.param_shardings, spec.var_shardings
    # Random values, not the model's init (no compilation): what is saved is any bits.
    rng = np.random.default_rng(3)
    fill = lambda x: (
        rng.standard_normal(x.shape).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating)
        else np.full(x.shape, 2, x.dtype)  # Adam's step counts
    )
    params = jax.device_put(jax.tree.map(fill, abs_params), p_shard)
    mel = config.features.num_mel_bins
    model_vars = jax.device_put(
        build.feature_stats(
            fill(jax.ShapeDtypeStruct((mel,), jnp.float32)),
            fill(jax.ShapeDtypeStruct((mel,), jnp.float32)),
        ),
        v_shard,
    )
    tx = optim.make_optimizer(config.optim, 10)[0]
    opt_state, o_shard = init_opt_state(tx, params, mesh, p_shard)
    opt_state = jax.device_put(jax.tree.map(fill, opt_state), o_shard)
    adam = opt_state[1][0]
    assert int(adam.count) == 2 and float(jnp.abs(adam.nu["ctc"]["kernel"]).min()) > 0
    kernel = opt_state[1][0].mu["encoder"]["blocks"]["ff1"]["up"]["kernel"]
    assert len({str(s.index) for s in kernel.addressable_shards}) == 8  # FSDP-sharded moments

    replicated = NamedSharding(mesh, PartitionSpec())
    rng_key = np.array([11, 22], np.uint32)
    run = str(tmp_path_factory.mktemp("run"))
    ckpt = ckpt_lib.Checkpointer(run)
    ckpt.save(
        5,
        model={"params": params, "model_vars": model_vars},
        train={
            "opt_state": opt_state,
            "step": jax.device_put(np.int32(5), replicated),
            "rng": jax.device_put(rng_key, replicated),
        },
        data_iter=_iterator(advance=3),
        meta={"reason": "test"},
    )
    ckpt.close()
    return {
        "run": run,
        "config": config,
        "tx": tx,
        "params": _host(params),
        "model_vars": _host(model_vars),
        "opt_state": _host(opt_state),
        "rng": rng_key,
    }


def _targets(saved, mesh, config=None):
    config = config or saved["config"]
    spec = build.abstract_model(config, VOCAB, mesh)
    abs_params, abs_vars, p_shard = spec.params, spec.model_vars, spec.param_shardings
    replicated = NamedSharding(mesh, PartitionSpec())
    tx = saved["tx"]
    o_shard = state_lib.opt_shardings(tx, abs_params, mesh, p_shard)
    abs_opt = rules.abstract_like(jax.eval_shape(tx.init, abs_params), o_shard)
    return (
        {"params": abs_params, "model_vars": abs_vars},
        {
            "opt_state": abs_opt,
            "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
            "rng": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated),
        },
    )


def _copy_run(saved, tmp_path) -> str:
    run = str(tmp_path / "run")
    shutil.copytree(saved["run"], run)
    return run


@pytest.mark.parametrize(
    "sizes,n",
    [({"data": 4, "fsdp": 2}, 8), ({"data": 2, "fsdp": 2, "tensor": 2}, 8), ({"data": 1}, 1)],
)
def test_restore_on_another_mesh_is_bitwise(saved_run, sizes, n):
    mesh = _mesh(sizes, n)
    abs_model, abs_train = _targets(saved_run, mesh)
    ckpt = ckpt_lib.Checkpointer(saved_run["run"], read_only=True)
    it = _iterator()
    meta = ckpt.meta(5)
    step, out = ckpt.restore_latest(
        warn=lambda step, msg: pytest.fail(msg),
        abstract_model=abs_model,
        abstract_train=abs_train,
        data_iter=it,
    )
    ckpt.close()
    assert step == 5 and meta["step"] == 5 and meta["reason"] == "test"
    model, train = out["model"], out["train"]
    _assert_bitwise(model["params"], saved_run["params"])
    _assert_bitwise(model["model_vars"], saved_run["model_vars"])
    _assert_bitwise(train["opt_state"], saved_run["opt_state"])
    assert int(train["step"]) == 5
    np.testing.assert_array_equal(np.asarray(train["rng"]), saved_run["rng"])
    assert next(it) == 3  # the iterator continues after the 3 elements it had yielded

    def same_sharding(x, target):
        assert x.sharding == target.sharding, (x.sharding, target.sharding)

    jax.tree.map(same_sharding, model, abs_model)
    jax.tree.map(same_sharding, train, abs_train)
    if sizes.get("tensor") == 2:  # really sharded differently from the FSDP-8 save
        kernel = model["params"]["encoder"]["blocks"]["ff1"]["up"]["kernel"]
        assert tuple(kernel.sharding.spec)[1:] == ("fsdp", "tensor")
    assert meta["params_fingerprint"] == ckpt_lib.fingerprint(model["params"])


def test_incompatible_model_raises_and_quarantines_nothing(saved_run, tmp_path):
    run = _copy_run(saved_run, tmp_path)
    config = _tiny_config(dim=48)
    mesh = _mesh({"data": 1}, 1)
    abs_model, _ = _targets(saved_run, mesh, config)
    want, have = _flat_shapes(abs_model["params"]), _flat_shapes(saved_run["params"])
    assert want.keys() == have.keys()
    differ = sorted(k for k in want if want[k] != have[k])
    assert len(differ) > 5
    first = differ[0]
    ckpt = ckpt_lib.Checkpointer(run)
    with pytest.raises(ckpt_lib.CheckpointError) as e:
        ckpt.restore_latest(warn=lambda step, msg: pytest.fail(msg), abstract_model=abs_model)
    message = str(e.value)
    assert "checkpoint 5" in message and "different model" in message
    old_shape, new_shape = list(have[first]), list(want[first])
    assert 32 in old_shape and 48 in new_shape
    assert (
        f"model/params/{first}: checkpoint float32{old_shape}, this run float32{new_shape}"
        in message
    )
    assert ckpt.all_steps() == [5]
    ckpt.close()
    assert not os.path.exists(os.path.join(run, ckpt_lib.CORRUPT_DIR))


def test_load_model_paths_and_read_only(saved_run, tmp_path):
    run = _copy_run(saved_run, tmp_path)
    abs_model, _ = _targets(saved_run, _mesh({"data": 1}, 1))
    for path in (run, os.path.join(run, "checkpoints", "5")):
        step, model = ckpt_lib.load_model(path, abs_model)
        assert step == 5
        _assert_bitwise(model["params"], saved_run["params"])
        _assert_bitwise(model["model_vars"], saved_run["model_vars"])
    with pytest.raises(ckpt_lib.CheckpointError, match="is neither a run directory"):
        ckpt_lib.load_model(str(tmp_path / "nowhere"), abs_model)
    with pytest.raises(ckpt_lib.CheckpointError, match="no committed checkpoint 9 in"):
        ckpt_lib.load_model(os.path.join(run, "checkpoints", "9"), abs_model)

    # A save in flight (Orbax's temporary directory): readers leave it, a writer's
    # start-up removes it (what a process killed mid-save left).
    tmp = os.path.join(run, "checkpoints", "7.orbax-checkpoint-tmp-123")
    os.makedirs(os.path.join(tmp, "model"))
    ckpt_lib.load_model(run, abs_model)
    reader = ckpt_lib.Checkpointer(run, read_only=True)
    assert reader.all_steps() == [5]
    reader.close()
    assert os.path.isdir(tmp)
    fresh = tmp_path / "fresh"
    ckpt_lib.Checkpointer(str(fresh), read_only=True).close()
    assert not fresh.exists()  # read-only creates nothing
    writer = ckpt_lib.Checkpointer(run)
    for _ in range(500):  # Orbax removes it in a background thread
        if not os.path.exists(tmp):
            break
        time.sleep(0.01)
    writer.close()
    assert not os.path.exists(tmp) and os.path.isdir(os.path.join(run, "checkpoints", "5"))


# ---------------------------------------------------------------- corruption
def _corrupt_data_files(step_dir: str) -> int:
    n = 0
    for root, _, files in os.walk(os.path.join(step_dir, "model")):
        for f in files:
            path = os.path.join(root, f)
            if "/d/" in path:
                size = os.path.getsize(path)
                with open(path, "wb") as fh:
                    fh.write(np.random.default_rng(n).integers(0, 256, size, np.uint8).tobytes())
                n += 1
    return n


def _corrupt_fingerprint(step_dir: str) -> int:
    path = os.path.join(step_dir, "meta", "metadata")
    with open(path) as f:
        meta = json.load(f)
    assert len(meta["params_fingerprint"]) == 32
    meta["params_fingerprint"] = "0" * 32
    with open(path, "w") as f:
        json.dump(meta, f)
    return 1


# A read that fails inside Orbax leaves a tensorstore callback for an event loop Orbax
# has closed; Python reports it as unraisable. Harmless here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "corrupt,reason",
    [
        (_corrupt_data_files, ""),  # a read error (tensorstore's wording varies)
        (_corrupt_fingerprint, "differs from the saved " + "0" * 32),
    ],
    ids=["data_files", "fingerprint"],
)
def test_corrupt_latest_falls_back_to_previous(tmp_path, corrupt, reason):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), async_save=False)
    _save_small(ckpt, 2, 2.0)
    _save_small(ckpt, 4, 4.0)
    assert ckpt.all_steps() == [2, 4]
    assert corrupt(os.path.join(ckpt.directory, "4")) >= 1
    warnings = []
    it = _iterator()
    step, out = ckpt.restore_latest(
        warn=lambda step, msg: warnings.append((step, msg)),
        abstract_model=_small_abstract(),
        data_iter=it,
    )
    assert step == 2
    _assert_bitwise(out["model"], _host(_small(2.0)))
    assert next(it) == 2
    assert len(warnings) == 1 and warnings[0][0] == 4
    assert "checkpoint 4 is corrupt" in warnings[0][1] and "restoring step 2" in warnings[0][1]
    assert reason in warnings[0][1]
    assert ckpt.all_steps() == [2] and ckpt.latest_step() == 2
    moved = os.listdir(tmp_path / ckpt_lib.CORRUPT_DIR)
    assert len(moved) == 1 and moved[0].startswith("4-")
    assert not os.path.exists(os.path.join(ckpt.directory, "4"))
    ckpt.close()


def test_only_corrupt_checkpoint_starts_from_scratch(tmp_path):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), async_save=False)
    _save_small(ckpt, 4, 4.0)
    _corrupt_fingerprint(os.path.join(ckpt.directory, "4"))
    warnings = []
    assert (
        ckpt.restore_latest(
            warn=lambda step, msg: warnings.append((step, msg)), abstract_model=_small_abstract()
        )
        is None
    )
    assert len(warnings) == 1 and warnings[0][0] == 4
    assert "checkpoint 4 is corrupt" in warnings[0][1]
    assert "starting from scratch" in warnings[0][1] and "fingerprint" in warnings[0][1]
    assert ckpt.all_steps() == [] and len(os.listdir(tmp_path / ckpt_lib.CORRUPT_DIR)) == 1
    ckpt.close()


# ---------------------------------------------------------------- retention, schedule
def test_retention_keeps_latest_and_best(tmp_path):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), keep=2, keep_best=1)
    metrics = {2: {"eval_wer": 0.1}, 4: {"eval_wer": 0.5}}
    for step in range(1, 7):
        _save_small(ckpt, step, float(step), metrics=metrics.get(step))
    ckpt.wait()
    assert ckpt.all_steps() == [2, 5, 6]
    assert sorted(int(d) for d in os.listdir(ckpt.directory) if d.isdigit()) == [2, 5, 6]
    ckpt.close()


def test_due_schedule(tmp_path):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path / "a"), every_steps=3)
    assert ckpt.due(3) == "every 3 steps" and ckpt.due(6) == "every 3 steps"
    assert ckpt.due(4) is None and ckpt.due(5) is None
    ckpt.close()

    ckpt = ckpt_lib.Checkpointer(str(tmp_path / "b"), every_steps=3, every_minutes=1e-4)
    time.sleep(0.05)  # > 6 ms
    assert ckpt.due(4) == "0.0001 minutes since the last save"
    ckpt.close()

    ckpt = ckpt_lib.Checkpointer(str(tmp_path / "c"), every_minutes=1, async_save=False)
    assert ckpt.due(4) is None
    ckpt._last_save = time.time() - 61
    assert ckpt.due(4) == "1 minutes since the last save"
    _save_small(ckpt, 4, 4.0)
    assert ckpt.due(5) is None  # the save restarted the clock
    ckpt.close()


# ---------------------------------------------------------------- non-finite step skip
def test_train_step_skips_nonfinite_batch():
    config = _tiny_config(dim=16)
    config.model.conformer.num_layers = 1
    config.specaug.enabled = False  # a smaller program to compile
    config.optim.warmup_steps = 0  # a non-zero learning rate at the first step
    mesh = _mesh({"data": 1}, 1)
    spec = build.abstract_model(config, VOCAB, mesh)
    graphdef, abs_params = spec.graphdef, spec.params
    p_shard, v_shard = spec.param_shardings, spec.var_shardings
    # Small random parameters (norm scales 1) from numpy: the model's truncated-normal
    # init costs ~10 s of compilation on CPU, and any finite start will do here.
    rng = np.random.default_rng(0)
    params = jax.device_put(
        jax.tree_util.tree_map_with_path(
            lambda path, x: (
                np.ones(x.shape, np.float32)
                if path[-1].key == "scale"
                else 0.1 * rng.standard_normal(x.shape).astype(np.float32)
            ),
            abs_params,
        ),
        p_shard,
    )
    mel = config.features.num_mel_bins
    model_vars = jax.device_put(build.feature_stats(np.full(mel, -5.0), np.full(mel, 3.0)), v_shard)
    tx = optim.make_optimizer(config.optim, 10)[0]
    opt_state, o_shard = init_opt_state(tx, params, mesh, p_shard)
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = TrainState(replicated, p_shard, v_shard, o_shard)
    step = jax.jit(
        make_train_step(graphdef, tx, 0, 0, config.loss),
        in_shardings=(shardings, None),
        out_shardings=(shardings, None),
    )
    b, s, u = 4, 8000, 5
    batch = {
        "audio": (0.1 * rng.standard_normal((b, s))).astype(np.float32),
        "audio_len": np.array([s, s, s - 1000, s // 2], np.int32),
        "labels": rng.integers(1, VOCAB, (b, u)).astype(np.int32),
        "label_len": np.array([5, 4, 3, 2], np.int32),
        "weight": np.ones(b, np.float32),
        "label_overflow": np.zeros(b, np.int32),
        "corrupt": np.zeros(b, np.int32),
    }
    bad = dict(batch, audio=batch["audio"].copy())
    bad["audio"][1, 100] = np.nan
    params_np, opt_np = _host(params), _host(opt_state)
    state = TrainState(jax.device_put(jnp.int32(3), replicated), params, model_vars, opt_state)
    with jax.set_mesh(mesh):
        s_bad, m_bad = step(state, bad)
        s_ok, m_ok = step(state, batch)
    p_bad, o_bad, p_ok, o_ok = s_bad.params, s_bad.opt_state, s_ok.params, s_ok.opt_state
    assert int(s_bad.step) == 4  # a skipped step still counts
    assert float(m_bad["nonfinite"]) == 1.0
    _assert_bitwise(p_bad, params_np)
    _assert_bitwise(o_bad, opt_np)
    assert float(m_ok["nonfinite"]) == 0.0 and np.isfinite(float(m_ok["loss"]))
    changed = [
        not np.array_equal(np.asarray(a), b)
        for a, b in zip(jax.tree.leaves(p_ok), jax.tree.leaves(params_np))
    ]
    assert sum(changed) > len(changed) // 2
    assert int(o_ok[1][0].count) == 1 and int(o_bad[1][0].count) == 0


# ---------------------------------------------------------------- preemption
# A process with a Preemption: the first Ctrl-C asks to stop after the step (reached, a
# line), the second leaves at once with on_abort's line and exit code 130.
CTRL_C_TWICE = """
import os, signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # not a shell's ignore
from jaxspeech.runs import checkpoint as ckpt_lib
p = ckpt_lib.Preemption(on_abort=lambda: "aborted: resumes from 4")
os.kill(os.getpid(), signal.SIGINT)
while not p.reached(1):
    time.sleep(0.01)
print("reached", p.interrupted, flush=True)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(60)
"""


def test_preemption_ctrl_c_once_stops_after_the_step_twice_at_once():
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_TWICE], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stdout.splitlines() == [
        "train: interrupted (Ctrl-C): stopping once the step in flight is saved; Ctrl-C "
        "again stops at once",
        "reached True",
    ]
    assert proc.stderr == "aborted: resumes from 4\n"
    assert ckpt_lib.abort_line(0, False).endswith("before any checkpoint: rerun to start")


def test_preemption_single_process_sigterm():
    original = signal.getsignal(signal.SIGTERM)
    sentinel = lambda signum, frame: None
    signal.signal(signal.SIGTERM, sentinel)
    try:
        p = ckpt_lib.Preemption()
        assert signal.getsignal(signal.SIGTERM) == p._on_signal
        assert not p.reached(0)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # Python runs the handler at the next bytecode boundary
            if p.reached(1):
                break
            time.sleep(0.01)
        assert p.reached(1) and p.reached(2)
        p.close()
        assert signal.getsignal(signal.SIGTERM) is sentinel
    finally:
        signal.signal(signal.SIGTERM, original)
