"""Multi-host start-up, the device mesh from the config, host-local <-> global batches."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import flags
from jax.sharding import AxisType, Mesh, NamedSharding

from jaxspeech.parallel import rules

# The multi-host flags every entry point takes. Defined by `define_flags()`, which the
# entry points call when they run as programs: a library module defines no global flags
# at import time (two modules defining one name would clash in any process that imports
# both, e.g. the launcher's own --num_processes).
FLAG_DEFAULTS = {
    "coordinator_address": None,
    "num_processes": None,
    "process_id": None,
    "heartbeat_timeout_s": 100,
}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Define --coordinator_address, --num_processes, --process_id, --heartbeat_timeout_s."""
    flags.DEFINE_string(
        "coordinator_address",
        None,
        "host:port of process 0's coordination service (multi-host runs without a cluster "
        "manager JAX detects); the coordinator binds to exactly this address.",
        flag_values=flag_values,
    )
    flags.DEFINE_integer("num_processes", None, "Processes in the job.", flag_values=flag_values)
    flags.DEFINE_integer(
        "process_id", None, "This process's index, 0-based.", flag_values=flag_values
    )
    flags.DEFINE_integer(
        "heartbeat_timeout_s",
        FLAG_DEFAULTS["heartbeat_timeout_s"],
        "Seconds without a heartbeat after which a peer counts as dead and every process "
        "stops with an error (instead of hanging in a collective).",
        flag_values=flag_values,
    )


class MeshConfigError(ValueError):
    """The mesh in the config does not fit the devices."""


class DistributedConfigError(ValueError):
    """Inconsistent multi-host flags."""


def _flag(name: str, given):
    """An explicit argument wins; else the parsed flag (if an entry point defined it)."""
    if given is not None:
        return given
    if name in flags.FLAGS and flags.FLAGS.is_parsed():
        return flags.FLAGS[name].value
    return None


def detected_cluster() -> str | None:
    """Name of the cluster manager JAX would detect (TPU pod, SLURM, Open MPI, ...), or None.

    Uses JAX's own detectors; opt-in ones (mpi4py) are skipped as JAX skips them.
    """
    try:
        from jax._src import clusters
    except ImportError:  # a JAX without the private module: no auto-detection
        return None
    for env in clusters.ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False):
            continue
        try:
            if env.is_env_present():
                return env.__name__
        except Exception:  # noqa: BLE001 - a detector probing a metadata server may fail
            continue
    return None


# The plain environment-variable path (any launcher that can set per-process variables:
# a SLURM batch script, a Kubernetes job, pdsh): the same three values as the flags.
ENV_VARS = {
    "coordinator_address": "JAXSPEECH_COORDINATOR_ADDRESS",
    "num_processes": "JAXSPEECH_NUM_PROCESSES",
    "process_id": "JAXSPEECH_PROCESS_ID",
}


def _from_env(name: str, environ: Mapping[str, str]):
    """`name`'s environment variable (ENV_VARS), parsed like the flag; None if unset."""
    value = environ.get(ENV_VARS[name])
    if value is None or value == "":
        return None
    if name == "coordinator_address":
        return value
    try:
        return int(value)
    except ValueError:
        raise DistributedConfigError(
            f"{ENV_VARS[name]} must be an integer, got {value!r}"
        ) from None


