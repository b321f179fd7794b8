"""Collective bytes per train step for each sharding layout of 8 devices, projected to 1,024.

`python benchmarks/scaling.py [--quick] [--model S|M|L] [--opt-state params|replicated]
[--layouts a,b] [--device-seconds S] [--dump-hlo DIR] [--out PATH]` writes
`benchmarks/results/scaling.json` and prints the measured table and the projection.

1. Measured (XLA's own partitioning, no timing). For each layout of 8 devices over the mesh
   axes (replica, data, fsdp, tensor) -- data parallel (1,8,1,1), FSDP (1,1,8,1), (1,4,2,1),
   (1,2,2,2), (1,1,4,2) and replica x data (2,4,1,1) -- the Conformer-CTC train step of
   `jaxspeech.step.make_train_step` (AdamW of `jaxspeech.optim`, the config's SpecAugment
   and log-mel front end) is lowered for a fixed global batch with ABSTRACT arguments
   (`jax.ShapeDtypeStruct`s carrying the mesh shardings, so no parameter is ever
   initialized and even L compiles on a laptop) and compiled for 8 simulated CPU devices.
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
   its parameter's sharding, as FSDP intends (and as `jaxspeech.state.init_opt_state`
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
import datetime
import json
import math
import platform
import re
import sys
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `configs` and `jaxspeech` from this checkout when run as a script
    sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results")
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

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
# LLVM code generation at -O0: about 20% less compile time; the HLO passes that partition
# and combine collectives are unaffected (same collectives, bytes and FLOPs, checked on
# the data-parallel S step and the quick FSDP step).
COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

# Global batch (utterances, seconds each) and vocabulary. S/M/L: 16 x 8 s at 16 kHz with a
# BPE-500 vocabulary and labels padded to 10 tokens/s (configs/conformer.py); --quick: the
# demo's tiny model on 8 x 1 s with 32 symbols.
BATCH = {"full": (16, 8.0, 500), "quick": (8, 1.0, 32)}

# ---------------------------------------------------------------------------------------
# Projection constants (stated, not measured). Bandwidths are one direction, per device
# (intra-node) or per node (inter-node); latencies are per ring step.
# ---------------------------------------------------------------------------------------
HARDWARE = {
    "h100_ib": {
        # 40% of H100 SXM dense bf16 peak (989 TFLOP/s): a typical sustained share for a
        # Conformer step with its convolutions, norms and attention on short sequences.
        "flops_per_s": 0.40 * 989e12,
        "intra_bw": 450e9,  # NVLink 4: 900 GB/s bidirectional per GPU
        "inter_bw": 8 * 50e9,  # 8 x 400 Gb/s InfiniBand NDR per node, one NIC per GPU
        "intra_latency": 2e-6,  # NVLink hop
        "inter_latency": 5e-6,  # InfiniBand hop through one switch level
        "label": "H100 node: 40% of 989 TFLOP/s, NVLink 450 GB/s, 8x400 Gb/s IB",
    },
    "v100_eth25": {
        # The references' era: V100 fp32 peak 15.7 TFLOP/s at 40% (their LSTMs trained in
        # fp32); nodes of 8 GPUs with NVLink 2 and one 25 Gb/s Ethernet NIC per node
        # (Amazon's p2/p3 instances; IBM's H-ADPSGD cluster had 100 Gb/s).
        "flops_per_s": 0.40 * 15.7e12,
        "intra_bw": 150e9,  # NVLink 2 (DGX-1 / p3.16xlarge): 6 x 25 GB/s per GPU
        "inter_bw": 25e9 / 8,  # 25 Gb/s Ethernet per node
        "intra_latency": 5e-6,
        "inter_latency": 30e-6,  # TCP over Ethernet
        "label": "V100 node: 40% of 15.7 TFLOP/s fp32, NVLink 150 GB/s, 25 Gb/s Ethernet",
    },
}
NODE = 8  # devices per node
OVERLAP = 0.5  # share of compute that gradient communication can hide behind
AVERAGE_EVERY = 100  # BMUF-style periodic averaging: the references' block size
PROJECT_N = (8, 64, 128, 1024)
# The references' measured speedups over one GPU: (method, devices, speedup, source).
REFERENCES = (
    ("GTC (threshold-compressed gradients), K80", 64, 16.76, "Amazon, Table I"),
    ("BMUF-NBM (block 100), K80", 64, 50.91, "Amazon, Table I"),
    ("BMUF-NBM (block 100), K80", 128, 97.59, "Amazon, Table I"),
    ("H-ADPSGD, V100, 100 Gb/s Ethernet", 64, 40.0, "IBM"),
)


# =======================================================================================
# Parsing compiled HLO text (pure functions).
# =======================================================================================
DTYPE_BYTES = {
    "pred": 1,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s*"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<start>-start)?\("
)
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(\(.*\)\s*->.*)?\{\s*$")
_CALLEE = re.compile(
    r"\b(?P<attr>body|condition|calls|to_apply|true_computation|false_computation|"
    r"branch_computations)=(?P<value>\{[^}]*\}|%?[\w.\-]+)"
)
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of an HLO element type (f8* and f4* types included)."""
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    if dtype.startswith("f8"):
        return 1
    if dtype.startswith("f4"):
        return 0.5
    raise ValueError(f"unknown HLO element type {dtype!r}")


