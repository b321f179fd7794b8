"""Logical axis names and the one table that maps them to mesh axes.

Layers annotate parameters and activations with logical names only
(`batch`, `time`, `embed`, `mlp`, `heads`, `vocab`, ...); which mesh axis each
lands on is decided here, so a new parallelism layout is a new table, not a
model change.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Outermost first: `replica` groups devices joined by slow links (hosts, TPU slices over
# DCN); parameters are replicated across it and only gradients cross it, once per step.
# `stage`: pipeline stages (jaxspeech.parallel.pipeline); neighbouring stages exchange
# activations point to point, so it sits outside the data axes.
MESH_AXES = ("replica", "stage", "data", "fsdp", "tensor")

# logical name -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # Examples split over every data-like axis; outside the pipelined layer stack the
    # stage axis splits them too (front end and heads run data-parallel over it).
    ("batch", ("replica", "stage", "data", "fsdp")),
    ("layers", "stage"),  # a pipelined stack's layers: contiguous blocks per stage
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

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# Logical axes added after runs were saved with a complete table: such a run's
# config.mesh.rules lacks them and reads their DEFAULT_RULES entry.
ADDED_LATER = ("layers",)  # pipeline parallelism's stacked-layer axis

# The table in force: `axis_rules(...)` swaps it for a block (a run's config.mesh.rules);
# every function here that takes no explicit table reads it, so the layers'
# `constrain` calls follow the run's table without being told.
_ACTIVE: contextvars.ContextVar[Rules] = contextvars.ContextVar("rules", default=DEFAULT_RULES)


# Mesh axes that a surrounding `jax.vmap(..., spmd_axis_name=...)` already splits (the
# learners of a sync strategy, `learner_axes`): removed from the table inside, and made
# manual in every `map_batch_shards` (a partial shard_map under such a vmap must name them).
_VMAPPED: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("vmapped", default=())


def active_rules() -> Rules:
    """The logical -> mesh axis table in force."""
    return _ACTIVE.get()


def without_axes(table: Rules, axes: Sequence[str]) -> Rules:
    """`table` with the mesh axes `axes` removed from every rule."""
    out = []
    for name, target in table:
        names = () if target is None else ((target,) if isinstance(target, str) else target)
        kept = tuple(a for a in names if a not in axes)
        out.append((name, None if not kept else (kept[0] if len(kept) == 1 else kept)))
    return tuple(out)


@contextlib.contextmanager
def learner_axes(axes: Sequence[str]) -> Iterator[None]:
    """Inside a `jax.vmap(..., spmd_axis_name=axes)` over learners: the table in force minus
    `axes` (each learner's batch splits over the remaining batch axes only), and
    `map_batch_shards` makes `axes` manual too."""
    token = _ACTIVE.set(without_axes(_ACTIVE.get(), axes))
    token_v = _VMAPPED.set(tuple(axes))
    try:
        yield
    finally:
        _VMAPPED.reset(token_v)
        _ACTIVE.reset(token)


@contextlib.contextmanager
def axis_rules(table: Rules) -> Iterator[None]:
    """Use `table` instead of DEFAULT_RULES inside the block (tracing included)."""
    token = _ACTIVE.set(tuple(table))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def rules_to_config(table: Rules = DEFAULT_RULES) -> dict[str, str]:
    """The table as {logical name: "mesh,axes"} ("" = replicated): the form of
    config.mesh.rules, one overridable key per logical name."""
    out = {}
    for name, axes in table:
        names = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
        out[name] = ",".join(names)
    return out


def rules_from_config(entries: Mapping[str, str] | None) -> Rules:
    """config.mesh.rules ({logical name: "mesh,axes"}) back to a table; None = the default.

    Raises:
      ValueError: an unknown logical or mesh axis name, or a logical name missing.
    """
    if entries is None:
        return DEFAULT_RULES
    known = {name for name, _ in DEFAULT_RULES}
    unknown = sorted(set(entries) - known)
    # A run saved before a logical axis existed reads that axis at its default.
    entries = {n: a for n, a in rules_to_config().items() if n in ADDED_LATER} | dict(entries)
    missing = sorted(known - set(entries))
    if unknown or missing:
        raise ValueError(
            f"mesh.rules must name exactly the logical axes {sorted(known)}; "
            + (f"unknown {unknown}" if unknown else f"missing {missing}")
        )
    table = []
    for name, _ in DEFAULT_RULES:
        axes = tuple(a.strip() for a in str(entries[name]).split(",") if a.strip())
        bad = [a for a in axes if a not in MESH_AXES]
        if bad:
            raise ValueError(f"mesh.rules.{name}: unknown mesh axes {bad}; use {MESH_AXES}")
        table.append((name, None if not axes else (axes[0] if len(axes) == 1 else axes)))
    return tuple(table)


def logical_to_spec(
    logical: Sequence[str | None] | None, rules: Rules | None = None
) -> PartitionSpec:
    """Logical names, e.g. ("embed", "mlp"), to a PartitionSpec of mesh axes (by `rules`,
    else the table in force)."""
    if logical is None:
        return PartitionSpec()
    table = dict(active_rules() if rules is None else rules)
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
    rules: Rules | None = None,
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


def trace_platform() -> str:
    """The platform of the devices the function being traced runs on: the mesh's (as the
    train loop traces inside `jax.set_mesh`; a deviceless GPU plan's mesh is a GPU one
    although the host's backend is the CPU), else the default backend's. What "auto"
    settings (loss kernels, attention) choose by."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def map_batch_shards(fn, *args):
    """fn(*args) on each device's own rows of batch-leading arrays: `jax.shard_map` over the
    batch's mesh axes of the current mesh; plain fn(*args) outside a mesh, or when the
    batch does not split evenly.

    For operations XLA's partitioner does not split along the batch (an FFT on a
    batch-sharded array is all-gathered first, so every device would transform the whole
    global batch): fn must treat rows independently.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return fn(*args)
    axes = logical_to_spec(("batch",))[0]
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    names = tuple(n for n in names if n in mesh.shape and mesh.shape[n] > 1)
    size = 1
    for n in names:
        size *= mesh.shape[n]
    vmapped = _VMAPPED.get()
    # Under a learner vmap the learner axes split the rows even when no batch axis is left
    # inside a learner: still shard_map, or XLA gathers every learner's rows for fn.
    if (size == 1 and not vmapped) or any(a.shape[0] % size for a in args):
        return fn(*args)
    spec = PartitionSpec(names or None)
    # Only the batch axes go manual; others (tensor) stay automatic inside. Under a learner
    # vmap the learner axes must be manual as well (jax requires it of a vmapped shard_map).
    # (and jax's varying-axes check then trips over constants inside fn: it is off there,
    # fn being row-wise by contract).
    return jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(spec,) * len(args),
        out_specs=spec,
        axis_names=set(names) | set(vmapped),
        check_vma=not vmapped,
    )(*args)


def _map_variables(state, fn) -> dict:
    """Pure nested dict of fn(variable) for every variable of an (abstract) `nnx.State`."""
    from flax import nnx

    out: dict = {}
    for path, var in nnx.to_flat_state(state):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = fn(var)
    return out


def _logical_axes(var) -> tuple | None:
    """A variable's logical axes: its `out_sharding` metadata (`nnx.with_partitioning`)."""
    return var.get_metadata().get("out_sharding")


def batch_axes() -> tuple[str, ...]:
    """The mesh axes the table in force splits examples over (the `batch` rule)."""
    axes = dict(active_rules()).get("batch")
    return () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))


