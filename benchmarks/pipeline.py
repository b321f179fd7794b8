"""Pipeline parallelism: the bubble as compiled, memory per device, and where pipelining
beats FSDP for Conformer-XL at 1,024 devices.

`python benchmarks/pipeline.py [--quick] [--model XL] [--batch B] [--seconds S]
[--out PATH]` prints two tables and writes `benchmarks/results/pipeline.json`.

1. Measured (XLA's own plans on 8 simulated CPU devices; compile only, no timing: the
   simulated devices share two cores, so wall time cannot show a bubble). For each layout
   of the 8 devices (stage x fsdp: 1 x 8, 2 x 4, 4 x 2) and schedule (GPipe with M
   microbatches, circular with R = 2 groups per stage), the train step of
   `configs/conformer.py:<model>` (CTC head, scanned layers, float32) is lowered and
   compiled with abstract arguments, as the train loop builds it:
   - bubble: from the compiled program. The pipeline's loop is the while loop whose body
     shifts activations between stages (a collective-permute); its trip count N times the
     stages S is every stage slot of one pass, of which M R S do work, so the bubble is
     1 - M R S / (N S). Compared with (S - 1) / (M R + S - 1).
   - memory per device: XLA's plan (`compiled.memory_analysis()`): arguments (parameters,
     optimizer state, batch), outputs, temporaries; and the collective bytes per step by
     kind (benchmarks/lib/hlo.py).
2. Projected (benchmarks/lib/cost_model.py's H100 nodes; stated constants, not measured):
   one step of XL at 1,024 devices, FSDP over every device inside the data-parallel
   group against S pipeline stages with FSDP inside each stage: compute time x (1 +
   bubble share), parameter all-gathers and gradient reduce-scatters over the FSDP group
   (latency-bound rings at 1,024), activation sends between stages, and the gradient
   all-reduce across data-parallel groups; the smallest microbatch count at which each S
   beats FSDP.

`--quick`: the tiny config (4 layers) instead of XL, one schedule per layout (~1 min).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

if __name__ == "__main__":  # 8 simulated devices, before jax starts
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.lib import cost_model, environment, hlo, lowering, results  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# (name, stage, fsdp, schedule, microbatches, repeats, gather weights once) on 8 devices;
# the "_every" layouts leave the FSDP all-gathers where XLA puts them (in the loop).
LAYOUTS = (
    ("fsdp8", 1, 8, "gpipe", 1, 1, True),
    ("stage2_fsdp4_gpipe", 2, 4, "gpipe", 4, 1, True),
    ("stage2_fsdp4_gpipe_every", 2, 4, "gpipe", 4, 1, False),
    ("stage2_fsdp4_circular", 2, 4, "circular", 4, 2, True),
    ("stage2_fsdp4_circular_every", 2, 4, "circular", 4, 2, False),
    ("stage4_fsdp2_gpipe", 4, 2, "gpipe", 4, 1, True),
    ("stage4_fsdp2_circular", 4, 2, "circular", 4, 2, True),
    ("stage4_fsdp2_circular_every", 4, 2, "circular", 4, 2, False),
)
QUICK_LAYOUTS = (
    "fsdp8",
    "stage2_fsdp4_circular",
    "stage2_fsdp4_circular_every",
    "stage4_fsdp2_gpipe",
)

_WHILE = re.compile(r"= .*? while\(.*?body=%?([\w.\-]+).*?known_trip_count\"?:\{\"?n\"?:\"?(\d+)")
_COMPUTATION = re.compile(r"^%?([\w.\-]+) .*\{\s*$")


def pipeline_trip_counts(hlo_text: str) -> list[int]:
    """Trip counts of the while loops whose body shifts activations between stages (a
    collective-permute in the body itself): the pipeline's forward and backward loops."""
    bodies: dict[str, str] = {}
    name, lines = None, []
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line.strip())
        if m and line.rstrip().endswith("{"):
            name, lines = m.group(1), []
        elif line.strip() == "}" and name:
            bodies[name] = "\n".join(lines)
            name = None
        elif name:
            lines.append(line)
    counts = []
    for m in _WHILE.finditer(hlo_text):
        body = bodies.get(m.group(1), "")
        if "collective-permute" in body:
            counts.append(int(m.group(2)))
    return counts


