"""The train step compiled for an NVIDIA GPU on a machine without one: launches, loops,
custom calls and XLA's memory plan.

`make gpu-plan` (or `.venv-gpuplan/bin/python benchmarks/gpu_plan.py [--models S,M,L]
[--heads ctc+rnnt,ctc] [--target h100] [--batch 64] [--seconds 16] [--dtype bfloat16]
[--config.KEY=VALUE ...] [--variant NAME:KEY=VALUE,KEY=VALUE ...]
[--tree NAME:DIR_OR_COMMIT ...] [--no-baseline] [--hlo-dump DIR] [--out PATH]`) prints
a table and writes `benchmarks/results/gpu_plan.json`. It needs the CUDA plugin of
`.venv-gpuplan` (`make install-gpuplan`), no GPU.

What compiles: for each model of configs/conformer.py and each head, the real train step
as the train loop builds it (benchmarks/lib/lowering.py: its TrainState shardings,
AdamW, SpecAugment, dropout, the state donated) over `ShapeDtypeStruct`s of B x S seconds
(labels padded to S x data.max_tokens_per_second, a 500-piece vocabulary, as
benchmarks/train_step.py), in the model's dtype, on the abstract devices of the target
GPU (benchmarks/lib/gpu_target.py; one device, mesh all `data`). Nothing runs.
`--config.KEY=VALUE` changes a config entry of every row; each `--variant` adds a row per
model and head with its own changes on top; each `--tree` adds a row per model and head
compiled from another source tree (a directory, or a git commit of this checkout
extracted with `git archive` into a temporary directory: e.g. `--tree main:HEAD` is the
last commit without the work tree's changes). `--no-baseline` leaves out the rows of this
checkout without changes. So a change is measured against today's step in the same run.

Reported per row (benchmarks/lib/hlo_launches.py reads `compiled.as_text()`): launches per step
(kernels of the entry computation + each while loop's body times its trip count; an
upper bound: no autotuning, no command buffers), the launches inside loops of >= 100
trips, the per-frame loops (>= 100 trips with more than 2 kernels a trip: the issue's
goal allows none), the largest loops (trips x kernels a trip), custom calls by family
(cuBLAS, cuDNN, Triton, Mosaic GPU), XLA's memory plan (`memory_analysis()`: argument,
output, alias and temporary bytes; peak = arguments + outputs + temporaries - aliases) and
the compile seconds on this machine. Each row compiles in a fresh worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, gpu_target, hlo_launches, results, workers  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
VOCAB = 500  # benchmarks/lib/synthetic_batch.py's BPE-500
GIB = 2**30
WORKER_TIMEOUT_S = 1800


# ------------------------------------------------------------------------------------
# Pure helpers (tested in tests/test_gpu_plan.py).
# ------------------------------------------------------------------------------------
def parse_variant(text: str) -> tuple[str, list[str]]:
    """ "NAME:KEY=VALUE,KEY=VALUE" -> (NAME, ["KEY=VALUE", ...]). A value may not contain
    a comma (use --config.KEY=VALUE for such values on every row)."""
    name, sep, body = text.partition(":")
    if not sep or not name.strip() or not body.strip():
        raise ValueError(f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
    items = [s.strip() for s in body.split(",") if s.strip()]
    bad = [s for s in items if "=" not in s]
    if bad:
        raise ValueError(f"--variant {text!r}: {bad[0]!r} is not KEY=VALUE")
    return name.strip(), items


def config_overrides(extra: list[str]) -> list[str]:
    """The `--config.KEY=VALUE` arguments argparse left over -> ["KEY=VALUE", ...]; any
    other leftover argument is an error."""
    out = []
    for arg in extra:
        if not arg.startswith("--config.") or "=" not in arg:
            raise ValueError(f"unrecognized argument {arg!r} (config entries: --config.KEY=VALUE)")
        out.append(arg[len("--config.") :])
    return out


def parse_tree(text: str) -> tuple[str, str]:
    """ "NAME:DIR_OR_COMMIT" -> (NAME, DIR_OR_COMMIT)."""
    name, sep, where = text.partition(":")
    if not sep or not name.strip() or not where.strip():
        raise ValueError(f"--tree {text!r}: expected NAME:DIR or NAME:COMMIT")
    return name.strip(), where.strip()


def plan_rows(
    models: list[str],
    heads: list[str],
    variants: list[tuple[str, list[str]]],
    baseline: bool,
    trees: list[tuple[str, str]] = (),
) -> list[dict]:
    """The rows to compile: for each model and head the baseline (unless not `baseline`),
    each variant, then each other tree: {model, head, variant, overrides, tree} (tree: a
    source directory, None for this checkout)."""
    rows = []
    for model in models:
        for head in heads:
            runs = [("baseline", [], None)] if baseline else []
            runs += [(name, list(ov), None) for name, ov in variants]
            runs += [(name, [], path) for name, path in trees]
            rows += [
                {"model": model, "head": head, "variant": name, "overrides": ov, "tree": tree}
                for name, ov, tree in runs
            ]
    return rows


def extract_commit(commit: str, into: str) -> str:
    """`git archive` of `commit` of this checkout extracted into directory `into` (read
    only for the repository: no worktree, no checkout). Returns the commit's short hash."""
    import io
    import subprocess
    import tarfile

    def git(*args: str) -> bytes:
        proc = subprocess.run(["git", "-C", ROOT, *args], capture_output=True)
        if proc.returncode:
            raise ValueError(f"git {' '.join(args)}: {proc.stderr.decode().strip()}")
        return proc.stdout

    short = git("rev-parse", "--short", f"{commit}^{{commit}}").decode().strip()
    with tarfile.open(fileobj=io.BytesIO(git("archive", short))) as tar:
        tar.extractall(into, filter="data")
    return short