def parse_shapes(type_str: str) -> list[tuple[str, tuple[int, ...]]]:
    """Every array type in an HLO type string, e.g. "(f32[8,4]{1,0}, s32[])" ->
    [("f32", (8, 4)), ("s32", ())]. Layouts and tuple nesting are ignored."""
    return [
        (d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(type_str)
    ]


def shapes_bytes(shapes: list[tuple[str, tuple[int, ...]]]) -> float:
    return float(sum(dtype_bytes(d) * math.prod(dims) for d, dims in shapes))


def _split_top_level(type_str: str) -> list[str]:
    """Top-level elements of a tuple type "(a, (b, c), d)" -> ["a", "(b, c)", "d"]; a
    non-tuple type is returned as its only element. /*index=N*/ comments are dropped."""
    s = re.sub(r"/\*.*?\*/", "", type_str).strip()
    if not s.startswith("("):
        return [s]
    parts, depth, cur = [], 0, ""
    for ch in s[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _result_type(kind: str, is_start: bool, type_str: str) -> str:
    """The part of a result type that is the collective's output. Async starts return
    (operands, outputs[, contexts]) for all-gather and collective-permute; all-reduce-start
    returns its outputs directly."""
    if not is_start or kind == "all-reduce":
        return type_str
    parts = _split_top_level(type_str)
    return parts[1] if len(parts) >= 2 else type_str


def group_size(line: str, num_devices: int | None = None) -> int | None:
    """Devices per replica group of one collective instruction line, or None if it names
    none (collective-permute) or cannot be read. `replica_groups={}` means all devices."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:  # mesh['axis_0'=4,'axis_1'=2][, device_ids=([2,4]T(1,0))] {'axis_0'} (sub-axes:
        # {'axis_0':(1)2}); the device order does not change the group size
        sizes = {k: int(v) for k, v in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))}
        n = 1
        for name, sub in re.findall(r"'([^']+)'(?::\(\d+\)(\d+))?", m.group(2)):
            n *= int(sub) if sub else sizes[name]
        return n
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[", line)
    if m:  # iota form: [groups, size]<=[dims]T(perm)
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=\{(.*?)\}\}", line)
    if m:  # explicit: {{0,1},{2,3}}
        first = m.group(1).lstrip("{").split("}")[0]
        return len([x for x in first.split(",") if x.strip()])
    if re.search(r"replica_groups=\{\}", line):
        return num_devices
    return None


def _num_devices(hlo_text: str) -> int | None:
    m = re.search(r"num_partitions=(\d+)", hlo_text[:20000])
    r = re.search(r"replica_count=(\d+)", hlo_text[:20000])
    if m or r:
        return max(int(m.group(1)) if m else 1, 1) * max(int(r.group(1)) if r else 1, 1)
    return None


def _execution_counts(hlo_text: str) -> tuple[dict, dict, dict]:
    """(computation of each line index, executions per step of each computation, flags).

    Executions start at 1 for ENTRY and multiply by a while loop's known trip count for
    its body and condition; conditional branches inherit their caller's count and are
    flagged (only one branch runs). Without an ENTRY every computation counts once."""
    line_comp, calls, entry, current = {}, {}, None, None
    for i, line in enumerate(hlo_text.splitlines()):
        if not line.startswith((" ", "\t")):
            m = _COMPUTATION.match(line)
            if m:
                current = m.group("name")
                calls.setdefault(current, [])
                if m.group("entry"):
                    entry = current
                continue
            if line.strip() == "}":
                current = None
                continue
        if current is None:
            continue
        line_comp[i] = current
        trip = _TRIP.search(line)
        for cm in _CALLEE.finditer(line):
            attr, value = cm.group("attr"), cm.group("value")
            for callee in re.findall(r"%?([\w.\-]+)", value.strip("{}")):
                mult, flag = 1, None
                if attr in ("body", "condition"):
                    mult = int(trip.group(1)) if trip else 1
                    flag = None if trip else "while_unknown_trips"
                elif attr in ("true_computation", "false_computation", "branch_computations"):
                    flag = "conditional_branch"
                calls[current].append((callee, mult, flag))
    counts: dict = {}
    flags: dict = {}
    if entry is None:
        return line_comp, {c: 1 for c in calls}, flags

    def visit(comp: str, count: int, inherited: tuple) -> None:
        counts[comp] = counts.get(comp, 0) + count
        flags.setdefault(comp, set()).update(inherited)
        for callee, mult, flag in calls.get(comp, []):
            if callee in calls:
                visit(callee, count * mult, inherited + ((flag,) if flag else ()))

    visit(entry, 1, ())
    return line_comp, counts, flags


def parse_collectives(hlo_text: str) -> list[dict]:
    """Every collective of an HLO module's text, one dict per instruction:
    name, kind (all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute),
    async (a -start form), shapes [(dtype, dims)] of its output, bytes (their total),
    group_size (devices per replica group; None for collective-permute), computation,
    executions (times it runs per call of the module: while-loop trip counts multiplied
    in) and flags (conditional_branch, while_unknown_trips: counts that are bounds)."""
    num_devices = _num_devices(hlo_text)
    line_comp, counts, comp_flags = _execution_counts(hlo_text)
    ops = []
    for i, line in enumerate(hlo_text.splitlines()):
        m = _INSTR.match(line)
        if not m:
            continue
        kind, is_start = m.group("kind"), bool(m.group("start"))
        shapes = parse_shapes(_result_type(kind, is_start, m.group("type")))
        comp = line_comp.get(i)
        ops.append(
            {
                "name": m.group("name"),
                "kind": kind,
                "async": is_start,
                "shapes": shapes,
                "bytes": shapes_bytes(shapes),
                "group_size": None
                if kind == "collective-permute"
                else group_size(line, num_devices),
                "computation": comp,
                "executions": counts.get(comp, 1),
                "flags": sorted(comp_flags.get(comp, ())),
            }
        )
    return ops


def ring_bytes(op: dict) -> float:
    """Bytes one device sends for one execution of `op` with a ring algorithm
    (S = the op's output bytes, n = its group size)."""
    s, kind = op["bytes"], op["kind"]
    if kind == "collective-permute":
        return s
    n = op["group_size"]
    if n is None:
        raise ValueError(f"{op['name']}: no replica group size")
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * s
    if kind in ("all-gather", "all-to-all"):
        return (n - 1) / n * s
    if kind == "reduce-scatter":
        return (n - 1) * s
    raise ValueError(f"unknown collective kind {kind!r}")


def summarize(ops: list[dict]) -> dict:
    """Counts (instructions and executions) and bytes per device per step, by kind and by
    group size; every op's executions multiply its ring bytes."""
    out = {
        "ops": dict(Counter(o["kind"] for o in ops)),
        "executions": {},
        "bytes_by_kind": {},
        "bytes_by_group_size": {},
        "flagged_ops": sum(1 for o in ops if o["flags"]),
    }
    for o in ops:
        b = ring_bytes(o) * o["executions"]
        out["executions"][o["kind"]] = out["executions"].get(o["kind"], 0) + o["executions"]
        out["bytes_by_kind"][o["kind"]] = out["bytes_by_kind"].get(o["kind"], 0.0) + b
        key = str(o["group_size"])
        out["bytes_by_group_size"][key] = out["bytes_by_group_size"].get(key, 0.0) + b
    out["bytes"] = sum(out["bytes_by_kind"].values())
    return out


def gradient_accounting(ops: list[dict], param_shapes: list[tuple[str, tuple]]) -> dict:
    """Splits the arrays that all-reduces carry into parameter-shaped ones (each parameter
    matched at most once; dims compared sorted, so a transposed layout matches) and the
    rest. Bytes are array bytes per step (executions multiplied), not ring bytes. In a
    data-parallel step the parameter-shaped ones are the gradients; `missing` lists
    parameters no all-reduced array matched (their gradients were reduced in another
    form), `other` the largest unmatched arrays."""
    left = Counter((d, tuple(sorted(s))) for d, s in param_shapes)
    matched, other = 0.0, Counter()
    for o in ops:
        if o["kind"] != "all-reduce":
            continue
        for d, dims in o["shapes"]:
            nbytes = dtype_bytes(d) * math.prod(dims) * o["executions"]
            key = (d, tuple(sorted(dims)))
            if left[key] > 0:
                left[key] -= 1
                matched += nbytes
            else:
                other[f"{d}{list(dims)}"] += nbytes
    param_bytes = float(sum(dtype_bytes(d) * math.prod(s) for d, s in param_shapes))
    missing = Counter()
    for (d, dims), k in left.items():
        if k > 0:
            missing[f"{d}{list(dims)}"] += k
    return {
        "param_bytes": param_bytes,
        "param_shaped_bytes": matched,
        "other_bytes": float(sum(other.values())),
        "other": [[name, b] for name, b in other.most_common(6)],
        "missing": [[name, k] for name, k in missing.most_common(6)],
    }


# =======================================================================================
# Projection (pure functions).
# =======================================================================================
def ring_allreduce_time(nbytes: float, n: int, bw: float, latency: float) -> float:
    """Seconds of a ring all-reduce of `nbytes` over n devices: 2(n-1)/n bytes / bw +
    2(n-1) latency."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * latency


def ring_half_time(nbytes: float, n: int, bw: float, latency: float) -> float:
    """A ring reduce-scatter or all-gather of `nbytes` (the full array) over n devices."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * latency


def comm_time(scheme: str, grad_bytes: float, n: int, hw: dict) -> float:
    """Seconds of gradient communication per step on n devices (nodes of NODE devices)."""
    if scheme in ("flat", "periodic"):
        if n <= NODE:
            t = ring_allreduce_time(grad_bytes, n, hw["intra_bw"], hw["intra_latency"])
        else:  # one ring crossing per node per channel: the slower of NVLink and the NICs
            bw = min(hw["intra_bw"], hw["inter_bw"])
            t = ring_allreduce_time(grad_bytes, n, bw, hw["inter_latency"])
        return t / AVERAGE_EVERY if scheme == "periodic" else t
    if scheme == "hierarchical":
        local = min(n, NODE)
        nodes = max(1, n // NODE)
        t = 2 * ring_half_time(grad_bytes, local, hw["intra_bw"], hw["intra_latency"])
        # each of the node's GPUs all-reduces its 1/local shard; the node's NICs carry all
        t += ring_allreduce_time(grad_bytes, nodes, hw["inter_bw"], hw["inter_latency"])
        return t
    raise ValueError(f"unknown scheme {scheme!r}")


def project(compute_s: float, grad_bytes: float, hw: dict, ns=PROJECT_N) -> dict:
    """{scheme: [{n, comm_ms, step_ms, speedup, efficiency}]} for weak scaling."""
    out = {}
    for scheme in ("flat", "hierarchical", "periodic"):
        rows = []
        for n in ns:
            comm = comm_time(scheme, grad_bytes, n, hw)
            step = compute_s + max(0.0, comm - OVERLAP * compute_s)
            speedup = n * compute_s / step
            rows.append(
                {
                    "n": n,
                    "comm_ms": 1e3 * comm,
                    "step_ms": 1e3 * step,
                    "speedup": speedup,
                    "efficiency": speedup / n,
                }
            )
        out[scheme] = rows
    return out


def compute_for_efficiency(comm_s: float, efficiency: float = 0.9) -> float:
    """Least compute per step (s) for which C / T(N) >= efficiency when communication
    takes comm_s: T = C + max(0, comm - OVERLAP C) <= C / efficiency."""
    return comm_s / (OVERLAP + 1 / efficiency - 1)


# =======================================================================================
# Building and compiling the train step (needs jax; 8 devices).
# =======================================================================================
def make_config(model: str, quick: bool):
    from configs import conformer, demo

    config = demo.get_config("tiny") if quick else conformer.get_config(model)
    config.model.head = "ctc"
    config.model.conformer.scan_layers = False  # see the module docstring
    return config


def abstract_batch(mesh, utterances: int, seconds: float, config) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxspeech.parallel import mesh as mesh_lib

    samples = int(seconds * config.features.sample_rate)
    labels = max(1, int(seconds * config.data.max_tokens_per_second))
    shapes = {
        "audio": ((utterances, samples), jnp.float32),
        "audio_len": ((utterances,), jnp.int32),
        "labels": ((utterances, labels), jnp.int32),
        "label_len": ((utterances,), jnp.int32),
        "weight": ((utterances,), jnp.float32),
        "label_overflow": ((utterances,), jnp.int32),
        "corrupt": ((utterances,), jnp.int32),
    }
    return {
        k: jax.ShapeDtypeStruct(s, d, sharding=mesh_lib.batch_sharding(mesh, len(s)))
        for k, (s, d) in shapes.items()
    }


def _hlo_dtype(dtype) -> str:
    """numpy/JAX dtype -> HLO element type name (float32 -> f32, int8 -> s8)."""
    name = str(dtype)
    for np_prefix, hlo_prefix in (("float", "f"), ("bfloat", "bf"), ("uint", "u"), ("int", "s")):
        if name.startswith(np_prefix) and name[len(np_prefix) :].isdigit():
            return hlo_prefix + name[len(np_prefix) :]
    return {"bool": "pred", "complex64": "c64", "complex128": "c128"}.get(name, name)


def compile_layout(config, shape: tuple[int, ...], batch_spec, opt_state: str) -> dict:
    """Lowers and compiles the train step on one (replica, data, fsdp, tensor) layout with
    abstract arguments; returns the HLO text, FLOPs and parameter bytes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxspeech import checkpoint as ckpt_lib
    from jaxspeech import optim
    from jaxspeech import state as state_lib
    from jaxspeech import step as step_lib
    from jaxspeech.parallel import rules

    utterances, seconds, vocab = batch_spec
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    mesh = state_lib.mesh_from_config(config, devices=jax.devices()[: math.prod(shape)])
    table = state_lib.rules_from_config(config)  # the train loop's logical-axis rules
    with rules.axis_rules(table):
        spec = state_lib.abstract_model(config, vocab, mesh)
    params, model_vars = spec.params, spec.model_vars
    p_shard, v_shard = spec.param_shardings, spec.var_shardings
    tx, _ = optim.make_optimizer(config.optim, config.train.num_steps)
    replicated = NamedSharding(mesh, PartitionSpec())

    abstract_opt = jax.eval_shape(tx.init, params)
    if opt_state == "params":  # the train loop's layout: moments sharded like parameters
        o_shard = state_lib.opt_shardings(tx, params, mesh, p_shard)
    elif opt_state == "replicated":
        o_shard = jax.tree.map(lambda _: replicated, abstract_opt)
    else:
        raise ValueError(f"--opt-state must be params or replicated, got {opt_state!r}")
    opt = ckpt_lib.abstract_like(abstract_opt, o_shard)
    batch = abstract_batch(mesh, utterances, seconds, config)
    step = jax.jit(
        step_lib.make_train_step(spec.graphdef, tx, 0, 0, config.loss),
        in_shardings=(p_shard, v_shard, o_shard, None, None),
        out_shardings=(p_shard, o_shard, None),
    )
    t0 = time.perf_counter()
    with rules.axis_rules(table), jax.set_mesh(mesh):
        lowered = step.lower(params, model_vars, opt, batch, jax.ShapeDtypeStruct((), jnp.int32))
        compiled = lowered.compile(compiler_options=COMPILER_OPTIONS)
    compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    leaves = jax.tree.leaves(params)
    return {
        "param_shapes": [(_hlo_dtype(x.dtype), tuple(x.shape)) for x in leaves],
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
            hlo = got.pop("hlo")
            if dump_dir:
                os.makedirs(dump_dir, exist_ok=True)
                with open(os.path.join(dump_dir, f"{name}.hlo.txt"), "w") as f:
                    f.write(hlo)
            ops = parse_collectives(hlo)
            summary = summarize(ops)
        except Exception as e:  # noqa: BLE001 - a layout that fails is reported, not fixed
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{name}: FAILED {row['error'][:300]}", flush=True)
            rows.append(row)
            continue
        param_shapes = got.pop("param_shapes")
        row |= got | summary
        row["bytes_per_param_byte"] = summary["bytes"] / got["param_bytes"]
        row["all_reduce_arrays"] = gradient_accounting(ops, param_shapes)
        row["largest_ops"] = [
            {k: o[k] for k in ("kind", "group_size", "bytes", "executions")}
            | {"ring_bytes_per_step": ring_bytes(o) * o["executions"]}
            | {
                "shapes": [f"{d}{list(s)}" for d, s in o["shapes"]][:4]
                + ["..."] * (len(o["shapes"]) > 4)
            }
            for o in sorted(ops, key=lambda o: -ring_bytes(o) * o["executions"])[:5]
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
        counts = " / ".join(str(r["ops"].get(k, 0)) for k in KINDS)
        kinds = " / ".join(_mib(r["bytes_by_kind"].get(k, 0.0)) for k in KINDS)
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
        hw = HARDWARE[hw_name]
        print(
            f"\nprojection (not measured), {hw['label']}; compute "
            f"{meta['compute_ms'][hw_name]:.2f} ms per step ({meta['device_seconds_per_step']:.0f} "
            f"s of audio per device), gradients {_mib(meta['grad_bytes'])} MiB, overlap {OVERLAP}"
        )
        print("| scheme | " + " | ".join(f"N={n}: speedup (eff.)" for n in PROJECT_N) + " |")
        print("|---|" + "---|" * len(PROJECT_N))
        for scheme, rows in per_scheme.items():
            cells = [f"{r['speedup']:.1f}x ({r['efficiency']:.2f})" for r in rows]
            print(f"| {scheme} | " + " | ".join(cells) + " |")
    print("\naudio seconds per device per step needed for efficiency 0.9 (projection):")
    print("| hardware, scheme | " + " | ".join(f"N={n}" for n in PROJECT_N) + " |")
    print("|---|" + "---|" * len(PROJECT_N))
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
        k: flops_per_audio_s * device_seconds / hw["flops_per_s"] for k, hw in HARDWARE.items()
    }
    results = {k: project(compute[k], grad_bytes, HARDWARE[k]) for k in HARDWARE}
    seconds = {
        k: {
            scheme: [
                compute_for_efficiency(comm_time(scheme, grad_bytes, n, hw))
                * hw["flops_per_s"]
                / flops_per_audio_s
                for n in PROJECT_N
            ]
            for scheme in results[k]
        }
        for k, hw in HARDWARE.items()
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
        "overlap": OVERLAP,
        "average_every": AVERAGE_EVERY,
        "node": NODE,
        "hardware": HARDWARE,
        "step_time": "C + max(0, comm - overlap C); speedup N C / T; ring all-reduce "
        "2(N-1)/N G / bw + 2(N-1) latency",
    }
    return results, method


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
    load_at_start = round(os.getloadavg()[0], 2)
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
        "device": f"{device.platform}:{device.device_kind}",
        "num_devices": n_dev,
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "jax": jax.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_avg_1m_at_start": load_at_start,
        "model": "demo:tiny" if quick else f"conformer:{model}",
        "head": "ctc",
        "scan_layers": False,
        "opt_state": opt_state,
        "compiler_options": COMPILER_OPTIONS,
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
        results, method = projection_for(data, batch_spec, device_seconds)
        print(
            f"\nFLOPs per second of audio (XLA cost analysis of the unscanned data-parallel "
            f"step, per device): {method['flops_per_audio_second'] / 1e9:.2f} GFLOP"
        )
        print_projection(results, method)
        result["projection"] = {"method": method, "results": results}
        result["references"] = [
            {"method": m, "devices": n, "speedup": s, "source": src} for m, n, s, src in REFERENCES
        ]
        eff = {k: results[k]["hierarchical"][-1]["efficiency"] for k in results}
        print(
            "goal: near-linear 8 -> 1,024 (efficiency >= 0.9), hierarchical, projected: "
            + ", ".join(f"{k} {e:.2f} {'PASS' if e >= 0.9 else 'FAIL'}" for k, e in eff.items())
        )
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
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
