"""Chaos: train through random SIGKILLs and SIGTERMs, then prove the resume was exact.

`python benchmarks/chaos.py [--quick] [--steps S] [--disruptions D] [--seed K]
[--data SHARDS] [--workdir DIR] [--out PATH]` prints a table of disruptions and a
summary, and writes `benchmarks/results/chaos.json`.

What runs: `python -m jaxspeech.train --config configs/demo.py:tiny` with
`train.num_steps=S`, `train.checkpoint_every=C` (4), `train.log_every=1` (a progress line
per step), `monitor.log_batch_ids=True` (RUN/batch_ids/p0.jsonl: the utterances of every
step), `monitor.samples_every=0` and `train.eval_at_end=False`, on one CPU device
(JAX_PLATFORMS=cpu, XLA_FLAGS=""), as users run it. Without --data a tiny corpus is
synthesized and prepared first, as tests/e2e/conftest.py does (0.06 h, char tokenizer).

1. Reference: the command once, uninterrupted, in DIR/reference; its wall time is timed
   (process start to exit).
2. Chaos: the same command in DIR/chaos, as subprocesses whose merged stdout/stderr is read
   line by line in a thread that stamps each line's arrival time, while the driver reads
   the lifecycle events the trainer appends to DIR/chaos/events.jsonl
   (`jaxspeech.runs.events.read_events`, polled every POLL_S). The console gives only the
   progress line of each step (when it finished); where a run started, its saves,
   commits, resume, preemption and corrupt-checkpoint fallbacks come from the events.
   D disruptions, their kinds drawn from --seed (with D >= 3 at least one of each; always
   at least one kill during a save):
   - `sigkill_step`: SIGKILL once the progress line of a random step k has arrived;
   - `sigkill_save`: SIGKILL as soon as the `checkpoint_saved` event of step N appears,
     i.e. while Orbax is still writing step N asynchronously;
   - `sigterm_step`: SIGTERM once step k's progress line has arrived (the trainer finishes
     the step in flight, saves, writes a `preempted` event and exits 0).
   After each disruption the same command is started again; after the D-th it runs to the
   end (its `finished` event). The trigger of run i is drawn (from the same seeded
   generator) once the run says where it starts (its `started` event, step A): k
   uniformly from the i-th of D equal slices of steps 1..S-1, moved to start after A, so
   the disruptions spread over the whole run and every run makes progress past the step
   it resumed from (a kill before the first step would only repeat the compilation).
   `sigkill_save` waits for the first save of the schedule (a multiple of C) from the
   slice's start on; with none left before S it falls back to `sigkill_step`.
   With --damaged_records N (default 3; 0: off) both runs train on a copy of the corpus
   whose largest train shard has 64 bytes inverted at N places spread over it (what a bad
   disk or an interrupted copy leaves; `damage_corpus`), with
   `data.max_corrupt_fraction=0.2`: the unreadable records are skipped and counted.
3. Verify: the final parameters (and feature statistics) of both runs, read with
   `jaxspeech.runs.loading.load_run`, equal bit for bit (every leaf: dtype, shape,
   `np.array_equal` and the raw bytes), and `jaxspeech.runs.events.read_batch_ids` gives the
   same utterance ids for every step 1..S (the same data order: nothing skipped or
   repeated across restarts); a step trained twice (before a kill and after it) must have
   read the same utterances both times. With damage: both runs skipped the same records
   (RUN/data_faults/p0.jsonl) at the same steps (`records_skipped` events), and a
   disruption came after a skip (the resumed run met the damage again, or resumed past it).

4. Writer scenarios (`--writers`, on by default; `--no-writers` skips them): two trainers
   started 1 s apart on a copy of the finished reference run (the second must refuse,
   holding off on every file), and the disk filling up while checkpoint 2C is being
   written (a small tmpfs: needs root, else the row says it was skipped); see
   `benchmarks/lib/writer_chaos.py`. Their rows follow the disruptions' table.

Recorded per disruption: kind, trigger_step (the step whose progress line or
`checkpoint_saved` event made the driver signal; for `sigkill_save` the step being saved),
last_step (the last step the run printed as completed, lines read to EOF, so it includes a
step that finished between the signal being sent and the process dying), committed (the
latest committed checkpoint in RUN/checkpoints once the process was gone: what a restart
finds; `committed_reported` is the latest `checkpoint_committed` event by then, which can
miss a commit Orbax finished just before a SIGKILL), resumed (the step the next run
restored: its `started` event, confirmed by its `resumed` event), steps_lost = last_step -
resumed, seconds_lost = time the signal was sent - time the killed run first had the
state of step `resumed` (its progress line of that step, or, when that is the step the
run itself started from, the time of its `started` event; 0 when nothing was lost),
restore_s (the `seconds` of the restart's `resumed` event: reading and verifying the
checkpoint), corrupt (checkpoints the restart set aside: `checkpoint_corrupt` events),
restart_to_step_s (restart process start to its first progress line: imports, restore,
compilation), exit code (-9 for SIGKILL; SIGTERM must give 0 and lose 0 steps).

Summary: max_steps_lost, max_seconds_lost, mean_restore_s, resumed_latest_committed (every
restart restored exactly the latest committed checkpoint), params_bitwise_equal,
data_order_equal, goodput = reference wall / total wall of all chaos runs (first start to
last exit: what the disruptions cost in all, restarts' start-up and compilation included).

What bounds steps_lost: a SIGTERM loses nothing. A SIGKILL loses the steps since the last
COMMITTED save. Saves are asynchronous and a save waits for the previous one to commit
before it starts, so when the kill lands the latest committed step is the latest started
save M or M - C: a kill during save N loses at most C (plus any step finished before the signal
landed), a kill at step k loses k - M (< C) or, if M is still being written, k - M + C.
With tiny's 0.1 s steps and a commit of 0.3-0.5 s, a kill 1-4 steps after a save often
finds it uncommitted. So steps_lost <= 2C, and the exact check is resumed == committed.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` and jaxspeech from this checkout as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import (  # noqa: E402
    environment,
    results,
    writer_chaos,  # noqa: E402
)
from benchmarks.lib.corpus import (  # noqa: E402
    damage_corpus,
    faulty_records,
    make_corpus,
    skipped_by_step,
)
from benchmarks.lib.disruptions import choose_trigger, plan_kinds  # noqa: E402
from benchmarks.lib.resume_check import verify  # noqa: E402
from benchmarks.lib.run_record import seconds_lost, summarize  # noqa: E402
from benchmarks.lib.trainer_process import check_run, run_trainer, train_command  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
CHECKPOINT_EVERY = 4
QUICK = {"steps": 16, "disruptions": 3}
FULL = {"steps": 40, "disruptions": 8}


# ------------------------------------------------------------------------------------
# The driver.
# ------------------------------------------------------------------------------------
def run_chaos(
    *,
    steps: int,
    disruptions: int,
    seed: int = 0,
    every: int = CHECKPOINT_EVERY,
    data: str | None = None,
    workdir: str | None = None,
    out: str | None = None,
    quick: bool = False,
    verbose: bool = True,
    extra_args: Sequence[str] = (),
    damaged_records: int = 3,
    writers: bool = False,
) -> dict:
    """Reference run, chaos runs, verification; returns (and writes to `out`) the result."""
    say = print if verbose else (lambda *a, **k: None)
    t_bench = time.time()
    load_start = os.getloadavg()
    workdir = os.path.abspath(workdir or tempfile.mkdtemp(prefix="jaxspeech-chaos-"))
    ref_dir, chaos_dir = os.path.join(workdir, "reference"), os.path.join(workdir, "chaos")
    for d in (ref_dir, chaos_dir):
        if os.path.exists(d):
            raise SystemExit(f"{d} exists: use a new --workdir (runs there would resume)")
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    data, extra_args = training_data(workdir, data, damaged_records, extra_args, say)
    ref = reference_run(ref_dir, data, steps, every, extra_args, logs, say)
    kinds = plan_kinds(disruptions, seed)
    rng = random.Random(seed + 1)
    cmd = train_command(chaos_dir, data, steps, every, extra_args)
    runs, events, chaos_wall = chaos_runs(cmd, kinds, rng, steps, every, workdir, say)
    checks = verify(ref_dir, chaos_dir, steps) | damage_checks(
        ref_dir, chaos_dir, damaged_records, events
    )
    writer_rows = []
    if writers:  # the reference's corpus and flags: disk_full compares with it
        for scenario in (writer_chaos.two_trainers, writer_chaos.disk_full):
            writer_rows.append(scenario(ref_dir, data, steps, every, extra_args, workdir, say))
    import jax

    result = {
        "benchmark": "chaos",
        "date": environment.utc_date(),
        "quick": quick,
        "config": "configs/demo.py:tiny",
        "steps": steps,
        "checkpoint_every": every,
        "seed": seed,
        "disruptions": len(events),
        "planned_kinds": kinds,
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "machine": environment.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "load_avg_at_start": [round(x, 2) for x in load_start],
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "reference_wall_s": round(ref["wall_s"], 2),
        "chaos_wall_s": round(chaos_wall, 2),
        "chaos_runs": len(runs),
        "goodput": round(ref["wall_s"] / chaos_wall, 4),
        "events": events,
        **summarize(events),
        **checks,
        "runs": [run_summary(r) for r in [ref, *runs]],
        "writer_scenarios": writer_rows,
        "workdir": workdir,
        "command": "python " + " ".join(cmd[1:]).replace("-u ", "", 1),
    }
    result["wall_s"] = round(time.time() - t_bench, 1)
    print_report(result, say)
    if out:
        results.save_result(out, result, say)
    return result


def training_data(
    workdir: str,
    data: str | None,
    damaged_records: int,
    extra_args: Sequence[str],
    say: Callable[..., None],
) -> tuple[str, Sequence[str]]:
    """The corpus both runs train on (synthesized when `data` is None; a damaged copy when
    `damaged_records`) and the trainer flags it needs."""
    if data is None:
        say(f"synthesizing and preparing the tiny corpus in {workdir}/corpus ...", flush=True)
        t0 = time.time()
        data = make_corpus(os.path.join(workdir, "corpus"))
        say(f"corpus ready in {time.time() - t0:.0f} s", flush=True)
    data = os.path.abspath(data)
    if damaged_records:
        data = damage_corpus(data, os.path.join(workdir, "damaged"), damaged_records)
        extra_args = [*extra_args, "--config.data.max_corrupt_fraction=0.2"]
        say(f"training on {data}: {damaged_records} places of a train shard damaged", flush=True)
    return data, extra_args


def reference_run(
    ref_dir: str,
    data: str,
    steps: int,
    every: int,
    extra_args: Sequence[str],
    logs: str,
    say: Callable[..., None],
) -> dict:
    """The uninterrupted run, timed; it must finish all `steps`."""
    say(f"reference: {steps} steps, checkpoint every {every}, uninterrupted", flush=True)
    ref_cmd = train_command(ref_dir, data, steps, every, extra_args)
    ref_log = os.path.join(logs, "reference.log")
    ref = run_trainer(ref_cmd, ref_log)
    check_run(ref, ref_cmd, ref_log, expect_ok=True)
    if ref["last_step"] != steps or ref["finished"] != steps:
        raise RuntimeError(
            f"reference stopped at step {ref['last_step']} (finished: {ref['finished']}); "
            f"log: {ref_log}"
        )
    say(f"reference: {ref['wall_s']:.1f} s", flush=True)
    return ref


def chaos_runs(
    cmd: list[str],
    kinds: list[str],
    rng: random.Random,
    steps: int,
    every: int,
    workdir: str,
    say: Callable[..., None],
) -> tuple[list[dict], list[dict], float]:
    """The same command started again after each planned disruption until a run finishes:
    (the runs' records, the disruption events, seconds from the first start to the last
    exit)."""
    logs = os.path.join(workdir, "logs")
    runs: list[dict] = []
    events: list[dict] = []
    t_chaos = time.time()
    while True:
        i = len(runs)
        pending = kinds[i] if i < len(kinds) else None

        def choose(start, pending=pending, i=i):
            if pending is None:
                return None
            return choose_trigger(pending, start, steps, every, i, len(kinds), rng)

        log_path = os.path.join(logs, f"chaos_{i}.log")
        run = run_trainer(cmd, log_path, choose)
        run["log"] = os.path.relpath(log_path, workdir)
        check_run(run, cmd, log_path, expect_ok=True)
        runs.append(run)
        if run["corrupt"]:
            say(f"run {i}: quarantined corrupt checkpoint(s) {run['corrupt']}", flush=True)
        if events:  # this run is the restart of the previous disruption
            record_restart(events[-1], runs[-2], run, i, say)
        if run["signal"] is None:
            if run["trigger"] is not None:
                raise RuntimeError(f"run {i} ended before its trigger {run['trigger']}")
            if run["finished"] != steps:  # its `finished` event
                raise RuntimeError(
                    f"run {i} ended at step {run['last_step']} without finishing; log: {log_path}"
                )
            break
        events.append(disruption_event(run, i, pending, runs, say))
        if len(runs) > len(kinds) + 2:
            raise RuntimeError("more runs than planned disruptions: the driver is looping")
    return runs, events, runs[-1]["end_t"] - t_chaos


def record_restart(event: dict, prev: dict, run: dict, i: int, say: Callable[..., None]) -> None:
    """Completes the previous disruption's `event` from its restart `run` (run `i`): where
    it resumed, the steps and seconds lost, the restore time."""
    if run["start_step"] != event["committed"]:
        say(
            f"WARNING: run {i} started at step {run['start_step']}, but the latest "
            f"committed checkpoint was {event['committed']}",
            flush=True,
        )
    if run["start_step"] and run["resumed_step"] != run["start_step"]:
        say(
            f"WARNING: run {i} started at step {run['start_step']}, but its `resumed` "
            f"event says step {run['resumed_step']}",
            flush=True,
        )
    event["resumed"] = run["start_step"]
    event["corrupt"] = run["corrupt"]  # checkpoints the restart set aside
    event["steps_lost"] = (prev["last_step"] or 0) - run["start_step"]
    event["seconds_lost"] = round(seconds_lost(prev, run["start_step"]), 3)
    event["restore_s"] = run["restore_s"]
    event["restart_to_step_s"] = (
        round(run["first_step_t"] - run["start_t"], 2) if run["first_step_t"] else None
    )
    say(
        f"  -> restart resumed from step {event['resumed']} "
        f"(lost {event['steps_lost']} steps, {event['seconds_lost']:.1f} s; "
        f"restore {event['restore_s']} s)",
        flush=True,
    )


def disruption_event(
    run: dict, i: int, pending: str | None, runs: list[dict], say: Callable[..., None]
) -> dict:
    """The record of the disruption that ended run `i` (its restart completes it)."""
    kind, trigger_step = run["trigger"]
    committed = run["committed_after"]
    event = {
        "run": i,
        "kind": kind,
        "planned_kind": pending,
        "signal": run["signal"],
        "start_step": run["start_step"],
        "trigger_step": trigger_step,
        "last_step": run["last_step"],
        "committed": committed[-1] if committed else 0,
        # The latest commit the trainer's events reported by then (it can miss one
        # that Orbax finished just before the kill).
        "committed_reported": max((c for r in runs for c in r["committed_reported"]), default=0),
        "uncommitted": run["uncommitted_after"],
        "preempted": run["preempted"],
        "exit_code": run["exit_code"],
        "signal_at_s": round(run["signal_t"] - run["start_t"], 3),
    }
    say(
        f"run {i}: {kind} at step {trigger_step} ({run['signal']} "
        f"{run['signal_t'] - run['start_t']:.1f} s after start), last step "
        f"{run['last_step']}, exit {run['exit_code']}, committed {committed}",
        flush=True,
    )
    return event


def damage_checks(ref_dir: str, chaos_dir: str, damaged_records: int, events: list[dict]) -> dict:
    """Whether both runs skipped the same unreadable records at the same steps, and whether
    a disruption came after a skip."""
    skips = skipped_by_step(ref_dir)
    return {
        "damaged_places": damaged_records,
        "skipped_records": sum(skips.values()),
        "skipped_at_steps": sorted(skips),
        "skips_equal": skips == skipped_by_step(chaos_dir)
        and faulty_records(ref_dir) == faulty_records(chaos_dir),
        "faulty_records": faulty_records(ref_dir),
        "disrupted_after_a_skip": bool(skips)
        and any(e["trigger_step"] > min(skips) for e in events),
    }


def run_summary(r: dict) -> dict:
    """The JSON's row of one run (the reference or a chaos run)."""
    return {
        "start_step": r["start_step"],
        "last_step": r["last_step"],
        "trigger": r["trigger"],
        "signal": r["signal"],
        "exit_code": r["exit_code"],
        "wall_s": round(r["wall_s"], 2),
        "restore_s": r["restore_s"],
        "saves": r["saves"],
        "committed_reported": r["committed_reported"],
        "committed_after": r["committed_after"],
        "corrupt": r["corrupt"],
        "log": r.get("log", "logs/reference.log"),
    }