def summarize_hlo(hlo_text: str) -> dict:
    """The plan's figures of one compiled step's HLO text (see the module docstring)."""
    counts = hlo_launches.count_launches(hlo_text)
    loops = hlo_launches.loop_summary(counts)
    return {
        "launches": counts["launches"],
        "gemm_tflop": round(counts["gemm_flops"] / 1e12, 3),
        "long_loop_launches": counts["long_loop_launches"],
        "per_frame_loops": loops["per_frame_loops"],
        "per_frame_loop_launches": loops["per_frame_loop_launches"],
        "largest_loops": [
            {k: lp[k] for k in ("trip_count", "kernels_per_trip", "launches", "depth", "op_name")}
            for lp in loops["largest"]
        ],
        "loops": len(counts["loops"]),
        "custom_call_families": hlo_launches.custom_call_families(counts["custom_calls"]),
        "custom_calls": counts["custom_calls"],
        "custom_fusions": counts["custom_fusions"],
        "by_opcode": counts["by_opcode"],
        "flags": counts["flags"],
    }


def _loops_text(loops: list[dict], n: int = 3) -> str:
    return ", ".join(f"{lp['trip_count']}x{lp['kernels_per_trip']}" for lp in loops[:n]) or "-"


def table(rows: list[dict]) -> list[str]:
    """Markdown lines of the rows (an errored row shows its error)."""
    out = [
        "| model | head | variant | launches | in loops >= 100 trips | per-frame loops "
        "| largest loops (trips x kernels) | cuBLAS / cuDNN / Triton / Mosaic | GEMM TFLOP "
        "| temp GiB | peak GiB | compile s |",
        "|" + "---|" * 12,
    ]
    for r in rows:
        lead = f"| {r['model']} | {r['head']} | {r['variant']} "
        if "error" in r:
            out.append(lead + f"| error: {r['error'][:120]} |" + " |" * 8)
            continue
        fam = r["custom_call_families"]
        calls = " / ".join(str(fam.get(k, 0)) for k in ("cublas", "cudnn", "triton", "mosaic_gpu"))
        out.append(
            lead + f"| {r['launches']:,} | {r['long_loop_launches']:,} | {r['per_frame_loops']} "
            f"| {_loops_text(r['largest_loops'])} | {calls} | {r['gemm_tflop']:.2f} "
            f"| {r['temp_bytes'] / GIB:.1f} "
            f"| {r['peak_bytes'] / GIB:.1f} | {r['compile_s']:.0f} |"
        )
    return out


