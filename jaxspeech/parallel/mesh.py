"""Device mesh from the config and host-local -> global batch assembly."""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from jaxspeech.parallel import rules


class MeshConfigError(ValueError):
    """The mesh in the config does not fit the devices."""


def resolve_mesh_shape(sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Sizes of (data, fsdp, tensor) with at most one -1 ("the rest of the devices")."""
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


def make_mesh(sizes: Mapping[str, int], devices: list | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over all (or the given) devices.

    Axis types are Auto: shardings are given at jit boundaries and by
    constraints, and XLA propagates the rest.
    """
    devices = jax.devices() if devices is None else devices
    shape = resolve_mesh_shape(sizes, len(devices))
    return jax.make_mesh(
        shape, rules.MESH_AXES, axis_types=(AxisType.Auto,) * len(shape), devices=devices
    )


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a (B, ...) batch array: B over the data-like axes, the rest replicated."""
    return NamedSharding(mesh, rules.logical_to_spec(("batch",) + (None,) * (ndim - 1)))


def num_batch_shards(mesh: Mesh) -> int:
    """How many ways the batch dimension is split (global batch sizes must divide by it)."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


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


def sum_over_processes(values: np.ndarray) -> np.ndarray:
    """Element-wise sum of a small host array over all processes."""
    if jax.process_count() == 1:
        return values
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(values)).sum(axis=0)
