"""Depthwise 1-D convolution of the Conformer conv module: ours vs the alternatives.

`python benchmarks/depthwise_conv.py [--quick]` times forward and forward + backward
(gradients for input, kernel and bias) of three implementations on the current
device, checks each against XLA's grouped convolution, prints a table and writes
`benchmarks/results/depthwise_conv.json`:
  blocked_band   jaxspeech.models.layers.depthwise_conv1d (blocked banded matmuls)
  shifted_sum    a sum of K shifted, scaled slices (what the model used before)
  lax_grouped    jax.lax.conv_general_dilated with feature_group_count = C
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspeech.models.layers import depthwise_conv1d

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, timing  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def shifted_sum(x_btc: jax.Array, w_kc: jax.Array, b_c: jax.Array) -> jax.Array:
    """'Same' depthwise convolution as a sum of K shifted multiplies."""
    k, t = w_kc.shape[0], x_btc.shape[1]
    pad = (k - 1) // 2
    xp = jnp.pad(x_btc, ((0, 0), (pad, k - 1 - pad), (0, 0)))
    return sum(xp[:, i : i + t, :] * w_kc[i] for i in range(k)) + b_c


def lax_grouped(x_btc: jax.Array, w_kc: jax.Array, b_c: jax.Array) -> jax.Array:
    """'Same' depthwise convolution with XLA's grouped convolution (the reference)."""
    k = w_kc.shape[0]
    pad = (k - 1) // 2
    y = jax.lax.conv_general_dilated(
        x_btc,
        w_kc[:, None, :],
        (1,),
        [(pad, k - 1 - pad)],
        dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=x_btc.shape[-1],
    )
    return y + b_c


IMPLS = {"blocked_band": depthwise_conv1d, "shifted_sum": shifted_sum, "lax_grouped": lax_grouped}

# (B, T, C, K): the demo's shortest and longest buckets (Conformer dim 144, 25 frames/s
# after x4 subsampling), and a 30 s utterance batch of a 256-wide model with K = 31.
CASES = [(28, 55, 144, 15), (10, 152, 144, 15), (4, 750, 256, 31)]


def time_ms(fn: Callable[..., jax.Array], args: tuple, repeats: int) -> float:
    """Median wall time of `fn(*args)` in ms, after one compiling call."""
    return 1e3 * timing.median_seconds(lambda: jax.block_until_ready(fn(*args)), repeats)


def run_case(b: int, t: int, c: int, k: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((b, t, c)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, c)) / np.sqrt(k), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(c), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((b, t, c)), jnp.float32)
    ref = lax_grouped(x, w, bias)
    row = {"B": b, "T": t, "C": c, "K": k}
    for name, impl in IMPLS.items():
        fwd = jax.jit(impl)
        # A nonlinearity after the convolution, as in the model (LayerNorm, swish): with a
        # purely linear loss XLA folds most of the backward away and times nothing real.
        loss = lambda *a, f=impl: jnp.sum(jnp.tanh(f(*a)) * cot)
        fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        row[f"{name}_max_abs_err"] = float(jnp.max(jnp.abs(fwd(x, w, bias) - ref)))
        row[f"{name}_fwd_ms"] = round(time_ms(fwd, (x, w, bias), repeats), 3)
        row[f"{name}_fwd_bwd_ms"] = round(time_ms(fwd_bwd, (x, w, bias), repeats), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (well under 2 minutes)")
    args = ap.parse_args()
    repeats = 5 if args.quick else 30
    rows = [run_case(*case, repeats=repeats) for case in CASES]
    result = {
        "benchmark": "depthwise_conv",
        **environment.jax_host(),
        "repeats": repeats,
        "cases": rows,
    }
    header = "| B, T, C, K | " + " | ".join(f"{n} fwd / fwd+bwd ms" for n in IMPLS) + " |"
    print(header)
    print("|" + "---|" * (len(IMPLS) + 1))
    for r in rows:
        cells = [f"{r[f'{n}_fwd_ms']:.1f} / {r[f'{n}_fwd_bwd_ms']:.1f}" for n in IMPLS]
        print(f"| {r['B']}, {r['T']}, {r['C']}, {r['K']} | " + " | ".join(cells) + " |")
    errs = max(r[f"{n}_max_abs_err"] for r in rows for n in IMPLS)
    print(f"max |difference| to lax_grouped over all cases: {errs:.1e}")
    results.save_result(os.path.join(RESULTS, "depthwise_conv.json"), result)


if __name__ == "__main__":
    main()