def multihost_settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, dict] | None:
    """Where this process's multi-host settings come from, and them; None if nowhere.

    Arguments (or the parsed flags) win; without any, the JAXSPEECH_* variables of
    ENV_VARS. Returns ("flags" | "env", {"coordinator_address", "num_processes",
    "process_id"}), or None when neither gives any of the three (cluster detection or a
    single process decides then).

    Raises:
      DistributedConfigError: some but not all three, or a bad value.
    """
    environ = os.environ if environ is None else environ
    given = {
        "coordinator_address": _flag("coordinator_address", coordinator_address),
        "num_processes": _flag("num_processes", num_processes),
        "process_id": _flag("process_id", process_id),
    }
    source, spell = "flags", lambda k: "--" + k
    if all(v is None for v in given.values()):
        given = {k: _from_env(k, environ) for k in given}
        source, spell = "env", lambda k: ENV_VARS[k]
        if all(v is None for v in given.values()):
            return None
    missing = [k for k, v in given.items() if v is None]
    if missing:
        need = ", ".join(spell(k) for k in given)
        raise DistributedConfigError(
            f"multi-host {'flags' if source == 'flags' else 'variables'} need all of "
            f"{need}; missing {', '.join(spell(m) for m in missing)}"
        )
    address, count, index = given.values()
    if ":" not in address or not address.rsplit(":", 1)[1].isdigit():
        raise DistributedConfigError(
            f"{spell('coordinator_address')} must be host:port, got {address!r}"
        )
    if count < 1 or not 0 <= index < count:
        raise DistributedConfigError(
            f"need {spell('num_processes')} >= 1 and 0 <= {spell('process_id')} < "
            f"{spell('num_processes')}, got {count} and {index}"
        )
    return source, given


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    heartbeat_timeout_s: int | None = None,
) -> str:
    """Join a multi-process job, if this is one; returns how ("single", "flags", "env",
    <cluster>).

    With ``--coordinator_address/--num_processes/--process_id`` (or the arguments), or
    else the JAXSPEECH_COORDINATOR_ADDRESS / _NUM_PROCESSES / _PROCESS_ID variables,
    calls ``jax.distributed.initialize`` with them; process 0's coordination service
    binds to that address only (JAX's default binds all interfaces), and JAX's cluster
    detection is off, so a process sees every local device (under SLURM, JAX's detection
    would limit each process to the GPU of its SLURM_LOCALID; `JAX_LOCAL_DEVICE_IDS`
    still chooses devices explicitly). Without either, a cluster manager JAX detects
    (TPU pod, SLURM, Open MPI) supplies everything; otherwise this is a single-process
    run and nothing happens. Must run before JAX touches a device.

    Raises:
      DistributedConfigError: some but not all of the three settings, or a bad value.
    """
    heartbeat = _flag("heartbeat_timeout_s", heartbeat_timeout_s) or 100
    settings = multihost_settings(coordinator_address, num_processes, process_id)
    if settings is not None:
        source, given = settings
        jax.distributed.initialize(
            **given,
            coordinator_bind_address=given["coordinator_address"],
            heartbeat_timeout_seconds=heartbeat,
            cluster_detection_method="deactivate",
        )
        return source
    cluster = detected_cluster()
    if cluster is None:
        return "single"
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat)
    return cluster


