"""Mesh from the config (replica axis, -1), replica groups along slow links, the logical
rules, and the multi-host start-up's argument checks."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules


def test_resolve_mesh_shape_fills_the_rest_and_defaults_to_one():
    # (replica, stage, data, fsdp, tensor)
    assert mesh_lib.resolve_mesh_shape({"data": -1}, 8) == (1, 1, 8, 1, 1)
    assert mesh_lib.resolve_mesh_shape({"replica": 2, "fsdp": -1, "tensor": 2}, 8) == (
        2,
        1,
        1,
        2,
        2,
    )
    assert mesh_lib.resolve_mesh_shape({"stage": 2, "data": -1}, 8) == (1, 2, 4, 1, 1)
    for sizes, message in [
        ({"data": -1, "fsdp": -1}, "at most one"),
        ({"data": 3}, "needs 3 devices"),
        ({"data": -1, "tensor": 3}, "not a multiple of 3"),
        ({"pipeline": 2}, "unknown mesh axes"),
        ({"stage": 3}, "needs 3 devices"),
        ({"data": 0}, "positive"),
    ]:
        with pytest.raises(mesh_lib.MeshConfigError, match=message):
            mesh_lib.resolve_mesh_shape(sizes, 8)


def test_replica_mesh_on_the_simulated_devices():
    mesh = mesh_lib.make_mesh({"replica": 2, "data": 2, "fsdp": -1})
    assert dict(mesh.shape) == {"replica": 2, "stage": 1, "data": 2, "fsdp": 2, "tensor": 1}
    # One process: each replica is a contiguous half of the devices.
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    assert set(ids[0].ravel()) == {0, 1, 2, 3} and set(ids[1].ravel()) == {4, 5, 6, 7}
    assert mesh_lib.num_batch_shards(mesh) == 8
    batch_axes = ("replica", "stage", "data", "fsdp")
    assert mesh_lib.batch_sharding(mesh, 2).spec == P(batch_axes, None)


def _fake(i, process, slice_index=0):
    return SimpleNamespace(id=i, process_index=process, slice_index=slice_index)


def test_replica_groups_are_whole_hosts_or_slices():
    hosts = [_fake(i, i // 2) for i in range(8)]  # 4 hosts x 2 devices
    groups = mesh_lib._replica_groups(hosts, 2)
    assert [[d.process_index for d in g] for g in groups] == [[0, 0, 1, 1], [2, 2, 3, 3]]
    assert mesh_lib._replica_groups(hosts, 3) is None  # 4 hosts do not split in 3
    slices = [_fake(i, i // 2, slice_index=i // 4) for i in range(8)]  # 2 TPU slices
    groups = mesh_lib._replica_groups(slices, 2)
    assert [{d.slice_index for d in g} for g in groups] == [{0}, {1}]


def test_rules_put_the_batch_on_every_data_axis_and_each_mesh_axis_once():
    spec = rules.logical_to_spec(("batch", "time", "embed"))
    # The stage axis splits the batch outside a pipelined stack; embed loses fsdp to batch.
    assert spec == P(("replica", "stage", "data", "fsdp"), None, None)
    assert rules.logical_to_spec(("embed", "mlp")) == P("fsdp", "tensor")
    with pytest.raises(KeyError, match="no rule"):
        rules.logical_to_spec(("pipeline_stage",))
    mesh = mesh_lib.make_mesh({"fsdp": 4, "tensor": 2})
    # 29 symbols do not split over 2 tensor shards: that dimension is replicated instead.
    assert rules.named_sharding(mesh, (32, 29), ("embed", "vocab")).spec == P("fsdp", None)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(coordinator_address="127.0.0.1:1234"), "missing --num_processes, --process_id"),
        (dict(coordinator_address="localhost", num_processes=2, process_id=0), "host:port"),
        (dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2), "0 <="),
        (dict(num_processes=2, process_id=0), "missing --coordinator_address"),
    ],
)
def test_initialize_refuses_incomplete_or_bad_flags(kwargs, message):
    with pytest.raises(mesh_lib.DistributedConfigError, match=message):
        mesh_lib.initialize(**kwargs)


ENV = {
    "JAXSPEECH_COORDINATOR_ADDRESS": "node1:61500",
    "JAXSPEECH_NUM_PROCESSES": "4",
    "JAXSPEECH_PROCESS_ID": "3",
}


def test_multihost_settings_from_the_environment_and_flags_win():
    expected = {"coordinator_address": "node1:61500", "num_processes": 4, "process_id": 3}
    assert mesh_lib.multihost_settings(environ=ENV) == ("env", expected)
    flags_given = mesh_lib.multihost_settings("h:1", 2, 0, environ=ENV)
    assert flags_given == (
        "flags",
        {"coordinator_address": "h:1", "num_processes": 2, "process_id": 0},
    )
    assert mesh_lib.multihost_settings(environ={"JAXSPEECH_PROCESS_ID": ""}) is None


@pytest.mark.parametrize(
    "drop,change,message",
    [
        ("JAXSPEECH_PROCESS_ID", {}, "missing JAXSPEECH_PROCESS_ID"),
        (None, {"JAXSPEECH_NUM_PROCESSES": "four"}, "JAXSPEECH_NUM_PROCESSES must be an integer"),
        (
            None,
            {"JAXSPEECH_COORDINATOR_ADDRESS": "node1"},
            "JAXSPEECH_COORDINATOR_ADDRESS must be host:port",
        ),
        (
            None,
            {"JAXSPEECH_PROCESS_ID": "4"},
            "0 <= JAXSPEECH_PROCESS_ID < JAXSPEECH_NUM_PROCESSES",
        ),
    ],
)
def test_multihost_settings_refuse_incomplete_or_bad_variables(drop, change, message):
    environ = {k: v for k, v in ENV.items() if k != drop} | change
    with pytest.raises(mesh_lib.DistributedConfigError, match=message):
        mesh_lib.multihost_settings(environ=environ)


def test_initialize_without_flags_or_cluster_is_a_single_process(monkeypatch):
    for var in ("OMPI_MCA_orte_hnp_uri", "SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST", *ENV):
        monkeypatch.delenv(var, raising=False)
    assert mesh_lib.detected_cluster() is None
    assert mesh_lib.initialize() == "single"
    assert jax.process_count() == 1


def test_map_batch_shards_keeps_the_log_mel_on_each_devices_rows():
    """Under a mesh, the front end's log-mel runs on each device's own rows: the same
    values as the unsharded computation, and no collective gathers the batch (XLA
    all-gathers an FFT's batch-sharded operand)."""
    from jax.sharding import NamedSharding

    from jaxspeech.audio import features

    mesh = mesh_lib.make_mesh({"data": 4, "tensor": 2})
    audio = np.random.default_rng(0).standard_normal((8, 16000)).astype(np.float32)
    sharded = jax.device_put(audio, NamedSharding(mesh, mesh_lib.batch_sharding(mesh, 2).spec))
    fn = jax.jit(lambda a: rules.map_batch_shards(features.log_mel, a))
    with jax.set_mesh(mesh):
        compiled = fn.lower(sharded).compile()
        got = compiled(sharded)
    assert "all-gather" not in compiled.as_text()
    np.testing.assert_allclose(got, jax.jit(features.log_mel)(audio), atol=1e-4)
    # A batch the data axes do not divide, and no mesh at all: plain calls.
    with jax.set_mesh(mesh):
        odd = jax.jit(lambda a: rules.map_batch_shards(features.log_mel, a))(audio[:3])
    np.testing.assert_allclose(odd, features.log_mel(audio[:3]), atol=1e-4)
    np.testing.assert_allclose(
        rules.map_batch_shards(features.log_mel, audio[:2]), features.log_mel(audio[:2])
    )


def test_no_flags_at_import_and_the_entry_points_flags_feed_initialize():
    """Importing every jaxspeech module in a fresh interpreter defines no command-line
    flag in any of them (absl, Grain and Orbax define their own; those are theirs). The
    flags an entry point defines with `define_flags()` are found under jaxspeech's name,
    and once parsed they reach `initialize` (here: two of the three multi-host flags)."""
    import subprocess
    import sys

    code = (
        "import pkgutil, importlib, jaxspeech\n"
        "from absl import flags\n"
        "def ours():\n"
        "    return sorted(m for m in flags.FLAGS.flags_by_module_dict() if 'jaxspeech' in m)\n"
        "for m in pkgutil.walk_packages(jaxspeech.__path__, 'jaxspeech.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(ours())\n"
        "from jaxspeech.parallel import mesh\n"
        "mesh.define_flags()\n"
        "print(ours())\n"
        "flags.FLAGS(['prog', '--coordinator_address=127.0.0.1:1', '--num_processes=2'])\n"
        "try:\n"
        "    mesh.initialize()\n"
        "except mesh.DistributedConfigError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "[]", out
    assert out[1] == "['jaxspeech.parallel.mesh']", out
    assert out[2].endswith("missing --process_id"), out
