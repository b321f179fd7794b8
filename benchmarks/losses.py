"""Transducer losses: full RNN-T vs pruned RNN-T vs CTC, time and measured peak memory.

`python benchmarks/losses.py [--quick] [--repeats N] [--out PATH]` times forward + backward
(gradients for every weight and for the encoder and predictor outputs, as in training) of
four heads on (B, T, D=256) encoder and (B, U+1, 256) predictor outputs, prints a table and
writes `benchmarks/results/losses.json`:
  rnnt_full            jaxspeech.losses.rnnt.rnnt_loss; joiner = enc_proj(256->256) +
                       pred_proj(256->256), tanh, out(256->V), over the whole T x (U+1)
                       lattice (16 frames of logits at a time, rematerialized for backward)
  rnnt_pruned          jaxspeech.losses.rnnt.rnnt_pruned_loss, prune_range 5, loss
                       0.5 * simple + pruned: the same joiner on 5 rows per frame, 16 frames
                       at a time (its default), plus the simple joiner (a linear 256->V on
                       each side; the acoustic one is handed to the loss as a function of
                       the encoder output and runs there, 16 frames at a time)
  rnnt_pruned_unchunked  the same with frames_per_chunk=None: all (B, T, 5, V) joiner logits
                       and (B, T, V) simple acoustic logits at once, as k2 computes them
  ctc                  a linear 256->V on the encoder output, jaxspeech.losses.ctc.ctc_loss
The projections run once on (B, T, 256) and (B, U+1, 256) before the lattice (as icefall
does), not on every lattice cell. Lengths are ragged (80-100% of T and of U).

Every (case, head) runs in a fresh subprocess, so each peak is its own (`--quick`, a smoke
test, runs rnnt_full, rnnt_pruned and ctc on one small case in one subprocess):
  - accelerators: `device.memory_stats()["peak_bytes_in_use"]` after the first call
    (arguments, outputs and temporaries);
  - CPU (no memory_stats): the compiled executable's `memory_analysis()`, temp + argument +
    output bytes (`*_peak_mb`; temp alone in `*_xla_temp_mb`), and the process's peak
    resident-set increase over the first call, measured from /proc/self/status VmHWM after
    resetting it (/proc/self/clear_refs) with the inputs and the executable already in
    memory (`*_rss_mb`).
Timing: one warm-up call after the measured one, then the median of N calls, each ended
by block_until_ready. `*_loss` is the head's mean objective at the seeded initialization
(a sanity check, not comparable across heads). `logsoftmax_4d_mb` is the size of one
float32 (B, T, U+1, V) tensor: what a loss that materializes the lattice's log-softmax
would hold at least once.
Goals (printed, never asserted): pruned peak at least 5x below full, pruned faster.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxspeech.losses.ctc import ctc_loss
from jaxspeech.losses.rnnt import rnnt_loss, rnnt_pruned_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, timing, workers  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
D = 256  # encoder / predictor / joiner width
PRUNE_RANGE = 5
FRAMES_PER_CHUNK = 16
HEADS = ("rnnt_full", "rnnt_pruned", "rnnt_pruned_unchunked", "ctc")
QUICK_HEADS = ("rnnt_full", "rnnt_pruned", "ctc")
# (B, T, U, V): 8 s utterances at 25 frames/s with a 500-piece vocabulary, and 20 s ones
# with 1000 pieces.
CASES = [(8, 200, 50, 500), (4, 500, 100, 1000)]
QUICK_CASES = [(2, 40, 8, 64)]


# ------------------------------------------------------------------------------------
# The heads (run inside a worker process).
# ------------------------------------------------------------------------------------
def make_inputs(b: int, t: int, u: int, v: int) -> tuple[dict, tuple]:
    """Seeded weights and a ragged batch: (params, (enc_btd, enc_len_b, pred_bud, labels_bu,
    label_len_b))."""
    rng = np.random.default_rng(0)

    def dense(n_in: int, n_out: int) -> dict:
        w = rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
        return {"w": jnp.asarray(w, jnp.float32), "b": jnp.zeros(n_out, jnp.float32)}

    params = {
        "enc_proj": dense(D, D),
        "pred_proj": dense(D, D),
        "out": dense(D, v),
        "simple_am": dense(D, v),
        "simple_lm": dense(D, v),
        "ctc": dense(D, v),
    }
    enc_len = rng.integers(int(0.8 * t), t + 1, b).astype(np.int32)
    label_len = rng.integers(int(0.8 * u), u + 1, b).astype(np.int32)
    batch = (
        jnp.asarray(rng.standard_normal((b, t, D)), jnp.float32),
        jnp.asarray(enc_len),
        jnp.asarray(rng.standard_normal((b, u + 1, D)), jnp.float32),
        jnp.asarray(rng.integers(1, v, (b, u)), jnp.int32),
        jnp.asarray(label_len),
    )
    return params, batch


def _linear(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def head_loss(head: str, params: dict, enc_btd, enc_len_b, pred_bud, labels_bu, label_len_b):
    """Mean per-utterance loss of one head."""
    if head == "ctc":
        loss, _ = ctc_loss(_linear(params["ctc"], enc_btd), enc_len_b, labels_bu, label_len_b)
        return jnp.mean(loss)
    enc_proj = _linear(params["enc_proj"], enc_btd)
    pred_proj = _linear(params["pred_proj"], pred_bud)

    def joiner(enc: jax.Array, pred: jax.Array) -> jax.Array:
        return _linear(params["out"], jnp.tanh(enc + pred))

    if head == "rnnt_full":
        loss, _ = rnnt_loss(
            joiner,
            enc_proj,
            enc_len_b,
            pred_proj,
            labels_bu,
            label_len_b,
            frames_per_chunk=FRAMES_PER_CHUNK,
        )
        return jnp.mean(loss)
    simple, pruned, _ = rnnt_pruned_loss(
        joiner,
        enc_proj,
        enc_len_b,
        pred_proj,
        functools.partial(_linear, params["simple_am"]),
        enc_btd,
        _linear(params["simple_lm"], pred_bud),
        labels_bu,
        label_len_b,
        prune_range=PRUNE_RANGE,
        frames_per_chunk=None if head == "rnnt_pruned_unchunked" else FRAMES_PER_CHUNK,
    )
    return jnp.mean(0.5 * simple + pruned)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure(head: str, b: int, t: int, u: int, v: int, repeats: int) -> dict:
    """Peak memory of the first call, then the median time of `repeats` calls (ms)."""
    params, batch = make_inputs(b, t, u, v)

    def loss_fn(params, enc, pred, enc_len, labels, label_len):
        return head_loss(head, params, enc, enc_len, pred, labels, label_len)

    step = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2)))
    args = (params, batch[0], batch[2], batch[1], batch[3], batch[4])
    compiled = step.lower(*args).compile()
    jax.block_until_ready(args)
    mem = compiled.memory_analysis()
    xla_bytes = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    device = jax.devices()[0]
    stats = device.memory_stats()
    # temp alone: what the computation adds to its arguments and outputs (which both
    # RNN-T heads share but for the simple projections' weights).
    row: dict = {"xla_mb": xla_bytes / 2**20, "xla_temp_mb": mem.temp_size_in_bytes / 2**20}
    # The runtime's one-time start-up on the first large matmul and its gradient (thread
    # pools, kernel libraries: about 12 MB on CPU) is not the loss's memory.
    warm = jax.jit(jax.grad(lambda x: jnp.sum(jnp.tanh(x @ x))))
    jax.block_until_ready(warm(jnp.ones((512, 512), jnp.float32)))
    can_reset_rss = os.path.exists("/proc/self/clear_refs")
    if can_reset_rss:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) to the current RSS
        rss_before = _status_kb("VmRSS")
    loss, _ = jax.block_until_ready(compiled(*args))
    if stats is not None and "peak_bytes_in_use" in stats:
        row["peak_mb"] = device.memory_stats()["peak_bytes_in_use"] / 2**20
        row["peak_method"] = "device.memory_stats()['peak_bytes_in_use'], first call"
    else:
        row["peak_mb"] = row["xla_mb"]
        row["peak_method"] = "compiled.memory_analysis(): temp + argument + output bytes"
    if can_reset_rss:
        row["rss_mb"] = (_status_kb("VmHWM") - rss_before) / 1024
    row["loss"] = float(loss)
    # one warm-up call, then the median of `repeats`
    row["ms"] = 1e3 * timing.median_seconds(lambda: jax.block_until_ready(compiled(*args)), repeats)
    return row


# ------------------------------------------------------------------------------------
# The driver: a fresh process per (case, head), or per case with --quick.
# ------------------------------------------------------------------------------------
def run_worker(heads: tuple[str, ...], case: tuple[int, int, int, int], repeats: int) -> list:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", ",".join(heads)]
    cmd += [str(x) for x in case] + ["--repeats", str(repeats)]
    return workers.last_json_line(cmd, 1800, f"{heads} {case}", 3000)


def run(
    cases: list[tuple[int, int, int, int]],
    repeats: int,
    out: str,
    heads: tuple[str, ...] = HEADS,
    shared_process: bool = False,
) -> dict:
    """Measures `heads` (rnnt_full, rnnt_pruned and ctc at least) on every case, prints the
    table, writes `out` and returns its JSON. shared_process: all heads of a case in one
    process (faster; on accelerators the later heads' peaks then include the earlier ones')."""
    rows, methods = [], set()
    load_at_start = environment.load_avg_1m()
    for b, t, u, v in cases:
        row: dict = {"B": b, "T": t, "U": u, "V": v}
        row["logsoftmax_4d_mb"] = b * t * (u + 1) * v * 4 / 2**20
        groups = [heads] if shared_process else [(h,) for h in heads]
        for group in groups:
            for head, got in zip(group, run_worker(group, (b, t, u, v), repeats), strict=True):
                methods.add(got.pop("peak_method"))
                for key, value in got.items():
                    row[f"{head}_{key}"] = round(value, 3) if key != "loss" else value
        row["pruned_peak_ratio"] = round(row["rnnt_full_peak_mb"] / row["rnnt_pruned_peak_mb"], 2)
        row["pruned_speedup"] = round(row["rnnt_full_ms"] / row["rnnt_pruned_ms"], 2)
        row["goal_peak_5x"] = "PASS" if row["pruned_peak_ratio"] >= 5 else "FAIL"
        row["goal_faster"] = "PASS" if row["pruned_speedup"] > 1 else "FAIL"
        rows.append(row)
        print(f"case B={b} T={t} U={u} V={v} done", flush=True)
    has_rss = "rnnt_full_rss_mb" in rows[0]
    result = {
        "benchmark": "losses",
        **environment.jax_host(),
        "date": environment.utc_date(),
        # Other processes' load skews CPU timings: the 1-minute load average at the start.
        "load_avg_1m_at_start": load_at_start,
        "repeats": repeats,
        "width": D,
        "prune_range": PRUNE_RANGE,
        "frames_per_chunk": FRAMES_PER_CHUNK,
        "process_per": "case" if shared_process else "case and head",
        "peak_method": "; ".join(sorted(methods))
        + ("; *_rss_mb: peak RSS increase over the first call (VmHWM after clear_refs)" * has_rss),
        "cases": rows,
    }
    rnnt_heads = [h for h in heads if h.startswith("rnnt")]
    print(f"\n{result['device']}, jax {result['jax']}, median of {repeats} (ms / peak MB)")
    print(f"peak: {result['peak_method']}")
    print(
        "| B, T, U, V | 4-D log-softmax MB | "
        + " | ".join(rnnt_heads)
        + " | ctc | full/pruned peak | speedup | goals (5x peak, faster) |"
    )
    print("|" + "---|" * (len(rnnt_heads) + 6))
    for r in rows:
        cells = [f"{r[f'{h}_ms']:.1f} / {r[f'{h}_peak_mb']:.1f}" for h in rnnt_heads]
        cells.append(f"{r['ctc_ms']:.1f} / {r['ctc_peak_mb']:.1f}")
        print(
            f"| {r['B']}, {r['T']}, {r['U']}, {r['V']} | {r['logsoftmax_4d_mb']:.1f} | "
            + " | ".join(cells)
            + f" | {r['pruned_peak_ratio']:.2f}x | {r['pruned_speedup']:.2f}x"
            + f" | {r['goal_peak_5x']}, {r['goal_faster']} |"
        )
    if has_rss:
        print("peak RSS increase MB (" + ", ".join(heads) + "):")
        for r in rows:
            rss = ", ".join(f"{r[f'{h}_rss_mb']:.1f}" for h in heads)
            print(f"  {r['B']}, {r['T']}, {r['U']}, {r['V']}: {rss}")
    results.save_result(out, result)
    return result


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: one small case, one process")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (default 5, quick 2)")
    ap.add_argument("--out", default=os.path.join(RESULTS, "losses.json"))
    ap.add_argument(
        "--worker", nargs=5, metavar=("HEADS", "B", "T", "U", "V"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    if args.worker:
        heads, *shape = args.worker
        rows = [measure(h, *map(int, shape), repeats=repeats) for h in heads.split(",")]
        print(json.dumps(rows))
        return None
    if args.quick:  # a smoke test: the three heads the goals need, in one process
        return run(QUICK_CASES, repeats, args.out, QUICK_HEADS, shared_process=True)
    return run(CASES, repeats, args.out)


if __name__ == "__main__":
    main()
