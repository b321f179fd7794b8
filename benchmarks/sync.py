"""Sync strategies side by side: dev CER, bytes each device sends per step, wall time.

`python benchmarks/sync.py [--steps 1350] [--strategies allreduce,bmuf,...] [--workdir
runs/sync] [--out benchmarks/results/sync.json] [--bytes-only] [--run-minutes M]` merges
the strategies it ran into `benchmarks/results/sync.json` (the others' rows stay) and
prints the table of every strategy the file holds, for benchmarks/README.md.

One strategy's run at the demo's full budget takes an hour or more on 2 cores, so the
benchmark runs in pieces: `--strategies gtc --run-minutes 50` trains at most 50 minutes
(checkpointing every 100 steps and at the end) and exits; the same command resumes the
run where it stopped, and once the run has finished it is evaluated and its row merged.

1. Training (measured). The demo recipe (configs/demo.py: corpus data/demo/shards, model,
   seed 0, 64 s global batches) for `--steps` steps, on 4 simulated CPU devices in one
   process, once per strategy: allreduce (4-way data parallel), bmuf, gtc and gossip with
   4 learners (mesh.data = 4, one device each), hierarchical with 2 replicas of 2 devices
   (gossip across the replicas; inside a replica the model is sharded over fsdp = 2, so
   each device sends only its half across, and its gradients are reduced inside). Each run is
   `python -m jaxspeech.train` with `--config.sync.*` flags, evaluated on dev (greedy CTC)
   at its last step; a finished run directory is reused (its figures are kept in
   RUN/bench.json). The 4 devices share the machine's cores: wall time measures the
   strategies' extra work, not their communication (there is no network here).
2. Bytes (measured and computed). For each strategy the same training step is compiled
   for the 4-device mesh and every collective of the compiled HLO is parsed with
   scaling.py's parser, benchmarks/lib/hlo.py (ring bytes per device; BMUF's block update
   runs in a conditional branch every `block_steps` steps, so those ops count
   1/block_steps). Next to it: the strategy's payload arithmetic
   (`jaxspeech.parallel.sync.payload_bytes`, what TensorBoard shows as
   sync/bytes_per_step), which counts only the learners' exchange.
3. Projection (not measured). Each strategy's payload, as a share of the all-reduced
   gradient bytes measured here, applied to benchmarks/results/scaling.json's
   Conformer-S gradient bytes and compute per step, with that script's cost model
   (benchmarks/lib/cost_model.py: ring algorithms, nodes of 8, overlap 0.5), from 8 to 1,024
   devices:
     allreduce: scaling.py's flat and hierarchical rings;
     bmuf: the hierarchical all-reduce once every block_steps steps;
     gtc: an all-gather of every learner's message (grows with N: (N-1) m);
     gossip: two neighbour exchanges of the full model per step (flat ring links);
     hierarchical (fsdp inside a node, gossip across nodes): the node's FSDP
       reduce-scatter + all-gather, and 2 exchanges of the node's model over its NICs.
   at each `--device-seconds` (800 s: icefall's batches, compute-bound; 50 s: a small
   per-device batch, where communication shows).
   Goals (printed, never asserted): GTC payload <= 1% of dense at dev CER within 10%
   relative of all-reduce; BMUF communication / block_steps at CER within 10% relative.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # simulated CPU devices; must precede the first jax import
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=4"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import json
import math
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.lib import cost_model, environment, hlo, lowering, results  # noqa: E402
from jaxspeech.config import build  # noqa: E402
from jaxspeech.runs import events  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
DEVICES = 4  # simulated CPU devices (set above, before jax starts)
BLOCK_STEPS = 8

# name -> (mesh (replica, data, fsdp, tensor), --config.sync.* settings)
STRATEGIES = {
    "allreduce": ((1, 4, 1, 1), {"strategy": "allreduce"}),
    # The reference's block momentum 1 - 1/N (eta 0.75 here), gain 1 (zeta 0.143).
    "bmuf": (
        (1, 4, 1, 1),
        {"strategy": "bmuf", "block_steps": BLOCK_STEPS, "block_momentum": -1.0},
    ),
    "gtc": (
        (1, 4, 1, 1),
        {
            "strategy": "gtc",
            "gtc_density": 0.002,
            "gtc_capacity": 0.004,
            "gtc_values": "sign",
            "gtc_dense_steps": 0,
        },
    ),
    "gossip": ((1, 4, 1, 1), {"strategy": "gossip"}),
    # fsdp inside a replica: each device sends only its shard of the model across
    "hierarchical": ((2, 1, 2, 1), {"strategy": "hierarchical", "outer": "gossip"}),
    # Variants aimed at the accuracy goals at the demo's budget. BMUF with a block step of
    # twice the learners' mean move; GTC at twice the density (payload still <= 1%) after
    # 200 dense (all-reduce) steps, as the reference compressed an already trained model.
    "bmuf_gain2": (
        (1, 4, 1, 1),
        {"strategy": "bmuf", "block_steps": BLOCK_STEPS, "block_momentum": -1.0, "block_gain": 2.0},
    ),
    # BMUF as plain block-wise model averaging (eta 0, zeta 1: sync.block_momentum's
    # default since it measured best): no block momentum, whose lag the gain-1 and gain-2
    # rows pay for with AdamW learners.
    "bmuf_avg": (
        (1, 4, 1, 1),
        {
            "strategy": "bmuf",
            "block_steps": BLOCK_STEPS,
            "block_momentum": 0.0,
            "block_lr": 1.0,
            "nesterov": False,
        },
    ),
    # BMUF after 200 steps of averaging every step (sync.block_dense_steps), as gtc_warm.
    "bmuf_warm": (
        (1, 4, 1, 1),
        {
            "strategy": "bmuf",
            "block_steps": BLOCK_STEPS,
            "block_momentum": -1.0,
            "block_dense_steps": 200,
        },
    ),
    "gtc_warm": (
        (1, 4, 1, 1),
        {
            "strategy": "gtc",
            "gtc_density": 0.004,
            "gtc_capacity": 0.0048,
            "gtc_values": "sign",
            "gtc_dense_steps": 200,
        },
    ),
}
BASE = ("allreduce", "bmuf", "gtc", "gossip", "hierarchical")  # the default --strategies


def base_strategy(name: str) -> str:
    """A row's strategy (a variant's base strategy)."""
    return STRATEGIES[name][1]["strategy"]


def sync_flags(shape, settings: dict) -> list[str]:
    out = [f"--config.mesh.{a}={n}" for a, n in zip(("replica", "data", "fsdp", "tensor"), shape)]
    return out + [f"--config.sync.{k}={v}" for k, v in settings.items()]


# ------------------------------------------------------------------ 1. training
def train(name: str, steps: int, workdir: str, run_minutes: float = 0.0) -> dict | None:
    """Train (or reuse, or resume) one strategy's run; returns its figures, or None when
    `run_minutes` ran out before the run finished (rerun to resume)."""
    run = os.path.join(workdir, name)
    figures_path = os.path.join(run, "bench.json")
    if os.path.exists(figures_path):
        with open(figures_path) as f:
            figures = json.load(f)
        if figures.get("steps") == steps and figures.get("mesh") == list(STRATEGIES[name][0]):
            print(f"{name}: reusing {run}", flush=True)
            return figures
    shape, settings = STRATEGIES[name]
    cmd = [
        sys.executable,
        "-m",
        "jaxspeech.train",
        "--config",
        os.path.join(ROOT, "configs", "demo.py"),
        "--workdir",
        run,
        f"--config.train.num_steps={steps}",
        "--config.train.checkpoint_every=100",  # a killed or timed-out piece resumes
        "--config.monitor.samples_every=0",
        *sync_flags(shape, settings),
    ]
    if run_minutes > 0:
        # ~1.2 s per step on 4 simulated devices (all-reduce; adaptive GTC ~4.7 s): a
        # conservative step count for the time given, then a checkpoint and a clean exit.
        per_step = 4.7 if base_strategy(name) == "gtc" and settings.get("gtc_density") else 1.5
        cmd.append(f"--config.train.run_steps={max(1, int(60 * run_minutes / per_step))}")
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    env["JAX_PLATFORMS"] = "cpu"
    print(f"{name}: training {steps} steps in {run}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")

    finished = [e for e in events.read_events(run) if e["event"] == "finished"]
    if not finished:
        print(f"{name}: stopped after {run_minutes:g} min; rerun to resume", flush=True)
        return None
    finished = finished[-1]
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    # A resumed piece re-logs no step twice, but keep the last row per step to be safe.
    by_step = {r["step"]: r for r in rows if "train/loss" in r}
    train_rows = [by_step[k] for k in sorted(by_step)]
    compute_s = sum(r.get("perf/seconds_compute", 0.0) for r in train_rows)
    figures = {
        "steps": steps,
        "mesh": list(shape),
        "settings": settings,
        "dev_wer": finished["wer"],
        "dev_cer": finished["cer"],
        "final_train_loss": train_rows[-1]["train/loss"],
        "wall_s": round(wall, 1),
        "step_compute_ms": round(1000 * compute_s / steps, 1),
        "logged_bytes_per_step": train_rows[-1].get("sync/bytes_per_step"),
        "logged_gtc_density": train_rows[-1].get("sync/gtc_density"),
        "gtc_overflow_total": sum(r.get("sync/gtc_overflow", 0.0) for r in train_rows) or None,
        # the curve: (step, per-token train loss, CTC loss) at every logged step
        "curve": [
            [r["step"], round(r["train/loss"], 4), round(r.get("train/loss_ctc", 0.0), 4)]
            for r in train_rows
        ],
    }
    with open(figures_path, "w") as f:
        json.dump(figures, f, indent=1)
    print(f"{name}: dev CER {figures['dev_cer']:.2%}, {wall / 60:.1f} min", flush=True)
    return figures


# ------------------------------------------------------------------ 2. bytes
def compiled_bytes(name: str) -> dict:
    """The strategy's training step compiled for the 4-device mesh: ring bytes per device
    per step from its collectives, and the payload arithmetic."""
    import jax
    import numpy as np

    from configs import demo
    from jaxspeech.parallel import rules, sync
    from jaxspeech.training import state as state_lib
    from jaxspeech.training import step as step_lib

    shape, settings = STRATEGIES[name]
    config = demo.get_config()
    config.model.conformer.scan_layers = False  # collectives in a scanned body count once
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    # The steady state's exchange (a dense warm-up's all-reduce steps are not counted).
    config.sync.update({k: v for k, v in settings.items() if k != "gtc_dense_steps"})
    vocab = 32
    mesh = build.mesh_from_config(config, devices=jax.devices()[: math.prod(shape)])
    bins = config.features.num_mel_bins
    with rules.axis_rules(build.rules_from_config(config)):
        state, setup = state_lib.init_train_state(
            config, vocab, mesh, np.zeros(bins), np.ones(bins)
        )
        strategy = setup.strategy
        step = step_lib.jit_train_step(
            setup,
            step_lib.make_train_step(
                setup.spec.graphdef,
                setup.tx,
                0,
                0,
                config.loss,
                strategy=strategy,
                param_shardings=setup.spec.param_shardings,
            ),
        )
        batch = lowering.abstract_batch(mesh, 16, 4.0, config)
        with jax.set_mesh(mesh):
            lowered = step.lower(state, batch)
            hlo_text = lowered.compile(compiler_options=lowering.COMPILER_OPTIONS).as_text()
        payload = sync.payload_bytes(strategy, state.params, setup.spec.param_shardings, mesh)
    ops = hlo.parse_collectives(hlo_text)
    every = strategy.block_steps if strategy.method == "bmuf" else 1
    by_kind: dict = {}
    for op in ops:
        per_step = hlo.ring_bytes(op) * op["executions"]
        if "conditional_branch" in op["flags"]:
            per_step /= every  # BMUF's block update: once every block_steps steps
        by_kind[op["kind"]] = by_kind.get(op["kind"], 0.0) + per_step
    param_bytes = float(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)))
    return {
        "measured_bytes_per_step": sum(by_kind.values()),
        "measured_by_kind": by_kind,
        "payload": payload,
        "param_bytes": param_bytes,
        # all-reduce: the same replica x data groups, for the table
        "learners": strategy.num_learners if strategy.has_state else math.prod(shape[:2]),
        "describe": sync.describe(strategy, payload),
    }


# ------------------------------------------------------------------ 3. projection
def comm_time(name: str, share: float, grad_bytes: float, n: int, hw: dict) -> float:
    """Seconds of one step's communication on n devices (see the module docstring);
    `share`: the strategy's measured payload / the measured all-reduce payload."""
    flat_bw = hw["intra_bw"] if n <= cost_model.NODE else min(hw["intra_bw"], hw["inter_bw"])
    flat_lat = hw["intra_latency"] if n <= cost_model.NODE else hw["inter_latency"]
    if name == "allreduce":
        return cost_model.comm_time("hierarchical", grad_bytes, n, hw)
    if name == "bmuf":
        return cost_model.comm_time("hierarchical", grad_bytes, n, hw) / BLOCK_STEPS
    if name == "gtc":
        # the measured 4-learner payload is (4 - 1) messages: one message m, then (n - 1) m
        message = share * cost_model.ring_allreduce_time(grad_bytes, 4, 1.0, 0.0) / 3
        return (n - 1) * message / flat_bw + (n - 1) * flat_lat
    if name == "gossip":
        return 2 * grad_bytes / flat_bw + 2 * flat_lat
    if name == "hierarchical":
        local = min(n, cost_model.NODE)
        inner = 2 * cost_model.ring_half_time(
            grad_bytes, local, hw["intra_bw"], hw["intra_latency"]
        )
        if n <= cost_model.NODE:
            return inner
        return inner + 2 * grad_bytes / hw["inter_bw"] + 2 * hw["inter_latency"]
    raise ValueError(name)


