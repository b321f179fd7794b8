"""Train step of the Conformer S and M transducers: step time, audio seconds/s and MFU.

`python benchmarks/train_step.py [--quick] [--models S,M] [--dtype float32|bfloat16]
[--batch B] [--seconds S] [--repeats N] [--peak_tflops X] [--set KEY=VALUE ...] [--peer
[--peer_python PY]] [--out PATH]` prints a table and writes `benchmarks/results/train_step.json`.
`--set` changes a config entry of every model (e.g. `--set model.head=ctc` times the step
without the transducer). `--peer` adds each model's PyTorch peer (benchmarks/lib/peer.py).

What runs: for each model, the real training step of `configs/conformer.py:<size>` as
the trainer builds it from `jaxspeech.training.state` and `jaxspeech.training.step`: its
head (ctc+rnnt: the pruned RNN-T loss with a CTC auxiliary loss, as configured),
SpecAugment, dropout, the log-mel front end, AdamW of `jaxspeech.training.optim`, and a
500-piece vocabulary (blank 0). The mesh is every local device along `data` (pure data
parallelism, whatever the config says). Parameters are really initialized
(`jaxspeech.config.build.init_params`: created on their shards by
`jax.jit(init, out_shardings=...)`); the step `train_step(state, batch)` is jitted with the
train loop's in/out shardings (a `TrainState` of shardings) and donation of the whole
state (`donate_argnums=(0,)`), lowered inside `jax.set_mesh(mesh)` as the train loop does
and compiled ahead of time once (`.lower(...).compile()`, reported as `compile_s`).

The batch is synthetic: B utterances of exactly S seconds of 16 kHz noise (every row is
real audio, so B x S is the audio of one step), labels drawn uniformly from [1, 500) with
3-5 tokens per second per utterance (4 on average, BPE-500 read speech), padded to the
width the input pipeline gives an S-second bucket (S x config.data.max_tokens_per_second).
Defaults: on CPU B=8, S=8 s (64 s of audio per step, like the demo's batches: a step of a
few seconds on 2 cores); on an accelerator B=64, S=16 s (1,024 s per step: LibriSpeech's
typical 12-16 s utterances, about icefall's 800 s per GPU, enough rows to fill the device;
the batch is global, so with several devices each gets B / devices rows).
On an accelerator a DEFAULT batch whose compiled step does not fit in device memory (XLA's
plan of arguments + outputs + temporaries - donated aliases above
`memory_stats()["bytes_limit"]`, or an out-of-memory error) is halved until it fits; the
row's `batch` and `batch_reduced_from` say so and the JSON's `does_not_fit` lists the
attempts. An explicit --batch is never changed. (XLA:CPU's plan of the step at 64 x 16 s,
bfloat16, without rematerialization: about 26 GiB of temporaries for S, 41 for M and 86 for
L, more than an 80 GB GPU holds.)
Default dtype: float32 on CPU (XLA:CPU runs bf16 slower than f32), otherwise the config's
bfloat16. Default models: S and M; on a GPU/TPU Conformer-L in bfloat16 is added.
`--quick` (a smoke test, ~1-2 minutes on 2 cores): S only, B=2, S=4 s, 2 repeats.

Timing: one warm-up step after compiling, then the median of N steps (default 5 on CPU,
20 on accelerators), each ended by `block_until_ready` on the loss, with the donated
train state (parameters, optimizer state, step) fed back as in training.

Reported per model: device (device_kind), dtype, params_m (millions of parameters),
batch, seconds, step_ms, audio_s_per_s (B x S / step time), model_gflop_per_step,
achieved_tflops (model FLOPs / step time, all devices together), peak_tflops (all devices
together), mfu (= achieved / peak), and XLA's per-device memory plan of the compiled step
(`memory_analysis()`: argument and temporary MiB); on accelerators also
`device.memory_stats()["peak_bytes_in_use"]` of the first device over the whole worker
process (init, compile, steps). Each model runs in a fresh subprocess, so these peaks are
its own; a first subprocess only reads the device and measures the CPU matmul rate.

Model FLOPs: `jaxspeech.training.flops.step_flops`, the same count the training loop's MFU
uses (XLA's cost analysis of the same step, lowered with the layers and the RNN-T joiner's
frame chunks unrolled and no rematerialization: XLA counts a loop's body once, which
would leave out most of the joiner's FLOPs, about 4.5% of Conformer-S's step at B=8,
S=8 s). The timed step stays chunked as configured. The RNN-T recursions over time are
still loops counted once (elementwise work, a small share).

Peak FLOP/s per device: `--peak_tflops` if given (`peak_source` "override"), else
`jaxspeech.metrics.perf.peak_flops_per_device` for the device kind and dtype ("table");
CPUs have no table entry, so the peak is MEASURED ("measured_matmul"): the best of 5 timed
2048 x 2048 x 2048 float32 matmuls (jit, `block_until_ready`) on one device, times the
device count. On CPU the MFU is therefore relative to that measured matmul rate, not to a
datasheet peak (and for bf16 on CPU still to the f32 rate). An accelerator without a
table entry reports no MFU unless `--peak_tflops` is given.

`--device_hour_price P` (per device, any currency): each row's price of an audio hour
trained, devices x P / audio_s_per_s (step time only: goodput 1).

Goal (printed, never asserted): MFU >= 40% for Conformer-L in bfloat16 on an accelerator.
On CPU the script says that the goal applies to accelerators.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, peer, results, step_rows, workers  # noqa: E402
from benchmarks.lib.config_overrides import apply_overrides  # noqa: E402
from benchmarks.lib.mfu import (  # noqa: E402
    MATMUL_N,
    MATMUL_TRIES,
    price_columns,
    probe,
    rates,
    select_peak,
)
from benchmarks.lib.synthetic_batch import (  # noqa: E402
    TOKENS_PER_SECOND,
    VOCAB,
    label_width,
    make_batch,
)
from configs import conformer  # noqa: E402
from jaxspeech.config import build  # noqa: E402
from jaxspeech.training import batch as batch_lib  # noqa: E402
from jaxspeech.training import flops as flops_lib  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PROFILE_ENV = "TRAIN_STEP_PROFILE_DIR"  # --profile, handed to the workers
BLANK_ID = 0  # jaxspeech.data.tokenizer: id 0 is always the blank
MFU_GOAL = 0.40  # Conformer-L, bfloat16, accelerator
GOAL_MODEL, GOAL_DTYPE = "L", "bfloat16"


# ------------------------------------------------------------------------------------
# Pure helpers (tested in tests/test_train_step_bench.py).
# ------------------------------------------------------------------------------------
def settings(
    accelerator: bool,
    quick: bool,
    models: str | None = None,
    dtype: str | None = None,
    batch: int | None = None,
    seconds: float | None = None,
    repeats: int | None = None,
) -> dict:
    """What to run: {"runs": [(size, dtype), ...], "batch", "seconds", "repeats"}.

    Explicit arguments win; --quick is S, B=2, 4 s, 2 repeats; otherwise CPU: S, M in
    float32, B=8, 8 s, 5 repeats; accelerator: S, M in bfloat16 plus L in bfloat16,
    B=64, 16 s, 20 repeats.
    """
    default_dtype = dtype or ("bfloat16" if accelerator else "float32")
    if models:
        runs = [(m.strip().upper(), default_dtype) for m in models.split(",") if m.strip()]
    elif quick:
        runs = [("S", default_dtype)]
    else:
        runs = [("S", default_dtype), ("M", default_dtype)]
        if accelerator:
            runs.append((GOAL_MODEL, GOAL_DTYPE))
    if quick:
        b, s, n = 2, 4.0, 2
    elif accelerator:
        b, s, n = 64, 16.0, 20
    else:
        b, s, n = 8, 8.0, 5
    return {
        "runs": runs,
        "batch": batch or b,
        "seconds": float(seconds or s),
        "repeats": repeats or n,
    }


def smaller_batch(batch: int, num_devices: int) -> int | None:
    """Half the batch, rounded down to a multiple of the devices; None below one row each."""
    half = (batch // 2) // num_devices * num_devices
    return half if half >= num_devices else None


def goal_line(rows: list[dict], accelerator: bool, skipped: list[dict] = ()) -> str:
    """The MFU goal: PASS/FAIL for Conformer-L bf16 on an accelerator, else why not judged."""
    head = f"goal: MFU >= {MFU_GOAL:.0%} for Conformer-{GOAL_MODEL} {GOAL_DTYPE} on an accelerator"
    if not accelerator:
        return f"{head}: applies to accelerators (GPU/TPU), not judged on this CPU"
    row = next((r for r in rows if r["model"] == GOAL_MODEL and r["dtype"] == GOAL_DTYPE), None)
    if row is None:
        if any(r["model"] == GOAL_MODEL and r["dtype"] == GOAL_DTYPE for r in skipped):
            return f"{head}: not measured, no batch tried fit in device memory"
        return f"{head}: not measured in this run (add {GOAL_MODEL} with --dtype {GOAL_DTYPE})"
    if row["mfu"] is None:
        return f"{head}: no peak FLOP/s known for {row['device']!r} (pass --peak_tflops)"
    verdict = "PASS" if row["mfu"] >= MFU_GOAL else "FAIL"
    return f"{head}: {verdict} ({row['mfu']:.1%})"


# ------------------------------------------------------------------------------------
# Workers (each in a fresh process).
# ------------------------------------------------------------------------------------
def measure_model(
    size: str, dtype: str, batch: int, seconds: float, repeats: int, overrides: list[str] = ()
) -> dict:
    """Builds, compiles and times the train step of configs/conformer.py:<size>."""
    from jaxspeech.parallel import rules

    config = model_config(size, dtype, overrides)
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1, 1
    with rules.axis_rules(build.rules_from_config(config)):  # the train loop's table
        return _measure(config, size, dtype, batch, seconds, repeats)


def model_config(size: str, dtype: str, overrides: list[str] = ()):
    """configs/conformer.py:<size> in `dtype` with the --set overrides."""
    config = conformer.get_config(size)
    config.model.dtype = dtype
    apply_overrides(config, list(overrides))
    return config


def _measure(config, size: str, dtype: str, batch: int, seconds: float, repeats: int) -> dict:
    import jax

    devices = jax.local_devices()
    if batch % len(devices):
        raise SystemExit(f"--batch {batch} must be a multiple of the {len(devices)} devices")
    prep = _initialize(config, devices, batch, seconds)
    try:
        timed = _compile_and_time(prep, config, size, batch, repeats)
    except Exception as e:  # XLA's out-of-memory errors are runtime errors with this text
        if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
            raise
        return does_not_fit(size, batch, None, None, str(e).splitlines()[0][:300])
    if timed.get("does_not_fit"):
        return timed

    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in prep.local.items()}
    t0 = time.perf_counter()
    flops = flops_lib.step_flops(config, VOCAB, BLANK_ID, shapes)
    flops_s = time.perf_counter() - t0
    times, mem = timed["times"], timed["mem"]
    row = {
        "model": size,
        "framework": step_rows.OURS,
        "device": devices[0].device_kind,
        "dtype": dtype,
        "num_devices": len(devices),
        "params_m": prep.num_params / 1e6,
        "batch": batch,
        "seconds": seconds,
        "label_width": int(prep.local["labels"].shape[1]),
        "repeats": repeats,
        "step_ms": 1e3 * float(np.median(times)),
        "step_ms_min": 1e3 * float(np.min(times)),
        "step_ms_max": 1e3 * float(np.max(times)),
        "model_gflop_per_step": flops / 1e9,
        "init_s": prep.init_s,
        "compile_s": timed["compile_s"],
        "flop_count_s": flops_s,
        "loss_first": timed["loss_first"],
        "loss_last": timed["loss_last"],
    }
    if mem is not None:
        row["xla_argument_mib"] = mem.argument_size_in_bytes / 2**20
        row["xla_temp_mib"] = mem.temp_size_in_bytes / 2**20
        row["xla_output_mib"] = mem.output_size_in_bytes / 2**20
        row["xla_alias_mib"] = mem.alias_size_in_bytes / 2**20
    stats = devices[0].memory_stats()  # read after the steps: the peak of this process
    if stats and "peak_bytes_in_use" in stats:
        row["peak_bytes_in_use_mib"] = stats["peak_bytes_in_use"] / 2**20
    return row


def _initialize(config, devices: list, batch: int, seconds: float) -> types.SimpleNamespace:
    """The train loop's state on a mesh of `devices` (parameters created on their shards,
    feature statistics, AdamW, step 0) with its shardings, the synthetic batch on the mesh
    and the jitted step."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxspeech.parallel import mesh as mesh_lib
    from jaxspeech.training import optim
    from jaxspeech.training import state as state_lib
    from jaxspeech.training import step as step_lib

    mesh = build.mesh_from_config(config, devices=devices)
    spec = build.abstract_model(config, VOCAB, mesh)
    p_shard, v_shard = spec.param_shardings, spec.var_shardings
    t0 = time.perf_counter()  # the parameters alone, created on their shards
    params = jax.block_until_ready(build.init_params(config, VOCAB, spec, config.seed))
    init_s = time.perf_counter() - t0
    num_params = sum(int(x.size) for x in jax.tree.leaves(params))
    f = config.features.num_mel_bins
    cmvn = build.feature_stats(np.full(f, -5.0, np.float32), np.full(f, 3.0, np.float32))
    model_vars = jax.device_put(cmvn, v_shard)
    tx, _ = optim.make_optimizer(config.optim, int(config.train.num_steps))
    opt_state, o_shard = state_lib.init_opt_state(tx, params, mesh, p_shard)
    replicated = NamedSharding(mesh, PartitionSpec())
    train_state = state_lib.TrainState(
        jax.device_put(jnp.int32(0), replicated), params, model_vars, opt_state
    )
    shardings = state_lib.TrainState(replicated, p_shard, v_shard, o_shard)
    local = make_batch(
        batch, seconds, label_width=label_width(seconds, config.data.max_tokens_per_second)
    )
    batch_arrays = mesh_lib.host_to_global(mesh, local)
    train_step = jax.jit(
        step_lib.make_train_step(spec.graphdef, tx, config.seed, BLANK_ID, config.loss),
        in_shardings=(shardings, batch_lib.batch_shardings(mesh)),
        out_shardings=(shardings, None),
        donate_argnums=(0,),
    )
    return types.SimpleNamespace(
        devices=devices,
        mesh=mesh,
        train_state=train_state,
        local=local,
        batch_arrays=batch_arrays,
        train_step=train_step,
        init_s=init_s,
        num_params=num_params,
    )