def make_config(model: str, quick: bool, layout: tuple):
    from configs import conformer, demo

    _, stage, fsdp, schedule, microbatches, repeats, once = layout
    config = demo.get_config("tiny") if quick else conformer.get_config(model)
    config.model.head = "ctc"
    config.model.dtype = "float32"
    config.model.conformer.scan_layers = True
    if quick:
        config.model.conformer.update(num_layers=4, dim=32, num_heads=2)
    config.mesh.replica, config.mesh.stage, config.mesh.data = 1, stage, 1
    config.mesh.fsdp, config.mesh.tensor = fsdp, 1
    config.pipeline.update(schedule=schedule, microbatches=microbatches, repeats=repeats)
    config.pipeline.gather_weights_once = once
    return config


def compile_layout(config, batch_spec) -> dict:
    """The train step compiled on the config's 8-device mesh with abstract arguments
    (`lowering.compile_train_step`): HLO text, memory plan, parameter count."""
    import jax

    from jaxspeech.config import build

    mesh = build.mesh_from_config(config, devices=jax.devices()[:8])
    compiled, params, compile_s = lowering.compile_train_step(config, mesh, batch_spec, donate=True)
    mem = compiled.memory_analysis()
    return {
        "hlo": compiled.as_text(),
        "compile_s": compile_s,
        "memory": {
            "arguments": int(mem.argument_size_in_bytes),
            "outputs": int(mem.output_size_in_bytes),
            "temporaries": int(mem.temp_size_in_bytes),
            "aliased": int(mem.alias_size_in_bytes),
        },
        "param_count": int(sum(x.size for x in jax.tree.leaves(params))),
    }


def measure(model: str, quick: bool, batch_spec) -> list[dict]:
    rows = []
    for layout in LAYOUTS:
        name, stage, fsdp, schedule, m, r, once = layout
        if quick and name not in QUICK_LAYOUTS:
            continue
        row = {"layout": name, "stage": stage, "fsdp": fsdp, "schedule": schedule}
        row |= {"microbatches": m, "repeats": r, "gather_weights_once": once}
        try:
            got = compile_layout(make_config(model, quick, layout), batch_spec)
        except Exception as e:  # noqa: BLE001 - a layout that fails is reported, not fixed
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"{name}: FAILED {row['error'][:300]}", flush=True)
            rows.append(row)
            continue
        text = got.pop("hlo")
        summary = hlo.summarize(hlo.parse_collectives(text))
        counts = pipeline_trip_counts(text)
        row |= got | {"collectives": summary, "pipeline_trip_counts": counts}
        if stage > 1:
            iterations = max(counts) if counts else None
            row["bubble_formula"] = (stage - 1) / (m * r + stage - 1)
            row["bubble_compiled"] = (
                1 - m * r * stage / (iterations * stage) if iterations else None
            )
        rows.append(row)
        print(f"{name}: compiled in {got['compile_s']:.0f} s, loops {counts}", flush=True)
    return rows


# =======================================================================================
# The projection (no jax).
# =======================================================================================
def _fsdp_comm(param_bytes: float, group: int, hw: dict, layers: int) -> float:
    """Per step: all-gather of every layer's parameters in the forward and the backward
    pass and the gradients' reduce-scatter, over an FSDP group of `group` devices (one
    ring per layer: at 1,024 devices each ring is latency-bound)."""
    if group <= 1:
        return 0.0
    intra = group <= cost_model.NODE
    bw = hw["intra_bw"] if intra else min(hw["intra_bw"], hw["inter_bw"] / cost_model.NODE)
    lat = hw["intra_latency"] if intra else hw["inter_latency"]
    per_layer = param_bytes / layers
    return 3 * layers * cost_model.ring_half_time(per_layer, group, bw, lat)


