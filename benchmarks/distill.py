"""Semi-supervised training on the demo corpus: teacher targets, a student with 25% of the
transcripts, against the same student on its labeled share alone and the fully supervised
model.

`python benchmarks/distill.py [--teacher runs/demo] [--data data/demo/shards] [--labeled 12]
[--top_k 4] [--steps 1350] [--workdir runs/distill] [--out benchmarks/results/distill.json]`

1. Splits the demo's training voices (data/demo/raw/train/manifest.jsonl): the first
   `--labeled` of the 48 (sorted by name; 12 = 25%) keep their transcripts (split
   `train_l25`), the other voices are the untranscribed audio (`train_u75`); both are
   prepared into the data directory with its tokenizer (`data_prep.prepare`).
2. Runs `python -m jaxspeech.teach` (top 4 of the 30 characters: with so small a
   vocabulary the reference's k = 20 would store more than full posteriors) with the
   teacher (the demo model, which was
   trained on every voice's transcripts: the reference's teacher is likewise trained on
   transcribed data before it labels the rest) over `train_u75`: throughput, and storage
   per hour of audio against full float16 posteriors.
3. Trains two students with the demo recipe and `--steps` steps: `labeled_only` on
   train_l25; `distill` on train_l25 mixed with train_u75's targets by the schedule
   (`--schedule`, the config default "0.8:4,1.0:1": a labeled batch every 4 steps, the last
   20% labeled only). Each is evaluated on dev and test (greedy CTC).
4. Prints the table (dev/test CER and WER, the share of the labeled-only -> fully
   supervised gap the student recovers) and writes the JSON. The fully supervised row is
   the teacher run's own evaluation at its last step (`RUN/eval/<split>-step<N>.json`).
   Goal (printed, never asserted): the student recovers at least half of the gap.
A finished step (prepared split, targets, trained run) is reused on a rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results  # noqa: E402
from jaxspeech.runs import lifecycle as status_lib  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
LABELED, OTHER = "train_l25", "train_u75"


def run(*args: str) -> float:
    """`python -m args` from the repository root; returns its wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def split_voices(manifest: str, labeled: int, out_dir: str) -> dict:
    """Two manifests by voice (absolute audio paths); returns {split: (voices, utterances)}."""
    base = os.path.dirname(os.path.abspath(manifest))
    rows = [json.loads(line) for line in open(manifest, encoding="utf-8") if line.strip()]
    voices = sorted({r["speaker"] for r in rows})
    chosen = set(voices[:labeled])
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for split, keep in ((LABELED, True), (OTHER, False)):
        path = os.path.join(out_dir, f"{split}.jsonl")
        mine = [r for r in rows if (r["speaker"] in chosen) == keep]
        with open(path, "w", encoding="utf-8") as f:
            for r in mine:
                f.write(json.dumps(r | {"audio_filepath": os.path.join(base, r["audio_filepath"])}))
                f.write("\n")
        out[split] = {
            "manifest": path,
            "voices": len({r["speaker"] for r in mine}),
            "utterances": len(mine),
        }
    return out


def prepare(data: str, split: str, manifest: str) -> None:
    if os.path.exists(os.path.join(data, split, "stats.json")):
        return
    run(
        "data_prep.prepare",
        "--format=manifest",
        f"--input={manifest}",
        f"--output={data}",
        f"--split={split}",
        "--direct_running_mode=in_memory",
        "--direct_num_workers=1",
    )


def train(workdir: str, data: str, steps: int, *extra: str) -> float | None:
    """Train (unless finished) and evaluate dev and test; returns training wall seconds."""

    done = status_lib.run_status(workdir)["state"] == "finished"
    wall = None
    if not done:
        wall = run(
            "jaxspeech.train",
            "--config=configs/demo.py",
            f"--workdir={workdir}",
            f"--config.data.dir={data}",
            f"--config.train.num_steps={steps}",
            *extra,
        )
    run("jaxspeech.evaluate", f"--workdir={workdir}", f"--data={data}", "--split=dev,test")
    return wall