def _compile_and_time(
    prep: types.SimpleNamespace, config, size: str, batch: int, repeats: int
) -> dict:
    """Compiles the step ahead of time, runs a warm-up step (step 0) and `repeats` timed
    ones (the train state fed back, its step advancing), then traces 3 more under
    --profile; a plan above the device's memory limit returns `does_not_fit` instead."""
    import jax

    devices, batch_arrays = prep.devices, prep.batch_arrays
    state, prep.train_state = prep.train_state, None  # donated to the first step
    t0 = time.perf_counter()
    with jax.set_mesh(prep.mesh):  # as the train loop: logical-axis constraints take effect
        lowered = prep.train_step.lower(state, batch_arrays)
    exe = lowered.compile()
    compile_s = time.perf_counter() - t0
    mem = exe.memory_analysis()
    stats = devices[0].memory_stats() or {}
    if mem is not None and "bytes_limit" in stats:
        need = (
            mem.argument_size_in_bytes
            + mem.output_size_in_bytes
            + mem.temp_size_in_bytes
            - mem.alias_size_in_bytes
        )
        if need > stats["bytes_limit"]:
            return does_not_fit(size, batch, need, stats["bytes_limit"])
    state, metrics = exe(state, batch_arrays)
    first_loss = float(metrics["loss"].block_until_ready())  # the warm-up step
    times = []
    for _ in range(repeats):  # steps 1 .. repeats
        t0 = time.perf_counter()
        state, metrics = exe(state, batch_arrays)
        metrics["loss"].block_until_ready()
        times.append(time.perf_counter() - t0)
    profile_dir = os.environ.get(PROFILE_ENV)
    if profile_dir:  # a device trace of 3 more steps, after the timing
        where = os.path.join(profile_dir, f"{size}-{config.model.dtype}")
        with jax.profiler.trace(where, create_perfetto_trace=True):
            for _ in range(3):
                state, metrics = exe(state, batch_arrays)
            metrics["loss"].block_until_ready()
    return {
        "compile_s": compile_s,
        "mem": mem,
        "times": times,
        "loss_first": first_loss,
        "loss_last": float(metrics["loss"]),
    }