def print_report(r: dict, say=print) -> None:
    say()
    say(
        f"{r['steps']} steps of configs/demo.py:tiny, checkpoint every {r['checkpoint_every']}, "
        f"seed {r['seed']}, {r['disruptions']} disruptions; {r['cpu_count']} cores, "
        f"jax {r['jax']}"
    )
    say(
        "| # | kind | trigger step | last step | committed | save in flight | resumed "
        "| steps lost | seconds lost | restore s | restart to 1st step s | exit |"
    )
    say("|" + "---|" * 12)
    for n, e in enumerate(r["events"], 1):
        rs = "-" if e.get("restore_s") is None else f"{e['restore_s']:.1f}"
        rt = "-" if e.get("restart_to_step_s") is None else f"{e['restart_to_step_s']:.1f}"
        flight = ", ".join(d.split(".")[0] for d in e.get("uncommitted", [])) or "-"
        say(
            f"| {n} | {e['kind']} | {e['trigger_step']} | {e['last_step']} | {e['committed']} "
            f"| {flight} | {e.get('resumed', '-')} | {e.get('steps_lost', '-')} "
            f"| {e.get('seconds_lost', 0.0):.2f} | {rs} | {rt} | {e['exit_code']} |"
        )
    mr = "-" if r["mean_restore_s"] is None else f"{r['mean_restore_s']:.2f}"
    say(
        f"max steps lost {r['max_steps_lost']} (checkpoint every {r['checkpoint_every']}), "
        f"max seconds lost {r['max_seconds_lost']:.2f}, mean restore {mr} s; "
        f"kills during a save: {r['kills_during_save']}"
    )
    say(
        f"reference {r['reference_wall_s']:.1f} s, chaos {r['chaos_wall_s']:.1f} s in "
        f"{r['chaos_runs']} runs: goodput {r['goodput']:.1%}"
    )
    say(
        f"every restart restored the latest committed checkpoint: "
        f"{r['resumed_latest_committed']}; SIGTERM exits 0 losing 0 steps: {r['sigterm_clean']}"
    )
    say(
        f"final parameters bitwise equal: {r['params_bitwise_equal']} (step "
        f"{r['final_step_reference']} vs {r['final_step_chaos']}"
        + (f"; differ: {r['params_differ']}" if r["params_differ"] else "")
        + f"); feature statistics equal: {r['model_vars_bitwise_equal']}; data order equal "
        f"for steps 1..{r['steps']}: {r['data_order_equal']}"
        + (f" (differs at {r['data_order_differs_at']})" if r["data_order_differs_at"] else "")
        + f"; the {len(r['replayed_steps'])} steps replayed after kills read the same "
        f"utterances again: {r['replays_identical']}"
    )
    if r.get("damaged_places"):
        say(
            f"damaged corpus: {r['skipped_records']} unreadable records skipped at steps "
            f"{r['skipped_at_steps']} ({len(r['faulty_records'])} distinct); the same in "
            f"both runs: {r['skips_equal']}; a disruption after a skip: "
            f"{r['disrupted_after_a_skip']}"
        )
    if r.get("writer_scenarios"):
        writer_chaos.print_writer_rows(r["writer_scenarios"], say)
    say(f"total {r['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['steps']} steps, {QUICK['disruptions']} disruptions (one of each kind)",
    )
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--disruptions", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=CHECKPOINT_EVERY, help="checkpoint every N")
    ap.add_argument("--data", default=None, help="prepared shards (default: synthesize)")
    ap.add_argument("--workdir", default=None, help="runs, logs, corpus (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep a default temp workdir")
    ap.add_argument("--out", default=os.path.join(RESULTS, "chaos.json"))
    ap.add_argument(
        "--damaged_records",
        type=int,
        default=3,
        help="places damaged in a train shard of a copy of the corpus (0: train on it as is)",
    )
    ap.add_argument(
        "--writers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the writer scenarios: two trainers on one run directory, and the "
        "disk filling up during a save (benchmarks/lib/writer_chaos.py; the latter needs root)",
    )
    args = ap.parse_args(argv)
    plan = QUICK if args.quick else FULL
    steps = args.steps or plan["steps"]
    disruptions = plan["disruptions"] if args.disruptions is None else args.disruptions
    if steps < 2 * args.every + 2:
        ap.error(f"--steps {steps} leaves no room: use at least {2 * args.every + 2}")
    temp = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="jaxspeech-chaos-")
    try:
        return run_chaos(
            steps=steps,
            disruptions=disruptions,
            seed=args.seed,
            every=args.every,
            data=args.data,
            workdir=workdir,
            out=args.out,
            quick=args.quick,
            damaged_records=args.damaged_records,
            writers=args.writers,
        )
    finally:
        if temp and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the driver only reads checkpoints
    main()