def projection(shares: dict, device_seconds: float) -> dict:
    """{hardware: {strategy: [{n, comm_ms, efficiency}]}} from scaling.json's model, with
    `device_seconds` of audio per device per step."""
    path = os.path.join(RESULTS, "scaling.json")
    with open(path) as f:
        method = json.load(f)["projection"]["method"]
    grad_bytes = method["grad_bytes"]
    out = {}
    for hw_name, hw in cost_model.HARDWARE.items():
        compute = method["flops_per_audio_second"] * device_seconds / hw["flops_per_s"]
        per = {}
        for name, share in shares.items():
            rows = []
            for n in cost_model.PROJECT_N:
                comm = comm_time(base_strategy(name), share, grad_bytes, n, hw)
                step = compute + max(0.0, comm - cost_model.OVERLAP * compute)
                rows.append({"n": n, "comm_ms": 1e3 * comm, "efficiency": compute / step})
            per[name] = rows
        out[hw_name] = per
    return {
        "from": "benchmarks/results/scaling.json (Conformer-S)",
        "grad_bytes": grad_bytes,
        "device_seconds": device_seconds,
        "rows": out,
    }


# ------------------------------------------------------------------ driver
def print_table(rows: dict) -> None:
    base = rows.get("allreduce", {})
    print(
        "\n| strategy | learners | dev CER | dev WER | CER vs allreduce | bytes/device/step "
        "measured (compiled) | payload arithmetic | payload / all-reduce | wall min |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        t, b = r.get("train", {}), r["bytes"]
        rel = (
            f"{t['dev_cer'] / base['train']['dev_cer'] - 1:+.1%}" if t and base.get("train") else ""
        )
        cer = f"{t['dev_cer']:.2%}" if t else "-"
        wer = f"{t['dev_wer']:.2%}" if t else "-"
        wall = f"{t['wall_s'] / 60:.1f}" if t else "-"
        print(
            f"| {name} | {b['learners']} | {cer} | {wer} | {rel} "
            f"| {b['measured_bytes_per_step'] / 1024:.1f} KiB "
            f"| {b['payload']['bytes_per_step'] / 1024:.1f} KiB "
            f"| {r['payload_share']:.2%} | {wall} |"
        )


def print_projection(proj: dict) -> None:
    for hw_name, per in proj["rows"].items():
        print(
            f"\nprojected efficiency (not measured), {proj['device_seconds']:g} s of audio per "
            f"device per step, {cost_model.HARDWARE[hw_name]['label']}:"
        )
        print("| strategy | " + " | ".join(f"N={n}" for n in cost_model.PROJECT_N) + " |")
        print("|---|" + "---|" * len(cost_model.PROJECT_N))
        for name, cells in per.items():
            print(f"| {name} | " + " | ".join(f"{c['efficiency']:.2f}" for c in cells) + " |")


def load_rows(out: str, steps: int) -> dict:
    """The strategies' rows of an earlier result file (empty if there is none); a training
    figure of another step budget is dropped (not comparable), its bytes are kept."""
    if not os.path.exists(out):
        return {}
    with open(out) as f:
        rows = json.load(f)["strategies"]
    for row in rows.values():
        if row.get("train", {}).get("steps") != steps:
            row.pop("train", None)
    return {n: {k: v for k, v in r.items() if k != "mesh"} for n, r in rows.items()}


def run(
    names,
    steps: int,
    workdir: str,
    out: str,
    bytes_only: bool,
    device_seconds: tuple,
    run_minutes: float = 0.0,
) -> dict:
    import jax

    t0 = time.perf_counter()
    rows = load_rows(out, steps)  # what earlier invocations measured: merged, not overwritten
    for name in names:
        rows[name] = {"bytes": compiled_bytes(name)} | (
            {"train": rows[name]["train"]} if "train" in rows.get(name, {}) else {}
        )
        print(rows[name]["bytes"]["describe"], flush=True)
    for name in rows:  # against the all-reduce over the same learners' devices
        payload = rows[name]["bytes"]["payload"]
        rows[name]["payload_share"] = payload["bytes_per_step"] / payload["dense_bytes_per_step"]
    if not bytes_only:
        for name in names:
            figures = train(name, steps, workdir, run_minutes)
            if figures is not None:
                rows[name]["train"] = figures
            else:
                rows[name].pop("train", None)  # an unfinished run has no row yet
    rows = {n: rows[n] for n in STRATEGIES if n in rows}
    print_table(rows)
    shares = {n: r["payload_share"] for n, r in rows.items()}
    proj = [projection(shares, s) for s in device_seconds]
    for p in proj:
        print_projection(p)
    if "train" in rows.get("allreduce", {}):
        cer = rows["allreduce"]["train"]["dev_cer"]
        limits = {"gtc": 0.01, "bmuf": 1.0 / BLOCK_STEPS}
        for name in [n for n in rows if base_strategy(n) in limits]:
            limit = limits[base_strategy(name)]
            if "train" in rows[name]:
                r = rows[name]
                rel = r["train"]["dev_cer"] / cer - 1
                ok = r["payload_share"] <= limit + 1e-9 and rel <= 0.10
                print(
                    f"goal {name}: payload {r['payload_share']:.2%} of dense (<= {limit:.2%}) "
                    f"at dev CER {rel:+.1%} relative (<= +10%): {'PASS' if ok else 'FAIL'}"
                )
    device = jax.devices()[0]
    result = {
        "benchmark": "sync",
        "device": f"{environment.device_label(device)} x {DEVICES} (simulated)",
        "cpu_count": os.cpu_count(),
        "machine": environment.machine(),
        "jax": jax.__version__,
        "date": environment.utc_date(),
        "recipe": "configs/demo.py, seed 0, dev split, greedy CTC; steps per strategy in its row",
        "strategies": {n: {"mesh": list(STRATEGIES[n][0])} | rows[n] for n in rows},
        "projection": proj,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    # atomic: a kill mid-write never loses the other strategies' rows
    results.write_json(out, result, atomic=True)
    print(f"wrote {out} ({result['wall_s']} s)")
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1350, help="the demo's full budget")
    ap.add_argument("--strategies", default=",".join(BASE), help=f"of {', '.join(STRATEGIES)}")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "runs", "sync"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "sync.json"))
    ap.add_argument("--bytes-only", action="store_true", help="compile and count; no training")
    ap.add_argument(
        "--device-seconds",
        default="800,50",
        help="audio seconds per device per step in the projections (comma-separated)",
    )
    ap.add_argument(
        "--run-minutes",
        type=float,
        default=0.0,
        help="train each named strategy at most about this long, then stop (rerun resumes)",
    )
    args = ap.parse_args(argv)
    names = tuple(args.strategies.split(","))
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        ap.error(f"unknown strategies {unknown}; choose from {list(STRATEGIES)}")
    ap_minutes = args.run_minutes
    seconds = tuple(float(x) for x in args.device_seconds.split(","))
    return run(names, args.steps, args.workdir, args.out, args.bytes_only, seconds, ap_minutes)


if __name__ == "__main__":
    main()
