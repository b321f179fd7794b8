"""What the loss kernels share: which implementation a step uses, and the platform it is
traced for.

`loss.kernel` = "auto" | "xla" | "pallas". The losses never read the config: the training
objective resolves the setting once per trace (`resolve`) and passes "xla" or "pallas"
down as an argument. "pallas" on a CPU runs the kernels in Pallas' interpret mode (slow:
every grid step and loop iteration becomes XLA ops; meant for tests), which "auto" never
picks.
"""

from __future__ import annotations

import importlib.util

import jax

from jaxspeech.parallel.rules import trace_platform  # noqa: F401  (the losses' import)

KERNEL_SETTINGS = ("auto", "xla", "pallas")
IMPLEMENTATIONS = ("xla", "pallas")
# Platforms whose Pallas kernels compile (Triton on NVIDIA GPUs; see kernels/ctc.py).
_COMPILED_PLATFORMS = ("gpu", "cuda")
# Pallas' Triton lowering is deprecated from jax 0.11: where a jax lacks it, "auto" keeps
# to XLA and "pallas" says why in one line.
TRITON_AVAILABLE = importlib.util.find_spec("jax.experimental.pallas.triton") is not None


def resolve(setting: str, platform: str) -> str:
    """`loss.kernel` -> "xla" or "pallas" for a step on `platform`: "auto" = the Pallas
    kernels where they compile (NVIDIA GPUs), XLA elsewhere (the CPU's fast path)."""
    if setting not in KERNEL_SETTINGS:
        raise ValueError(f"loss.kernel must be one of {KERNEL_SETTINGS}, got {setting!r}")
    if setting == "auto":
        return "pallas" if platform in _COMPILED_PLATFORMS and TRITON_AVAILABLE else "xla"
    if setting == "pallas" and not TRITON_AVAILABLE:
        raise ValueError(
            f"loss.kernel=pallas needs Pallas' Triton lowering, which jax {jax.__version__} "
            "lacks; use loss.kernel=xla"
        )
    return setting


def interpret_on(platform: str) -> bool:
    """Whether a Pallas kernel runs interpreted on `platform` (everything but a GPU)."""
    return platform not in _COMPILED_PLATFORMS


def pow2(n: int) -> int:
    """The smallest power of two >= max(n, 2): a kernel's vector length (Triton's tensors
    have power-of-two sizes)."""
    return 1 << max(n - 1, 1).bit_length()


def use_pallas(kernel: str) -> bool:
    """Whether a loss's `kernel` argument ("xla" or "pallas", as `resolve` returns) asks
    for the Pallas kernels."""
    if kernel not in IMPLEMENTATIONS:
        raise ValueError(f"kernel must be one of {IMPLEMENTATIONS}, got {kernel!r}")
    return kernel == "pallas"