# ------------------------------------------------------------------------------------
# The worker: one row, compiled in its own process.
# ------------------------------------------------------------------------------------
def compile_row(
    model: str,
    head: str,
    overrides: list[str],
    target: str,
    batch: int,
    seconds: float,
    dtype: str,
    hlo_dump: str = "",
    tree: str | None = None,
) -> dict:
    """Compiles configs/conformer.py:<model>'s train step with `head` and `overrides` for
    `target` and returns its figures. `tree`: a source tree whose `jaxspeech` and `configs`
    to compile (benchmarks.lib stays this checkout's, imported above)."""
    if tree:
        sys.path.insert(0, os.path.abspath(tree))
    from benchmarks.lib import lowering
    from benchmarks.lib.config_overrides import apply_overrides
    from configs import conformer
    from jaxspeech.config import build

    config = conformer.get_config(model)
    config.model.dtype = dtype
    config.model.head = head
    apply_overrides(config, list(overrides))
    config.mesh.replica, config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1, 1
    gpu_target.patch_cudnn_version(target)
    devices = gpu_target.topology(target)
    mesh = build.mesh_from_config(config, devices=devices)
    compiled, _, compile_s = lowering.compile_train_step(
        config, mesh, (batch, seconds, VOCAB), donate=True
    )
    text = compiled.as_text()
    if hlo_dump:
        os.makedirs(hlo_dump, exist_ok=True)
        parts = [model, head.replace("+", "_")] + [o.replace("/", "_") for o in overrides]
        name = "-".join(parts + ([os.path.basename(os.path.abspath(tree))] if tree else []))
        with open(os.path.join(hlo_dump, f"{name}.hlo.txt"), "w") as f:
            f.write(text)
    mem = compiled.memory_analysis()
    row = summarize_hlo(text)
    row |= {
        "device": devices[0].device_kind,
        "compile_s": round(compile_s, 1),
        "argument_bytes": mem.argument_size_in_bytes,
        "output_bytes": mem.output_size_in_bytes,
        "alias_bytes": mem.alias_size_in_bytes,
        "temp_bytes": mem.temp_size_in_bytes,
        "peak_bytes": mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        + mem.temp_size_in_bytes
        - mem.alias_size_in_bytes,
    }
    return row


