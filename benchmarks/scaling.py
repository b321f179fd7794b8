"""Collective bytes per train step for each sharding layout of 8 devices, projected to 1,024.

`python benchmarks/scaling.py [--quick] [--model S|M|L] [--opt-state params|replicated]
[--layouts a,b] [--device-seconds S] [--dump-hlo DIR] [--out PATH]` writes
`benchmarks/results/scaling.json` and prints the measured table and the projection.

1. Measured (XLA's own partitioning, no timing). For each layout of 8 devices over the mesh
   axes (replica, data, fsdp, tensor) -- data parallel (1,8,1,1), FSDP (1,1,8,1), (1,4,2,1),
   (1,2,2,2), (1,1,4,2) and replica x data (2,4,1,1) -- the Conformer-CTC train step of
   `jaxspeech.training.step.make_train_step` (AdamW of `jaxspeech.training.optim`, the
   config's SpecAugment and log-mel front end) is lowered for a fixed global batch with
   ABSTRACT arguments (a `TrainState` of `jax.ShapeDtypeStruct`s carrying the mesh
   shardings, so no parameter is ever initialized and even L compiles on a laptop) and
   compiled for 8 simulated CPU devices.
   Every collective in `compiled.as_text()` is parsed: all-reduce, all-gather,
   reduce-scatter, all-to-all, collective-permute (their async `-start` forms counted once,
   `-done` ignored), with their result shapes and dtypes (tuples summed) and their
   replica-group size n (explicit `{{0,1},{2,3}}`, iota `[a,b]<=[..]` and the
   `mesh['axis_0'=8,...] {'axis_0'}` form). An op inside a while loop with a known trip
   count is counted that many times (the log-mel front end's CPU branch cuts frames in a
   loop); `config.model.conformer.scan_layers = False`, because a collective inside the
   scanned layer stack's while-loop body runs once per layer but appears once in the text.
   Bytes each device sends with ring algorithms, S the op's result bytes:
     all-reduce 2(n-1)/n S, all-gather (n-1)/n S, reduce-scatter (n-1) S (= (n-1)/n of its
     input), all-to-all (n-1)/n S, collective-permute S.
   Reported per layout: collectives by kind, bytes per device per step by kind, parameter
   bytes (float32) and their ratio; the JSON adds bytes by group size and the five
   costliest ops (`--dump-hlo DIR` keeps each layout's HLO text).
   Self-check against the textbook: in pure data parallelism the all-reduce bytes should
   be 2 (n-1)/n = 1.75 x the parameter bytes (one ring all-reduce of the float32
   gradients, plus a few scalars: loss sums, gradient norm). The check also splits the
   all-reduced arrays into parameter-shaped ones (the gradients) and the rest, and names
   the parameters whose gradient was not all-reduced in its own shape, so a failed check
   says which arrays XLA reduces instead (`gradient_accounting`).
   Caveats: these are the CPU compiler's collectives. It runs the same SPMD partitioner
   as the GPU and TPU compilers, but no reduce-scatter appears in its output (FSDP's
   gradients are all-reduced in full, then sliced); the GPU pipeline has a pass that
   rewrites all-reduce + dynamic-slice into reduce-scatter, which sends half as much --
   not verified here (no GPU). The front end's `lax.platform_dependent` also compiles its
   CPU branch here, not the GPU one.
   Optimizer state placement (`--opt-state`): `params` (default) gives every Adam moment
   its parameter's sharding, as FSDP intends (and as `jaxspeech.training.state.init_opt_state`
   lays it out for training); `replicated` measures moments replicated
   on every device, which is what the trainer's `init_opt_state` produced when this
   benchmark was written (its `jit(tx.init)` outputs come back on one device and are then
   replicated), so FSDP there shards parameters but not the moments.
   LLVM code generation runs at -O0 (COMPILER_OPTIONS): the HLO is the same.

2. Projected, not measured: weak scaling (fixed per-device batch) from 8 to 1,024 devices,
   for one step. Compute time per step C = model FLOPs per second of audio (from
   `compiled.cost_analysis()["flops"]` of the unscanned data-parallel step, per device,
   divided by the audio each device processes) x the per-device audio of a step
   (`--device-seconds`, default 800 s: icefall's 8 x 800 s batches, configs/conformer.py)
   / a stated sustained throughput (HARDWARE below). The gradient bytes G are the measured
   data-parallel all-reduce payload (bytes per device / (2 (n-1)/n)). Ring all-reduce over
   N devices: t = 2(N-1)/N G / bw + 2(N-1) latency, with
     flat: one ring over all N devices (NCCL-style, one ring crossing per node per
       channel: bw = min(per-GPU intra-node bw, per-node inter-node bw) once N > 8);
     hierarchical (the replica layout: data inside a node of 8, replica across nodes):
       reduce-scatter in the node, all-reduce of each GPU's 1/8 across the N/8 nodes,
       all-gather in the node, each stage with the ring formula on its own links.
     periodic averaging (BMUF-style, the references' block of 100 steps): the flat
       all-reduce once every 100 steps (its accuracy cost is not modelled).
   Step time T(N) = C + max(0, comm(N) - OVERLAP C): gradient communication can hide
   behind the backward pass for a fraction OVERLAP of the step's compute. Speedup =
   N C / T(N) against one device without communication; efficiency = speedup / N.
   The printed comparison puts this next to the references' measured speedups (IBM's
   H-ADPSGD 40x on 64 V100s; Amazon's GTC 16.8x on 64 K80s and BMUF 97.6x on 128), which
   were LSTMs on other hardware and software: the same model of costs, not the same
   experiment. Goal (printed, never asserted): near-linear 8 -> 1,024 (efficiency >= 0.9).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # 8 simulated CPU devices; must precede the first jax import
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import math
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `configs` and `jaxspeech` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import cost_model, environment, hlo, lowering, results  # noqa: E402
from jaxspeech.config import build  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")

# (replica, data, fsdp, tensor) layouts of 8 devices.
LAYOUTS = {
    "data": (1, 8, 1, 1),
    "fsdp": (1, 1, 8, 1),
    "data4_fsdp2": (1, 4, 2, 1),
    "data2_fsdp2_tensor2": (1, 2, 2, 2),
    "fsdp4_tensor2": (1, 1, 4, 2),
    "replica2_data4": (2, 4, 1, 1),
}
QUICK_LAYOUTS = ("data", "fsdp", "replica2_data4")

# Global batch (utterances, seconds each) and vocabulary. S/M/L: 16 x 8 s at 16 kHz with a
# BPE-500 vocabulary and labels padded to 10 tokens/s (configs/conformer.py); --quick: the
# demo's tiny model on 8 x 1 s with 32 symbols.
BATCH = {"full": (16, 8.0, 500), "quick": (8, 1.0, 32)}
# The references' measured speedups over one GPU: (method, devices, speedup, source).
REFERENCES = (
    ("GTC (threshold-compressed gradients), K80", 64, 16.76, "Amazon, Table I"),
    ("BMUF-NBM (block 100), K80", 64, 50.91, "Amazon, Table I"),
    ("BMUF-NBM (block 100), K80", 128, 97.59, "Amazon, Table I"),
    ("H-ADPSGD, V100, 100 Gb/s Ethernet", 64, 40.0, "IBM"),
)


# =======================================================================================
# Building and compiling the train step (needs jax; 8 devices).
# =======================================================================================
def make_config(model: str, quick: bool):
    from configs import conformer, demo

    config = demo.get_config("tiny") if quick else conformer.get_config(model)
    config.model.head = "ctc"
    config.model.conformer.scan_layers = False  # see the module docstring
    return config


def compile_layout(config, shape: tuple[int, ...], batch_spec, opt_state: str) -> dict:
    """Lowers and compiles the train step on one (replica, data, fsdp, tensor) layout with
    abstract arguments (`lowering.compile_train_step`); returns the HLO text, FLOPs and
    parameter bytes."""
    import jax

    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    mesh = build.mesh_from_config(config, devices=jax.devices()[: math.prod(shape)])
    compiled, params, compile_s = lowering.compile_train_step(config, mesh, batch_spec, opt_state)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    leaves = jax.tree.leaves(params)
    return {
        "param_shapes": [(hlo.hlo_dtype(x.dtype), tuple(x.shape)) for x in leaves],
        "hlo": compiled.as_text(),
        "flops_per_device": float(cost.get("flops", 0.0)) if cost else 0.0,
        "param_count": int(sum(x.size for x in leaves)),
        "param_bytes": float(sum(x.size * x.dtype.itemsize for x in leaves)),
        "compile_s": compile_s,
    }


# =======================================================================================
# Driver.
# =======================================================================================
def measure(
    config, layouts: dict, batch_spec, opt_state: str, dump_dir: str | None = None
) -> list[dict]:
    rows = []
    for name, shape in layouts.items():
        row: dict = {"layout": name, "replica_data_fsdp_tensor": list(shape)}
        try:
            got = compile_layout(config, shape, batch_spec, opt_state)
            hlo_text = got.pop("hlo")
            if dump_dir:
                os.makedirs(dump_dir, exist_ok=True)
                with open(os.path.join(dump_dir, f"{name}.hlo.txt"), "w") as f:
                    f.write(hlo_text)
            ops = hlo.parse_collectives(hlo_text)
            summary = hlo.summarize(ops)
        except Exception as e:  # noqa: BLE001 - a layout that fails is reported, not fixed
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{name}: FAILED {row['error'][:300]}", flush=True)
            rows.append(row)
            continue
        param_shapes = got.pop("param_shapes")
        row |= got | summary
        row["bytes_per_param_byte"] = summary["bytes"] / got["param_bytes"]
        row["all_reduce_arrays"] = hlo.gradient_accounting(ops, param_shapes)
        row["largest_ops"] = [
            {k: o[k] for k in ("kind", "group_size", "bytes", "executions")}
            | {"ring_bytes_per_step": hlo.ring_bytes(o) * o["executions"]}
            | {
                "shapes": [f"{d}{list(s)}" for d, s in o["shapes"]][:4]
                + ["..."] * (len(o["shapes"]) > 4)
            }
            for o in sorted(ops, key=lambda o: -hlo.ring_bytes(o) * o["executions"])[:5]
        ]
        rows.append(row)
        print(
            f"{name} {shape}: {sum(summary['ops'].values())} collectives, "
            f"{summary['bytes'] / 2**20:.2f} MiB/device, compile {got['compile_s']:.0f} s",
            flush=True,
        )
    return rows


def _mib(x: float) -> str:
    return f"{x / 2**20:.2f}"


def print_measured(rows: list[dict], n: int) -> None:
    print(
        "\n| layout (replica, data, fsdp, tensor) | collectives AR / AG / RS / A2A / CP "
        "| MiB sent per device per step: AR / AG / RS / A2A / CP | total MiB "
        "| / parameter bytes |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        label = f"{r['layout']} {tuple(r['replica_data_fsdp_tensor'])}"
        if "error" in r:
            print(f"| {label} | failed: {r['error'][:120]} | | | |")
            continue
        counts = " / ".join(str(r["ops"].get(k, 0)) for k in hlo.KINDS)
        kinds = " / ".join(_mib(r["bytes_by_kind"].get(k, 0.0)) for k in hlo.KINDS)
        print(
            f"| {label} | {counts} | {kinds} | {_mib(r['bytes'])} "
            f"| {r['bytes_per_param_byte']:.2f} |"
        )
    ok = [r for r in rows if "error" not in r]
    if ok:
        print(
            f"parameters: {ok[0]['param_count'] / 1e6:.2f}M, {_mib(ok[0]['param_bytes'])} MiB "
            "float32"
        )
    data = next((r for r in ok if r["layout"] == "data"), None)
    if data is None:
        return
    want = 2 * (n - 1) / n
    acc = data["all_reduce_arrays"]
    ar_ratio = data["bytes_by_kind"].get("all-reduce", 0.0) / data["param_bytes"]
    grads_seen = acc["param_shaped_bytes"] / acc["param_bytes"]
    print(
        f"\nself-check, data parallel (textbook: one ring all-reduce of the float32 gradients, "
        f"2(n-1)/n = {want:.3f} x parameter bytes):\n"
        f"  all-reduce bytes / parameter bytes = {ar_ratio:.3f} "
        f"({'PASS' if abs(ar_ratio / want - 1) < 0.05 else 'FAIL'} at 5%); all collectives: "
        f"{data['bytes_per_param_byte']:.3f}\n"
        f"  parameter-shaped arrays all-reduced: {grads_seen:.3f} of the parameter bytes; "
        f"other all-reduced arrays: {_mib(acc['other_bytes'])} MiB"
    )
    if acc["other"]:
        print(
            "  largest other all-reduced arrays (bytes per step): "
            + ", ".join(f"{k} {_mib(b)} MiB" for k, b in acc["other"][:4])
        )
    if acc["missing"]:
        print(
            "  parameters without a same-shaped all-reduce: "
            + ", ".join(f"{k} x{c}" for k, c in acc["missing"][:4])
        )
    big = [o for o in data["largest_ops"] if o["kind"] != "all-reduce"]
    for o in big[:2]:
        print(
            f"  also: {o['kind']} of {o['shapes'][0]} x {o['executions']} executions, "
            f"{_mib(o['ring_bytes_per_step'])} MiB per step"
        )


def print_projection(projection: dict, meta: dict) -> None:
    for hw_name, per_scheme in projection.items():
        hw = cost_model.HARDWARE[hw_name]
        print(
            f"\nprojection (not measured), {hw['label']}; compute "
            f"{meta['compute_ms'][hw_name]:.2f} ms per step ({meta['device_seconds_per_step']:.0f} "
            f"s of audio per device), gradients {_mib(meta['grad_bytes'])} MiB, "
            f"overlap {cost_model.OVERLAP}"
        )
        print(
            "| scheme | "
            + " | ".join(f"N={n}: speedup (eff.)" for n in cost_model.PROJECT_N)
            + " |"
        )
        print("|---|" + "---|" * len(cost_model.PROJECT_N))
        for scheme, rows in per_scheme.items():
            cells = [f"{r['speedup']:.1f}x ({r['efficiency']:.2f})" for r in rows]
            print(f"| {scheme} | " + " | ".join(cells) + " |")
    print("\naudio seconds per device per step needed for efficiency 0.9 (projection):")
    print("| hardware, scheme | " + " | ".join(f"N={n}" for n in cost_model.PROJECT_N) + " |")
    print("|---|" + "---|" * len(cost_model.PROJECT_N))
    for hw_name, per_scheme in meta["seconds_for_0.9"].items():
        for scheme, cells in per_scheme.items():
            print(f"| {hw_name}, {scheme} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    print("\nreferences (measured on their clusters, LSTM acoustic models, vs 1 GPU):")
    for method, n, speedup, source in REFERENCES:
        print(f"  {method}: {speedup}x on {n} ({speedup / n:.2f} efficiency) - {source}")


def projection_for(data: dict, batch_spec, device_seconds: float) -> tuple[dict, dict]:
    """The projection from the measured data-parallel step: (results, method)."""
    # Gradient payload: the arrays the data-parallel step all-reduces (ring bytes / factor).
    grad_bytes = data["bytes_by_kind"].get("all-reduce", 0.0) / (2 * 7 / 8)
    audio_per_device = batch_spec[0] * batch_spec[1] / 8
    flops_per_audio_s = data["flops_per_device"] / audio_per_device
    compute = {
        k: flops_per_audio_s * device_seconds / hw["flops_per_s"]
        for k, hw in cost_model.HARDWARE.items()
    }
    projected = {
        k: cost_model.project(compute[k], grad_bytes, cost_model.HARDWARE[k])
        for k in cost_model.HARDWARE
    }
    seconds = {
        k: {
            scheme: [
                cost_model.compute_for_efficiency(cost_model.comm_time(scheme, grad_bytes, n, hw))
                * hw["flops_per_s"]
                / flops_per_audio_s
                for n in cost_model.PROJECT_N
            ]
            for scheme in projected[k]
        }
        for k, hw in cost_model.HARDWARE.items()
    }
    method = {
        "grad_bytes": grad_bytes,
        "grad_bytes_source": "data-parallel step's all-reduce bytes / (2 (n-1)/n), n = 8",
        "param_bytes": data["param_bytes"],
        "flops_per_device_step": data["flops_per_device"],
        "flops_per_audio_second": flops_per_audio_s,
        "device_seconds_per_step": device_seconds,
        "compute_ms": {k: 1e3 * v for k, v in compute.items()},
        "seconds_for_0.9": seconds,
        "overlap": cost_model.OVERLAP,
        "average_every": cost_model.AVERAGE_EVERY,
        "node": cost_model.NODE,
        "hardware": cost_model.HARDWARE,
        "step_time": "C + max(0, comm - overlap C); speedup N C / T; ring all-reduce "
        "2(N-1)/N G / bw + 2(N-1) latency",
    }
    return projected, method


def run(
    model: str,
    quick: bool,
    out: str,
    opt_state: str,
    device_seconds: float,
    dump_dir: str | None = None,
    layout_names: tuple[str, ...] | None = None,
) -> dict:
    import jax

    n_dev = len(jax.devices())
    if n_dev < 8:
        raise SystemExit(f"needs 8 devices, found {n_dev}; set XLA_FLAGS before jax starts")
    load_at_start = environment.load_avg_1m()
    t0 = time.perf_counter()
    config = make_config(model, quick)
    batch_spec = BATCH["quick" if quick else "full"]
    names = layout_names or (QUICK_LAYOUTS if quick else tuple(LAYOUTS))
    layouts = {k: LAYOUTS[k] for k in names}
    rows = measure(config, layouts, batch_spec, opt_state, dump_dir)
    print_measured(rows, 8)
    device = jax.devices()[0]
    result: dict = {
        "benchmark": "scaling",
        "device": environment.device_label(device),
        "num_devices": n_dev,
        "cpu_count": os.cpu_count(),
        "machine": environment.machine(),
        "jax": jax.__version__,
        "date": environment.utc_date(),
        "load_avg_1m_at_start": load_at_start,
        "model": "demo:tiny" if quick else f"conformer:{model}",
        "head": "ctc",
        "scan_layers": False,
        "opt_state": opt_state,
        "compiler_options": lowering.COMPILER_OPTIONS,
        "global_batch": {
            "utterances": batch_spec[0],
            "seconds": batch_spec[1],
            "vocab": batch_spec[2],
        },
        "bytes_method": "ring: all-reduce 2(n-1)/n S, all-gather (n-1)/n S, reduce-scatter "
        "(n-1) S_out, all-to-all (n-1)/n S, collective-permute S; S = result bytes; "
        "while-loop bodies x known trip count",
        "layouts": rows,
    }
    data = next((r for r in rows if r["layout"] == "data" and "error" not in r), None)
    if data is not None:
        ar = data["bytes_by_kind"].get("all-reduce", 0.0) / data["param_bytes"]
        result["self_check"] = {
            "all_reduce_bytes_per_param_byte": ar,
            "all_bytes_per_param_byte": data["bytes_per_param_byte"],
            "textbook": 2 * 7 / 8,
            "pass": abs(ar / (2 * 7 / 8) - 1) < 0.05,
        }
        projected, method = projection_for(data, batch_spec, device_seconds)
        print(
            f"\nFLOPs per second of audio (XLA cost analysis of the unscanned data-parallel "
            f"step, per device): {method['flops_per_audio_second'] / 1e9:.2f} GFLOP"
        )
        print_projection(projected, method)
        result["projection"] = {"method": method, "results": projected}
        result["references"] = [
            {"method": m, "devices": n, "speedup": s, "source": src} for m, n, s, src in REFERENCES
        ]
        eff = {k: projected[k]["hierarchical"][-1]["efficiency"] for k in projected}
        print(
            "goal: near-linear 8 -> 1,024 (efficiency >= 0.9), hierarchical, projected: "
            + ", ".join(f"{k} {e:.2f} {'PASS' if e >= 0.9 else 'FAIL'}" for k, e in eff.items())
        )
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    results.write_json(out, result)
    print(f"wrote {out} ({result['wall_s']} s)")
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the demo's tiny model, 3 layouts")
    ap.add_argument("--model", default="S", choices=("S", "M", "L"))
    ap.add_argument("--opt-state", default="params", choices=("params", "replicated"))
    ap.add_argument(
        "--device-seconds",
        type=float,
        default=800.0,
        help="audio seconds per device per step in the projection",
    )
    ap.add_argument("--out", default=os.path.join(RESULTS, "scaling.json"))
    ap.add_argument("--dump-hlo", default=None, help="write each layout's compiled HLO here")
    ap.add_argument(
        "--layouts",
        default=None,
        help=f"comma-separated subset of {','.join(LAYOUTS)} (default: all; --quick: "
        f"{','.join(QUICK_LAYOUTS)})",
    )
    args = ap.parse_args(argv)
    names = tuple(args.layouts.split(",")) if args.layouts else None
    unknown = [n for n in names or () if n not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; choose from {list(LAYOUTS)}")
    return run(
        args.model,
        args.quick,
        args.out,
        args.opt_state,
        args.device_seconds,
        args.dump_hlo,
        names,
    )


if __name__ == "__main__":
    main()