def does_not_fit(
    size: str, batch: int, need: int | None, limit: int | None, error: str = ""
) -> dict:
    """A worker's answer when the step of this batch does not fit in device memory."""
    return {
        "does_not_fit": True,
        "model": size,
        "batch": batch,
        "plan_mib": None if need is None else need / 2**20,
        "limit_mib": None if limit is None else limit / 2**20,
        "error": error,
    }


def run_worker(what: list[str]) -> dict:
    """Runs this script as a worker (`--worker ...`) and returns the JSON it prints last."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", *what]
    return workers.last_json_line(cmd, 3600, f"worker {what}", 4000)


# ------------------------------------------------------------------------------------
# The driver (touches no device itself: on GPUs each worker gets the memory to itself).
# ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    load_at_start = environment.load_avg_1m()
    info = run_worker(["probe", "1" if not args.peak_tflops else "0"])
    accelerator = info["platform"] != "cpu"
    plan = settings(
        accelerator, args.quick, args.models, args.dtype, args.batch, args.seconds, args.repeats
    )
    print(
        f"{info['device_count']} x {info['device_kind']} ({info['platform']}), jax {info['jax']}; "
        f"batch {plan['batch']} x {plan['seconds']:g} s, median of {plan['repeats']} steps; "
        f"models {', '.join(f'{m} {d}' for m, d in plan['runs'])}",
        flush=True,
    )
    peer_python = setup_peer(args, plan)
    rows, sources, skipped, peers = [], set(), [], []
    for size, dtype in plan["runs"]:
        peak, source = select_peak(
            info["device_kind"],
            info["platform"],
            dtype,
            args.peak_tflops,
            info.get("matmul_flops_per_s"),
        )
        sources.add(source)
        row = run_model(args, plan, info["device_count"], size, dtype, skipped)
        if peer_python:
            peers.append(run_peer(args, plan, peer_python, size, dtype, row))
        if row is None:
            continue
        row |= rates(
            row["model_gflop_per_step"] * 1e9,
            row["step_ms"] / 1e3,
            row["batch"],
            row["seconds"],
            row["num_devices"],
            peak,
        )
        row["peak_source"] = source
        row |= price_columns(row, args.device_hour_price)
        rows.append(row)
        print(
            f"{size} {dtype}: step {row['step_ms']:.0f} ms, compile {row['compile_s']:.1f} s, "
            f"loss {row['loss_first']:.3f} -> {row['loss_last']:.3f}",
            flush=True,
        )
    goal = goal_line(rows, accelerator, skipped)  # ours only
    result = {
        "benchmark": "train_step",
        "device": f"{info['platform']}:{info['device_kind']}",
        "platform": info["platform"],
        "device_kind": info["device_kind"],
        "device_count": info["device_count"],
        "cpu_count": os.cpu_count(),
        "machine": environment.machine(),
        "jax": info["jax"],
        "date": environment.utc_date(),
        "load_avg_1m_at_start": load_at_start,
        "quick": args.quick,
        "overrides": args.set,
        "vocab": VOCAB,
        "tokens_per_second": list(TOKENS_PER_SECOND),
        "peak_source": "; ".join(sorted(sources)),
        "measured_matmul": (
            {"n": MATMUL_N, "tries": MATMUL_TRIES, "tflops": info["matmul_flops_per_s"] / 1e12}
            if "matmul_flops_per_s" in info
            else None
        ),
        "flops_method": "jaxspeech.training.flops.step_flops (layers and joiner chunks unrolled)",
        "goal": goal,
        "rows": step_rows.interleave(rows, [p for p in peers if "error" not in p]),
        # Batches that did not fit in device memory (plan: XLA's, vs memory_stats' limit).
        "does_not_fit": skipped,
        "peer_not_measured": [p for p in peers if "error" in p],  # --peer: not fitting, failed
    }
    print_summary(result, result["rows"], goal)
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(f"total {result['wall_s']:.0f} s")
    results.save_result(args.out, result)
    return result


def setup_peer(args: argparse.Namespace, plan: dict) -> str | None:
    """--peer: the peer's Python, checked (with the models' configs) before anything runs."""
    configs = [model_config(m, d, args.set) for m, d in plan["runs"]]
    return peer.setup(args.peer_python, ROOT, configs) if args.peer else None


def run_peer(args, plan: dict, python: str, size: str, dtype: str, ours: dict | None) -> dict:
    """The PyTorch peer's row (or why it has none) at ours' batch (the plan's if ours has none)."""
    job = {k: plan[k] for k in ("seconds", "repeats")} | {"vocab": VOCAB, "blank": BLANK_ID}
    job |= {"model": size, "dtype": dtype, "batch": ours["batch"] if ours else plan["batch"]}
    return peer.measure(python, ROOT, model_config(size, dtype, args.set), **job)


def run_model(
    args: argparse.Namespace,
    plan: dict,
    device_count: int,
    size: str,
    dtype: str,
    skipped: list[dict],
) -> dict | None:
    """One model's row from a worker; a default batch that does not fit in device memory
    is halved until it fits (each attempt appended to `skipped`); None if none fits."""
    batch = plan["batch"]
    while True:
        row = run_worker(
            [f"{size}:{dtype}", str(batch), str(plan["seconds"]), str(plan["repeats"])] + args.set
        )
        if not row.get("does_not_fit"):
            break
        # Only a default batch is reduced: an explicit --batch is measured or reported.
        smaller = None if args.batch else smaller_batch(batch, device_count)
        why = (
            f"plan {row['plan_mib']:.0f} MiB > {row['limit_mib']:.0f} MiB"
            if row["plan_mib"] is not None
            else row["error"]
        )
        print(
            f"{size} {dtype}: batch {batch} does not fit in device memory ({why})"
            + (f"; trying batch {smaller}" if smaller else "; skipped"),
            flush=True,
        )
        row |= {"dtype": dtype}
        skipped.append(row)
        if smaller is None:
            break
        batch = smaller
    if row.get("does_not_fit"):
        return None
    row["batch_reduced_from"] = plan["batch"] if batch != plan["batch"] else None
    return row


def print_summary(result: dict, rows: list[dict], goal: str) -> None:
    """The device and peak lines, the table, the reduced batches and the goal."""
    print()
    print(f"{result['device']} x {result['device_count']}, jax {result['jax']}", end="")
    print(f", peak: {result['peak_source']}")
    if result["measured_matmul"]:
        m = result["measured_matmul"]
        print(
            f"CPU peak = best of {m['tries']} {m['n']}^3 f32 matmuls on one device: "
            f"{m['tflops'] * 1e3:.1f} GFLOP/s per device (MFU is relative to this rate)"
        )
    print("\n".join(step_rows.table_lines(rows) + step_rows.comparison_lines(rows)))
    for r in rows:
        if r.get("price_per_audio_hour") is not None:
            print(
                f"{r['model']} {r['dtype']}: {r['price_per_audio_hour']:.4g} per audio hour "
                f"trained at {r['device_hour_price']:g} per device hour x {r['num_devices']} "
                f"({r['audio_s_per_s']:.1f} audio s/s; step time only)"
            )
    for r in rows:
        if r["batch_reduced_from"]:
            print(
                f"{r['model']}: batch {r['batch_reduced_from']} did not fit; measured {r['batch']}"
            )
    print(goal)


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: S, B=2, 4 s, 2 repeats")
    ap.add_argument("--models", default=None, help="comma-separated sizes of configs/conformer.py")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"))
    ap.add_argument("--batch", type=int, default=None, help="utterances per step (global)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per utterance")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps")
    ap.add_argument(
        "--peak_tflops", type=float, default=0.0, help="peak TFLOP/s of one device (override)"
    )
    ap.add_argument(
        "--device_hour_price",
        type=float,
        default=0.0,
        help="price of one device for an hour (any currency): each row's price per audio hour",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config entry of every model (repeatable), e.g. model.head=ctc",
    )
    ap.add_argument(
        "--profile",
        default="",
        metavar="DIR",
        help="also trace 3 steps per model with jax.profiler (Perfetto JSON) under DIR/<model>",
    )
    ap.add_argument("--peer", action="store_true", help="also time each model's PyTorch peer")
    ap.add_argument("--peer_python", default=None, help="the peer's Python (.venv-peer's)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "train_step.json"))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        if args.worker[0] == "probe":
            print(json.dumps(probe(args.worker[1] == "1")))
        else:
            size, dtype = args.worker[0].split(":")
            b, s, n = args.worker[1:4]
            row = measure_model(size, dtype, int(b), float(s), int(n), args.worker[4:])
            print(json.dumps(row))
        return None
    if args.models:
        unknown = [m for m in args.models.upper().split(",") if m not in conformer.SIZES]
        if unknown:
            ap.error(f"unknown models {unknown}; choose from {list(conformer.SIZES)}")
    if args.profile:
        os.environ[PROFILE_ENV] = os.path.abspath(args.profile)  # read by the workers
    return run(args)


if __name__ == "__main__":
    main()