def run_worker(args: argparse.Namespace, row: dict) -> dict:
    """One row's figures from a fresh process; a failed compile is the row's `error`."""
    spec = json.dumps(
        {
            "model": row["model"],
            "head": row["head"],
            "overrides": args.config + row["overrides"],
            "target": args.target,
            "batch": args.batch,
            "seconds": args.seconds,
            "dtype": args.dtype,
            "hlo_dump": args.hlo_dump,
            "tree": row["tree"],
        }
    )
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", spec]
    try:
        return workers.last_json_line(cmd, WORKER_TIMEOUT_S, f"{row['model']} {row['head']}", 3000)
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else str(e)}


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="S,M,L", help="sizes of configs/conformer.py")
    ap.add_argument("--heads", default="ctc+rnnt,ctc", help="model.head values, comma-separated")
    ap.add_argument("--target", default="h100", help="a GPU target of benchmarks/lib/targets/")
    ap.add_argument("--batch", type=int, default=64, help="utterances per step")
    ap.add_argument("--seconds", type=float, default=16.0, help="seconds per utterance")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="also compile each model and head with these config changes (repeatable)",
    )
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME:DIR_OR_COMMIT",
        help="also compile each model and head from this source tree or git commit",
    )
    ap.add_argument(
        "--no-baseline", action="store_true", help="leave out this checkout's unchanged rows"
    )
    ap.add_argument("--hlo-dump", default="", metavar="DIR", help="write each row's HLO text")
    ap.add_argument("--out", default=os.path.join(RESULTS, "gpu_plan.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args, extra = ap.parse_known_args(argv)
    gpu_target.configure()  # before jax starts: the flags, and no GPU runtime sought
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(compile_row(**spec)))
        return None
    try:
        args.config = config_overrides(extra)
        variants = [parse_variant(v) for v in args.variant]
        trees = [parse_tree(t) for t in args.tree]
    except ValueError as e:
        ap.error(str(e))
    from configs import conformer

    models = [m.strip().upper() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in conformer.SIZES]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {list(conformer.SIZES)}")
    if args.target not in gpu_target.target_names():
        ap.error(f"unknown --target {args.target!r}; choose from {gpu_target.target_names()}")
    if args.no_baseline and not (variants or trees):
        ap.error("--no-baseline needs a --variant or a --tree")
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    with tempfile.TemporaryDirectory(prefix="gpu_plan_trees_") as tmp:
        try:
            args.trees = resolve_trees(trees, tmp)
        except ValueError as e:
            ap.error(str(e))
        plan = plan_rows(
            models,
            heads,
            variants,
            not args.no_baseline,
            [(name, t["path"]) for name, t in args.trees.items()],
        )
        from benchmarks.lib.config_overrides import apply_overrides

        for row in plan:  # a mistyped key: one line now, not an error per compile
            if row["tree"] is None:
                try:
                    apply_overrides(
                        conformer.get_config(row["model"]), args.config + row["overrides"]
                    )
                except SystemExit as e:  # its message names the flag --set of train_step.py
                    ap.error(f"{row['variant']} rows: {str(e).split(': ', 1)[-1]}")
        return run(args, plan)


def resolve_trees(trees: list[tuple[str, str]], tmp: str) -> dict:
    """{name: {"path"[, "commit"]}} of `--tree` arguments: a directory as it is, a commit
    extracted under `tmp`."""
    out = {}
    for i, (name, where) in enumerate(trees):
        if os.path.isdir(where):
            out[name] = {"path": os.path.abspath(where)}
            continue
        path = os.path.join(tmp, f"tree{i}")
        try:
            out[name] = {"commit": extract_commit(where, path), "path": path}
        except ValueError as e:
            raise ValueError(f"--tree {name}:{where}: not a directory, and {e}") from e
    return out


def run(args: argparse.Namespace, plan: list[dict]) -> dict:
    import jax

    t_start = time.perf_counter()
    print(
        f"{args.target} plan, jax {jax.__version__}: {len(plan)} rows, batch {args.batch} x "
        f"{args.seconds:g} s, {args.dtype}" + (f", {' '.join(args.config)}" if args.config else ""),
        flush=True,
    )
    rows = []
    labels = {t["path"]: t.get("commit", t["path"]) for t in args.trees.values()}
    for row in plan:
        row = row | run_worker(args, row)
        row["tree"] = labels.get(row["tree"], row["tree"])  # a commit, not its temporary copy
        rows.append(row)
        if "error" in row:
            print(f"{row['model']} {row['head']} {row['variant']}: {row['error']}", flush=True)
        else:
            print(
                f"{row['model']} {row['head']} {row['variant']}: {row['launches']:,} launches, "
                f"temp {row['temp_bytes'] / GIB:.1f} GiB, compile {row['compile_s']:.0f} s",
                flush=True,
            )
    result = {
        "benchmark": "gpu_plan",
        "target": args.target,
        "device": rows[0].get("device") if rows else None,
        "jax": jax.__version__,
        "date": environment.utc_date(),
        "machine": environment.machine(),
        "cpu_count": os.cpu_count(),
        "batch": args.batch,
        "seconds": args.seconds,
        "dtype": args.dtype,
        "overrides": args.config,
        "trees": {k: v.get("commit", v["path"]) for k, v in args.trees.items()},
        "xla_flags": list(gpu_target.XLA_FLAGS),
        "rows": rows,
    }
    print()
    print("\n".join(table(rows)))
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(f"total {result['wall_s']:.0f} s")
    results.save_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