def resolve_mesh_shape(sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Sizes of (replica, data, fsdp, tensor) with at most one -1 ("the rest of the devices").

    Axes not given are 1.
    """
    unknown = [k for k in sizes if k not in rules.MESH_AXES]
    if unknown:
        raise MeshConfigError(f"unknown mesh axes {unknown}; expected {rules.MESH_AXES}")
    shape = [int(sizes.get(a, 1)) for a in rules.MESH_AXES]
    if shape.count(-1) > 1:
        raise MeshConfigError(f"at most one mesh axis may be -1, got {dict(sizes)}")
    if any(s == 0 or s < -1 for s in shape):
        raise MeshConfigError(f"mesh axis sizes must be positive or -1, got {dict(sizes)}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise MeshConfigError(
                f"mesh {dict(sizes)} cannot use {num_devices} devices: "
                f"{num_devices} is not a multiple of {known}"
            )
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise MeshConfigError(
            f"mesh {dict(zip(rules.MESH_AXES, shape))} needs {math.prod(shape)} devices, "
            f"but {num_devices} are available; set --config.mesh.<axis>=-1 to use the rest"
        )
    return tuple(shape)


def _replica_groups(devices: list, replicas: int) -> list[list] | None:
    """Devices split into `replicas` groups along slow links: TPU slices if there are
    exactly that many, else whole processes (hosts); None if neither fits. One process
    (a simulated mesh) is split in device order."""
    slices = sorted({getattr(d, "slice_index", 0) for d in devices})
    if len(slices) == replicas > 1:
        return [[d for d in devices if getattr(d, "slice_index", 0) == s] for s in slices]
    procs = sorted({d.process_index for d in devices})
    if len(procs) == 1:
        per = len(devices) // replicas
        return [devices[r * per : (r + 1) * per] for r in range(replicas)]
    if len(procs) % replicas == 0:
        per = len(procs) // replicas
        return [
            [d for d in devices if d.process_index in procs[r * per : (r + 1) * per]]
            for r in range(replicas)
        ]
    return None


def make_mesh(sizes: Mapping[str, int], devices: list | None = None) -> Mesh:
    """A (replica, data, fsdp, tensor) mesh over all (or the given) devices.

    Within a replica JAX orders devices for its fast interconnect (`jax.make_mesh`);
    with replica > 1 every replica is one group of TPU slices or whole hosts, so only
    the replica-axis collective (the gradient all-reduce) crosses the slow links.
    Axis types are Auto: shardings are given at jit boundaries and by constraints,
    and XLA propagates the rest.
    """
    devices = jax.devices() if devices is None else list(devices)
    shape = resolve_mesh_shape(sizes, len(devices))
    axis_types = (AxisType.Auto,) * len(shape)
    replicas = shape[0]
    groups = _replica_groups(devices, replicas) if replicas > 1 else None
    if replicas > 1 and groups is None:
        raise MeshConfigError(
            f"mesh.replica={replicas} must divide the {len({d.process_index for d in devices})} "
            "processes (or equal the number of TPU slices): a replica is a group of whole hosts"
        )
    if groups is None:
        return jax.make_mesh(shape, rules.MESH_AXES, axis_types=axis_types, devices=devices)
    inner = [
        jax.make_mesh(shape[1:], rules.MESH_AXES[1:], axis_types=axis_types[1:], devices=g).devices
        for g in groups
    ]
    return Mesh(np.stack(inner), rules.MESH_AXES, axis_types=axis_types)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a (B, ...) batch array: B over the data-like axes, the rest replicated."""
    return NamedSharding(mesh, rules.logical_to_spec(("batch",) + (None,) * (ndim - 1)))


def num_batch_shards(mesh: Mesh) -> int:
    """How many ways the batch dimension is split by the rules in force (global batch
    sizes must divide by it)."""
    axes = rules.logical_to_spec(("batch",))[0]
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    return int(np.prod([mesh.shape[n] for n in names]))


def unit_rows(mesh: Mesh, rows: int) -> int:
    """At least `rows` global rows, a multiple of the batch shards and the processes."""
    unit = math.lcm(num_batch_shards(mesh), jax.process_count())
    return unit * max(1, math.ceil(rows / unit))


def host_to_global(mesh: Mesh, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Assemble each host's slice of the batch into global arrays sharded over the batch."""
    return {
        k: jax.make_array_from_process_local_data(batch_sharding(mesh, v.ndim), v)
        for k, v in local.items()
    }


def to_host_local(mesh: Mesh, arr: jax.Array) -> np.ndarray:
    """This process's rows of a batch-sharded global array, as numpy."""
    if jax.process_count() == 1:
        return np.asarray(arr)
    from jax.experimental import multihost_utils

    spec = batch_sharding(mesh, arr.ndim).spec
    return np.asarray(multihost_utils.global_array_to_host_local_array(arr, mesh, spec))


def gather_to_host(tree: Any) -> Any:
    """Every leaf of a pytree of global arrays as a whole numpy array, on every process
    (for arrays that span processes, a collective every process must call)."""

    def whole(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(whole, tree)


def sum_over_processes(values: np.ndarray) -> np.ndarray:
    """Element-wise sum of a small host array over all processes."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(values)).sum(axis=0)


def allgather_json(items: list) -> list:
    """Every process's `items` (JSON-able), concatenated in process order, on every
    process: per-utterance results of a multi-host evaluation, for example.

    Items travel as UTF-8 JSON bytes, zero-padded to the longest process's.
    """
    if jax.process_count() == 1:
        return list(items)
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(items).encode("utf-8"), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    everything = np.asarray(multihost_utils.process_allgather(padded))  # (P, longest)
    out: list = []
    for p, size in enumerate(sizes.reshape(-1)):
        out += json.loads(everything[p, : int(size)].tobytes().decode("utf-8"))
    return out
