"""Logical axis names and the one table that maps them to mesh axes.

Layers annotate parameters and activations with logical names only
(`batch`, `time`, `embed`, `mlp`, `heads`, `vocab`, ...); which mesh axis each
lands on is decided here, so a new parallelism layout is a new table, not a
model change.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),  # examples split over every data-like axis
    ("embed", "fsdp"),  # FSDP: parameters sharded on their model dimension
    ("mlp", "tensor"),  # tensor parallelism: feed-forward hidden units
    ("heads", "tensor"),  # tensor parallelism: attention heads
    ("vocab", "tensor"),  # tensor parallelism: output vocabulary
    ("time", None),
    ("kv", None),
    ("conv", None),
    ("mel", None),
    ("channels", None),
)


def logical_to_spec(
    logical: Sequence[str | None] | None,
    rules: Sequence[tuple[str, str | tuple[str, ...] | None]] = DEFAULT_RULES,
) -> PartitionSpec:
    """Logical names, e.g. ("embed", "mlp"), to a PartitionSpec of mesh axes."""
    if logical is None:
        return PartitionSpec()
    table = dict(rules)
    out, used = [], set()
    for name in logical:
        if name is not None and name not in table:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        axes = table.get(name) if name is not None else None
        names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        # A mesh axis shards at most one dimension; the first dimension to claim it wins
        # (activations ("batch", "time", "embed") put fsdp on the batch, not on embed).
        if any(n in used for n in names):
            axes, names = None, ()
        used.update(names)
        out.append(axes)
    return PartitionSpec(*out)


def _axis_size(mesh: Mesh, axes: str | tuple[str, ...] | None) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else axes
    size = 1
    for n in names:
        size *= mesh.shape[n]
    return size


def fit_spec(shape: Sequence[int], spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
    """Drop the sharding of any dimension the mesh axes do not divide (replicate it instead).

    Small or odd-sized parameters (a 29-symbol vocabulary on 2 tensor shards)
    then still work on every mesh; `describe_shardings` shows where it happened.
    """
    entries = list(spec) + [None] * (len(shape) - len(spec))
    return PartitionSpec(
        *[ax if dim % _axis_size(mesh, ax) == 0 else None for dim, ax in zip(shape, entries)]
    )


def named_sharding(
    mesh: Mesh,
    shape: Sequence[int],
    logical: Sequence[str | None] | None,
    rules: Sequence[tuple[str, str | tuple[str, ...] | None]] = DEFAULT_RULES,
) -> NamedSharding:
    """NamedSharding for an array of `shape` annotated with logical names."""
    return NamedSharding(mesh, fit_spec(shape, logical_to_spec(logical, rules), mesh))


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation by logical names; a no-op outside a mesh context."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = fit_spec(x.shape, logical_to_spec(logical), mesh)
    return jax.lax.with_sharding_constraint(x, spec)


def state_shardings(state, mesh: Mesh) -> dict:
    """Pure nested dict of NamedShardings for an (abstract) `nnx.State`.

    Each variable's logical axes come from its `out_sharding` metadata (set by
    `nnx.with_partitioning`); variables without it are replicated.
    """
    from flax import nnx

    out: dict = {}
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("out_sharding")
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = named_sharding(mesh, var.get_value().shape, axes)
    return out


def describe_shardings(abstract_tree: dict, shardings: dict, mesh: Mesh) -> str:
    """A short start-up summary: parameter count, bytes per device, arrays not fully sharded."""
    leaves = jax.tree.leaves(abstract_tree)
    shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    total = sum(int(x.size) for x in leaves)
    per_device = sum(
        int(x.size) * x.dtype.itemsize // max(1, _spec_size(s.spec, mesh))
        for x, s in zip(leaves, shards)
    )
    return (
        f"{total / 1e6:.2f}M parameters in {len(leaves)} arrays; mesh {dict(mesh.shape)}; "
        f"{per_device / 2**20:.1f} MiB of parameters per device"
    )


def _spec_size(spec: PartitionSpec, mesh: Mesh) -> int:
    size = 1
    for axes in spec:
        size *= _axis_size(mesh, axes)
    return size
