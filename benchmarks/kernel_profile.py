"""Where a jitted program's device time goes, from a `jax.profiler` Perfetto trace.

`python benchmarks/kernel_profile.py TRACE.json.gz [--module jit_train_step] [--steps 3]
[--top 20] [--out PATH]` reads the trace that `benchmarks/train_step.py --profile DIR`
writes (DIR/<model>-<dtype>/plugins/profile/<time>/perfetto_trace.json.gz: 3 steps), keeps
the device's kernel events of one XLA module, and prints per step: the span (first kernel
start to last kernel end), the busy time (sum of kernel durations), the kernel count, the
time in short kernels (< 5 us: loop bookkeeping and launch-bound work), the share of the
matrix units' kernels (cuBLAS/nvjet/cutlass/Triton GEMMs), and the top kernels by total
time (names without XLA's numeric suffixes). Writes the same as JSON.

Only GPU traces carry kernel events; a CPU trace has none, and the script says so.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import sys

SHORT_US = 5.0
# Kernel names of matrix-unit work on NVIDIA GPUs (cuBLAS's nvjet and cutlass kernels,
# XLA's Triton GEMM fusions).
MATMUL_PATTERN = re.compile(r"gemm|nvjet|cutlass|cublas|sm90_xmma|triton_dot", re.I)


def load_events(path: str) -> list[dict]:
    """The trace's event list (Chrome/Perfetto JSON, gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def device_kernels(events: list[dict], module: str) -> list[dict]:
    """Complete events on a '/device:' process whose args name the XLA module `module`."""
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "/device:" in e.get("args", {}).get("name", "")
    }
    return [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("pid") in devices
        and e.get("args", {}).get("hlo_module") == module
    ]


def kernel_family(name: str) -> str:
    """'loop_add_fusion_34' -> 'loop_add_fusion'; 'copy.1' -> 'copy'."""
    return re.sub(r"([._]\d+)+$", "", name)


def summarize(kernels: list[dict], steps: int, top: int) -> dict:
    """Per-step figures of `steps` traced steps (times in ms per step)."""
    if not kernels:
        raise ValueError("no device kernel events of that module in the trace")
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    total = collections.Counter()
    calls = collections.Counter()
    for e in kernels:
        family = kernel_family(e["name"])
        total[family] += e["dur"]
        calls[family] += 1
    busy = sum(total.values())
    short = sum(e["dur"] for e in kernels if e["dur"] < SHORT_US)
    matmul = sum(v for k, v in total.items() if MATMUL_PATTERN.search(k))
    per_step = 1e3 * steps  # microseconds over `steps` steps -> ms per step
    return {
        "steps": steps,
        "span_ms": (end - start) / per_step,
        "busy_ms": busy / per_step,
        "kernels_per_step": len(kernels) / steps,
        "short_kernels_per_step": sum(e["dur"] < SHORT_US for e in kernels) / steps,
        "short_kernel_ms": short / per_step,
        "matmul_ms": matmul / per_step,
        "matmul_share_of_busy": matmul / busy,
        "top": [
            {"kernel": k, "ms": v / per_step, "calls": calls[k] / steps, "share": v / busy}
            for k, v in total.most_common(top)
        ],
    }


def print_summary(s: dict) -> None:
    print(
        f"per step ({s['steps']} traced): span {s['span_ms']:.1f} ms, kernels busy "
        f"{s['busy_ms']:.1f} ms, {s['kernels_per_step']:.0f} kernels "
        f"({s['short_kernels_per_step']:.0f} under {SHORT_US:g} us: "
        f"{s['short_kernel_ms']:.1f} ms), "
        f"matrix kernels {s['matmul_ms']:.1f} ms ({s['matmul_share_of_busy']:.0%} of busy)"
    )
    print("| kernel (XLA fusion / library kernel) | ms/step | calls/step | share of busy |")
    print("|---|---|---|---|")
    for row in s["top"]:
        print(f"| {row['kernel']} | {row['ms']:.2f} | {row['calls']:.0f} | {row['share']:.1%} |")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="perfetto_trace.json.gz from jax.profiler")
    ap.add_argument("--module", default="jit_train_step", help="XLA module (hlo_module)")
    ap.add_argument("--steps", type=int, default=3, help="steps the trace holds")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--out", default="", help="write the summary as JSON here")
    args = ap.parse_args(argv)
    kernels = device_kernels(load_events(args.trace), args.module)
    if not kernels:
        sys.exit(
            f"{args.trace}: no device kernels of module {args.module!r} "
            "(a CPU trace has none; GPU traces name the module in each kernel's args)"
        )
    summary = summarize(kernels, args.steps, args.top) | {"trace": args.trace}
    print_summary(summary)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"wrote {args.out}")
    return summary


if __name__ == "__main__":
    main()