def scores(workdir: str) -> dict:
    """{split: {wer, cer}} of the run's last evaluation (greedy) of dev and test."""
    out = {}
    for split in ("dev", "test"):
        files = [
            f
            for f in os.listdir(os.path.join(workdir, "eval"))
            if f.startswith(f"{split}-step") and f.endswith(".json") and f.count("-") == 1
        ]
        last = max(files, key=lambda f: int(f.split("step")[1].split(".")[0]))
        with open(os.path.join(workdir, "eval", last)) as f:
            r = json.load(f)
        out[split] = {"wer": r["wer"], "cer": r["cer"], "file": last}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="runs/demo")
    ap.add_argument("--data", default="data/demo/shards")
    ap.add_argument("--manifest", default="data/demo/raw/train/manifest.jsonl")
    ap.add_argument("--labeled", type=int, default=12, help="voices that keep transcripts")
    ap.add_argument("--top_k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1350)
    ap.add_argument("--schedule", default="0.8:4,1.0:1")
    ap.add_argument("--workdir", default="runs/distill")
    ap.add_argument("--out", default=os.path.join(RESULTS, "distill.json"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    splits = split_voices(args.manifest, args.labeled, os.path.join(args.workdir, "manifests"))
    for split, info in splits.items():
        prepare(args.data, split, info["manifest"])
        print(f"{split}: {info['voices']} voices, {info['utterances']} utterances", flush=True)

    targets = os.path.join(args.workdir, "targets")
    summary_path = os.path.join(targets, OTHER, "targets.json")
    targets_wall = None
    if not os.path.exists(summary_path):
        targets_wall = run(
            "jaxspeech.teach",
            f"--teacher={args.teacher}",
            f"--data={args.data}",
            f"--split={OTHER}",
            f"--top_k={args.top_k}",
            f"--output={targets}",
        )
    with open(summary_path) as f:
        summary = json.load(f)
    print(f"targets: {json.dumps(summary.get('report', summary))[:600]}", flush=True)

    runs = {
        "labeled_only": [f"--config.data.train_split={LABELED}"],
        "distill": [
            f"--config.data.train_split={LABELED}",
            f"--config.distill.other_split={OTHER}",
            f"--config.distill.targets={targets}",
            f"--config.distill.schedule={args.schedule}",
        ],
    }
    rows = {}
    for name, extra in runs.items():
        workdir = os.path.join(args.workdir, name)
        print(f"{name}: training in {workdir}", flush=True)
        wall = train(workdir, args.data, args.steps, *extra)
        rows[name] = {"scores": scores(workdir), "train_wall_s": wall, "flags": extra}
        print(f"{name}: {rows[name]['scores']}", flush=True)
    rows["supervised"] = {"scores": scores(args.teacher), "run": args.teacher}

    print_table(rows, args.labeled)
    result = {
        "benchmark": "distill",
        "cpu_count": os.cpu_count(),
        "machine": environment.machine(),
        "date": environment.utc_date(),
        "splits": splits,
        "targets": {"summary": summary, "wall_s": targets_wall},
        "steps": args.steps,
        "schedule": args.schedule,
        "runs": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    results.save_result(args.out, result)
    return result


def print_table(rows: dict, labeled: int) -> None:
    """The students' table and the goal line; adds each row's `gap_recovered`: the share of
    the labeled-only -> fully supervised test CER gap it closes."""
    print("\n| student | transcripts | dev CER / WER | test CER / WER | gap recovered (test CER) |")
    print("|---|---|---|---|---|")
    lo = rows["labeled_only"]["scores"]["test"]["cer"]
    hi = rows["supervised"]["scores"]["test"]["cer"]
    for name, label in (
        ("labeled_only", f"{labeled} voices"),
        ("distill", f"{labeled} voices + teacher targets"),
        ("supervised", "all 48 voices"),
    ):
        s = rows[name]["scores"]
        recovered = (lo - s["test"]["cer"]) / (lo - hi) if lo != hi else float("nan")
        rows[name]["gap_recovered"] = recovered
        print(
            f"| {name} | {label} | {s['dev']['cer']:.2%} / {s['dev']['wer']:.2%} "
            f"| {s['test']['cer']:.2%} / {s['test']['wer']:.2%} | {recovered:.0%} |"
        )
    got = rows["distill"]["gap_recovered"]
    print(f"goal: recover >= 50% of the gap: {got:.0%} {'PASS' if got >= 0.5 else 'FAIL'}")


if __name__ == "__main__":
    main()