def constrain_state(state, drop_axes: Sequence[str]):
    """An `nnx.State` whose every variable is constrained to its logical-axis sharding
    with the mesh axes `drop_axes` removed (replicated over them): e.g. FSDP-sharded
    weights all-gathered once, where a loop would otherwise gather them on every
    iteration. A no-op outside a mesh context."""
    from flax import nnx

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return state
    table = without_axes(active_rules(), drop_axes)

    def one(var):
        value = var.get_value()
        spec = fit_spec(value.shape, logical_to_spec(_logical_axes(var), table), mesh)
        return var.copy(jax.lax.with_sharding_constraint(value, spec))

    return nnx.from_flat_state([(path, one(var)) for path, var in nnx.to_flat_state(state)])


def state_axes(state) -> dict:
    """Logical-axis tuples (or None) of an `nnx.State`'s variables; scanned layers add a
    leading unnamed axis."""
    return _map_variables(state, _logical_axes)


def state_shardings(state, mesh: Mesh) -> dict:
    """NamedShardings of an `nnx.State`'s variables (without logical axes: replicated)."""
    return _map_variables(
        state, lambda var: named_sharding(mesh, var.get_value().shape, _logical_axes(var))
    )


def _flat(tree: dict, prefix: tuple = ()) -> list[tuple[tuple, object]]:
    out = []
    for k, v in tree.items():
        if isinstance(v, dict):
            out.extend(_flat(v, prefix + (k,)))
        else:
            out.append((prefix + (k,), v))
    return out