def project(param_bytes: float, layers: int, compute_s: float, act_bytes: float, hw: dict):
    """Step time of XL on 1,024 devices, one utterance per device per step: FSDP over
    groups of 64 devices (16 data-parallel groups), against S stages with FSDP over 64 / S
    inside each (a pipeline of S stages carries S utterances through L / S layers per
    device: the same compute, stretched by the bubble). `compute_s`: one device's compute
    per step without pipelining; `act_bytes`: one utterance's activations at a stage
    boundary."""
    n, group = 1024, 64
    groups = n // group
    grad_ar = cost_model.ring_allreduce_time(
        param_bytes / group, groups, hw["inter_bw"] / 8, hw["inter_latency"]
    )
    rows = []
    for stages in (1, 2, 4, 8):
        fsdp = group // stages
        for m in (1, 4, 8, 16, 32):
            if stages == 1 and m > 1:
                continue
            bubble = (stages - 1) / (m + stages - 1)
            comp = compute_s / (1 - bubble)
            comm = _fsdp_comm(param_bytes / stages, fsdp, hw, max(1, layers // stages))
            sends = 0.0
            if stages > 1:  # a device's S utterances leave its stage, gradients come back
                sends = 2 * stages * act_bytes / (hw["inter_bw"] / cost_model.NODE)
            exposed = max(0.0, comm + sends + grad_ar - cost_model.OVERLAP * comp)
            rows.append(
                {
                    "stages": stages,
                    "fsdp": fsdp,
                    "microbatches": m,
                    "bubble": bubble,
                    "compute_s": comp,
                    "fsdp_comm_s": comm,
                    "stage_sends_s": sends,
                    "grad_allreduce_s": grad_ar,
                    "step_s": comp + exposed,
                }
            )
    return rows


def print_tables(rows: list[dict], projection: list[dict]) -> None:
    print(
        "\n| layout | schedule (M, R) | pipeline loop trips | bubble compiled / formula |"
        " arguments | temporaries | collective-permute / all-gather / reduce-scatter MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['layout']} | failed: {r['error'][:80]} | | | | | |")
            continue
        mem = r["memory"]
        by = r["collectives"].get("bytes_by_kind", {})
        bub = (
            f"{r['bubble_compiled']:.3f} / {r['bubble_formula']:.3f}"
            if r.get("bubble_formula") is not None and r.get("bubble_compiled") is not None
            else "-"
        )
        coll = " / ".join(
            f"{by.get(k, 0) / 2**20:.1f}"
            for k in ("collective-permute", "all-gather", "reduce-scatter")
        )
        print(
            f"| {r['layout']} | {r['schedule']} ({r['microbatches']}, {r['repeats']}) | "
            f"{r['pipeline_trip_counts']} | {bub} | {mem['arguments'] / 2**30:.2f} GiB | "
            f"{mem['temporaries'] / 2**30:.2f} GiB | {coll} |"
        )
    print("\n| stages | fsdp | microbatches | bubble | step s (projected) |")
    print("|---|---|---|---|---|")
    for p in projection:
        print(
            f"| {p['stages']} | {p['fsdp']} | {p['microbatches']} | {p['bubble']:.3f} | "
            f"{p['step_s']:.3f} |"
        )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default="XL")
    ap.add_argument("--batch", type=int, default=16, help="utterances per step (global)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", default=os.path.join(RESULTS, "pipeline.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    batch_spec = (args.batch, args.seconds, 500)
    rows = measure(args.model, args.quick, batch_spec)
    base = next((r for r in rows if r["layout"] == "fsdp8" and "error" not in r), None)
    projection = []
    if base is not None:
        param_bytes = 4.0 * base["param_count"]
        # Compute per device at 1,024 devices: 6 FLOPs per parameter per frame of 40 ms
        # (the encoder dominates), 16 s utterances, 1 utterance per device per step.
        frames = 16.0 / 0.04
        compute_s = 6 * base["param_count"] * frames / cost_model.HARDWARE["h100_ib"]["flops_per_s"]
        act_bytes = frames * 1024 * 2  # one utterance's (T, D=1024) bf16 activations
        projection = project(param_bytes, 24, compute_s, act_bytes, cost_model.HARDWARE["h100_ib"])
    print_tables(rows, projection)
    import jax

    out = {
        "benchmark": "pipeline",
        "device": environment.device_label(jax.devices()[0]),
        "machine": environment.machine(),
        "date": environment.utc_date(),
        "model": "tiny" if args.quick else args.model,
        "batch": {"utterances": args.batch, "seconds": args.seconds},
        "measured": rows,
        "projection": projection,
        "wall_s": round(time.time() - t0, 1),
    }
    results.write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
