"""Which devices this process sees, and whether the job's collectives work.

    python -m jaxspeech.devices [--config configs/demo.py] [multi-host flags]

The check to run after installing (`pip install -e '.[cuda]'`) and on a new cluster
before a long run. Every process prints its backend, its local devices and the job's
processes and devices; then one value per device is all-reduced over every device of the
job and the sum checked, so a job whose processes did not all join, or whose interconnect
fails, stops here with an error instead of an hour into training. With --config, also
the mesh that config builds on these devices. Joins a multi-host job like training
(flags, JAXSPEECH_* variables or cluster detection: `jaxspeech.parallel.mesh.initialize`).
Exit code 0 when the sum is right, 1 when it is not, 2 for a bad command line or config.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import ConfigDict, config_flags

from jaxspeech.common import cli
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.parallel import mesh as mesh_lib


def describe_devices() -> str:
    """Lines naming this process, its backend and devices, and the whole job's."""
    local = jax.local_devices()
    kinds = sorted({d.device_kind for d in local})
    lines = [
        f"process {jax.process_index()} of {jax.process_count()}: backend "
        f"{jax.default_backend()}, {len(local)} local device(s) ({', '.join(kinds)})",
        "  local: " + ", ".join(f"{d.id}:{d.platform}" for d in local),
        f"  job: {jax.device_count()} device(s) over {jax.process_count()} process(es)",
    ]
    chosen = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    if chosen:  # one process per GPU: the device this process was given
        lines.append(f"  JAX_LOCAL_DEVICE_IDS={chosen}")
    return "\n".join(lines)


def allreduce_check() -> tuple[float, float]:
    """(sum, expected): device i of the job contributes i + 1 and the sum over every
    device is taken by one compiled all-reduce; expected = n (n + 1) / 2 for n devices.
    Distinct values per device, so a device counted twice or missed shows in the sum."""
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("all",))
    sharding = NamedSharding(mesh, PartitionSpec("all"))
    ids = {d: i for i, d in enumerate(devices)}
    values = jax.make_array_from_callback(
        (len(devices),),
        sharding,
        # Each device's one-element shard: its position in the job's device list, plus 1.
        lambda index: np.array([ids[_device_of(sharding, index)] + 1.0], np.float32),
    )
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(values)
    n = len(devices)
    return float(np.asarray(total.addressable_data(0))), n * (n + 1) / 2.0


def _device_of(sharding: NamedSharding, index: tuple) -> jax.Device:
    """The local device whose shard is `index` (the callback gets only the index)."""
    for device, idx in sharding.addressable_devices_indices_map((len(jax.devices()),)).items():
        if idx == index:
            return device
    raise AssertionError(f"no local device holds shard {index}")


def describe_config_mesh(config: ConfigDict) -> str:
    """The mesh `config.mesh` builds on this job's devices, axis by axis."""

    try:
        mesh = build.mesh_from_config(config)
    except mesh_lib.MeshConfigError as e:
        raise UserError(str(e)) from e
    return "mesh: " + ", ".join(f"{k}={v}" for k, v in mesh.shape.items())


def check(config: ConfigDict | None) -> int:
    """Print the devices (and `config`'s mesh), run the all-reduce; 0 if its sum is right."""
    print(describe_devices(), flush=True)
    if config is not None:
        print(describe_config_mesh(config), flush=True)
    total, expected = allreduce_check()
    ok = total == expected
    print(
        f"all-reduce over {jax.device_count()} device(s): sum {total:g}, expected "
        f"{expected:g}: {'ok' if ok else 'WRONG'}",
        flush=True,
    )
    return 0 if ok else 1


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        cli.usage_error(f"unexpected arguments: {argv[1:]}")
    result = {}
    cli.run_job(lambda: result.setdefault("code", check(flags.FLAGS.config)))
    sys.exit(result.get("code", 1))


if __name__ == "__main__":
    logging.set_verbosity(logging.WARNING)
    config_flags.DEFINE_config_file("config", None, "Optional: also show this config's mesh.")
    mesh_lib.define_flags()
    app.run(main, flags_parser=cli.parse_flags)