def bytes_per_device(abstract_tree: dict, shardings: dict, mesh: Mesh) -> int:
    """Bytes of `abstract_tree`'s arrays that each device holds under `shardings`."""
    leaves = jax.tree.leaves(abstract_tree)
    shards = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    return sum(
        int(x.size) * x.dtype.itemsize // max(1, _spec_size(s.spec, mesh))
        for x, s in zip(leaves, shards)
    )


def describe_shardings(
    abstract_tree: dict,
    shardings: dict,
    mesh: Mesh,
    axes: dict | None = None,
    *,
    optimizer_copies: int = 2,
) -> str:
    """The start-up summary: one row per parameter (shape, logical axes, mesh sharding,
    KiB per device), then totals per device for parameters and optimizer state.

    Rows of unscanned layers that differ only in their layer number are merged
    (`blocks.*`, with a count). A mesh axis a dimension does not divide is dropped
    (the dimension is replicated); such rows are marked `!`.
    """
    axes_flat = dict(_flat(axes)) if axes else {}
    rows: dict[tuple, list] = {}
    for (path, x), (_, s) in zip(_flat(abstract_tree), _flat(shardings)):
        name = ".".join("*" if str(k).isdigit() else str(k) for k in path)
        logical = axes_flat.get(path)
        wanted = logical_to_spec(logical) if logical is not None else PartitionSpec()
        dropped = any(
            w is not None and g is None for w, g in zip(wanted, list(s.spec) + [None] * len(wanted))
        )
        kib = int(x.size) * x.dtype.itemsize / max(1, _spec_size(s.spec, mesh)) / 1024
        key = (name, tuple(x.shape), str(logical), str(tuple(s.spec)), dropped)
        rows.setdefault(key, [0, kib])[0] += 1
    width = max([len(k[0]) for k in rows] + [9])
    lines = [
        f"{'parameter':<{width}}  {'shape':<18} {'logical axes':<34} {'mesh axes':<30} KiB/dev"
    ]
    for (name, shape, logical, spec, dropped), (count, kib) in rows.items():
        label = name + (f" x{count}" if count > 1 else "")
        logical = logical.replace("None", "-").replace("'", "")
        spec = spec.replace("None", "-").replace("'", "") + (" !" if dropped else "")
        lines.append(f"{label:<{width}}  {str(shape):<18} {logical:<34} {spec:<30} {kib:8.1f}")
    leaves = jax.tree.leaves(abstract_tree)
    total = sum(int(x.size) for x in leaves)
    per_device = bytes_per_device(abstract_tree, shardings, mesh)
    lines.append(
        f"{total / 1e6:.2f}M parameters in {len(leaves)} arrays; mesh {dict(mesh.shape)}; "
        f"per device: {per_device / 2**20:.1f} MiB of parameters + "
        f"{optimizer_copies * per_device / 2**20:.1f} MiB of optimizer moments"
        + (
            "; ! = a mesh axis that does not divide the dimension was dropped"
            if any(k[4] for k in rows)
            else ""
        )
    )
    return "\n".join(lines)


def _spec_size(spec: PartitionSpec, mesh: Mesh) -> int:
    size = 1
    for axes in spec:
        size *= _axis_size(mesh, axes)
    return size


def abstract_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of `tree`'s leaves carrying `shardings` (a matching tree)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )
