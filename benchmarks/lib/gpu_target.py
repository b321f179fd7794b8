"""Compiling for an NVIDIA GPU on a machine without one: the abstract target and its mesh.

With `jax-cuda12-plugin` and `jax-cuda12-pjrt` installed at jax's exact version (no
driver, no nvidia-* libraries: `make install-gpuplan` builds `.venv-gpuplan`), XLA
compiles for a GPU described by a `GpuTargetConfigProto` in text form (targets/*.txtpb:
the device facts of the H100 the plan figures are for). `topology(name)` returns that
GPU's abstract devices (`jax.experimental.topologies.get_topology_desc`); a jit over
`ShapeDtypeStruct`s sharded on `mesh(devices)` then `.lower(...).compile()`s to the
optimized GPU HLO (`compiled.as_text()`, read by benchmarks/lib/hlo.py) and XLA's memory
plan (`compiled.memory_analysis()`). Nothing runs: there is no device to run on.

Call `configure()` before jax creates a backend: it sets the flags below and keeps jax's
runtime on the CPU. `patch_cudnn_version(name)` is for such plans only: jax asks the
installed cuDNN library for its version before it emits cuDNN fused attention, and
there is none without the GPU stack, so the patch answers with the target's version.
Used by benchmarks/gpu_plan.py.
"""

from __future__ import annotations

import os
import re

TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")

# Without autotuning (no device to time candidates on) XLA's Triton GEMM emitter fails
# to tile some bf16 dots ("Couldn't find output tile sizes"); cuBLAS takes them instead,
# as it does for most dots on a real H100 after autotuning.
XLA_FLAGS = ("--xla_gpu_enable_triton_gemm=false",)


def target_names() -> list[str]:
    """The GPU targets there are protos for (file names in targets/ without .txtpb)."""
    return sorted(f[: -len(".txtpb")] for f in os.listdir(TARGETS_DIR) if f.endswith(".txtpb"))


def target_config(name: str = "h100") -> str:
    """The `GpuTargetConfigProto` text of target `name` (targets/<name>.txtpb)."""
    path = os.path.join(TARGETS_DIR, f"{name}.txtpb")
    if not os.path.exists(path):
        raise ValueError(f"no GPU target {name!r}: choose from {target_names()}")
    with open(path) as f:
        return f.read()


def with_flags(xla_flags: str, flags: tuple[str, ...] = XLA_FLAGS) -> str:
    """`xla_flags` (an XLA_FLAGS value) with each of `flags` added unless the same flag
    name is already set there (an explicit setting wins)."""
    out = xla_flags.split()
    names = {f.split("=", 1)[0] for f in out}
    out += [f for f in flags if f.split("=", 1)[0] not in names]
    return " ".join(out)


def configure(environ: os._Environ | dict | None = None) -> None:
    """Sets XLA_FLAGS (read when XLA first parses its options) and keeps jax's own runtime
    on the CPU (the CUDA plugin finds no GPU to run on; it only compiles)."""
    env = os.environ if environ is None else environ
    env["XLA_FLAGS"] = with_flags(env.get("XLA_FLAGS", ""))
    env["JAX_PLATFORMS"] = "cpu"


def dnn_version(config_text: str) -> int:
    """cuDNN's version number (major * 10000 + minor * 100 + patch, as cudnnGetVersion
    answers for cuDNN 9) of a target proto's `dnn_version_info`."""
    m = re.search(r"dnn_version_info\s*\{([^}]*)\}", config_text)
    if not m:
        raise ValueError("the GPU target config has no dnn_version_info")
    field = lambda k: int((re.search(rf"\b{k}\s*:\s*(\d+)", m.group(1)) or [0, 0])[1])
    return field("major") * 10000 + field("minor") * 100 + field("patch")


def device_description(config_text: str) -> str:
    """The target's `device_description_str` (e.g. "NVIDIA H100 80GB HBM3")."""
    m = re.search(r'device_description_str\s*:\s*"([^"]*)"', config_text)
    return m.group(1) if m else "?"


def device_memory_bytes(config_text: str) -> int:
    """The target's `gpu_device_info.device_memory_size`."""
    m = re.search(r"device_memory_size\s*:\s*(\d+)", config_text)
    return int(m.group(1)) if m else 0


def topology(name: str = "h100", shape: str = "1x1x1") -> list:
    """The abstract devices of target `name` (`shape`: the topology string, e.g. "1x1x1"
    for one GPU). Needs the CUDA plugin (.venv-gpuplan)."""
    import jax
    from jax.experimental import topologies

    text = target_config(name)
    try:
        desc = topologies.get_topology_desc(platform="cuda", target_config=text, topology=shape)
    except Exception as e:  # no plugin: jax names the missing "cuda" platform
        raise SystemExit(
            f"cannot build the abstract {name} topology ({str(e).splitlines()[0][:200]}); "
            f"run under .venv-gpuplan (make install-gpuplan), jax {jax.__version__}"
        ) from e
    return list(desc.devices)


def mesh(devices: list, axes: tuple[str, ...] = ("data",)):
    """A mesh of `devices` all along the first of `axes` (the others size 1), Auto axis
    types as the train loop's meshes."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    shape = (len(devices),) + (1,) * (len(axes) - 1)
    return Mesh(np.asarray(devices).reshape(shape), axes, axis_types=(AxisType.Auto,) * len(axes))


def patch_cudnn_version(name: str = "h100") -> int:
    """Makes jax's cuDNN version check answer the target's version (for plans only: in a
    process with a GPU the real library answers). Returns the version set."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    version = dnn_version(target_config(name))
    fa.check_cudnn_version = lambda: version
    return version
