"""Periodic WER jobs: `python -m jaxspeech.evaluate --workdir RUN --split dev,test --watch`.

A process of its own (other hosts than training, or the same ones) that follows a
training run: every checkpoint the run commits is evaluated exactly once per split, as
soon as it appears. Only committed checkpoints are listed (Orbax finalizes a step
directory atomically), so a half-written one is never read. Progress is kept in
RUN/eval/watch.json, so a restarted watcher continues where it stopped. Each result goes
where a standalone evaluation's goes (RUN/eval/<split>-step<N>.json and -utts.jsonl) and
to TensorBoard as eval/<split>/wer|cer at the checkpoint's step (and as JSON lines to
RUN/eval/watch_metrics.jsonl). The watcher exits when
the run has finished (RUN/events.jsonl says so) and its final checkpoint is scored on
every split, or after --watch_timeout seconds without a new checkpoint.

A checkpoint the run's rotation (train.keep_checkpoints) deletes before the watcher gets
to it is skipped with a message: keep more checkpoints, or poll more often, to score them
all. Multi-host: every process of the watcher's own job follows process 0's view of the
run (the list of checkpoints, whether it finished), so all take the same steps.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import closing

import jax

from jaxspeech.common import files
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.decoding import search
from jaxspeech.evaluation import run as eval_run
from jaxspeech.evaluation import scoring
from jaxspeech.evaluation.splits import parse_splits
from jaxspeech.metrics.writers import MetricWriter
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.runs import checkpoint as ckpt_lib
from jaxspeech.runs import lease as lease_lib
from jaxspeech.runs import lifecycle as status
from jaxspeech.runs import loading
from jaxspeech.runs.events import log

PROGRESS = os.path.join("eval", "watch.json")


def load_progress(workdir: str, splits: list[str]) -> dict:
    """RUN/eval/watch.json: {"done": {split: [steps]}, "skipped": {step: reason}}."""
    path = os.path.join(workdir, PROGRESS)
    progress = {"done": {}, "skipped": {}}
    if os.path.exists(path):
        with open(path) as f:
            progress = json.load(f)
    for split in splits:
        progress["done"].setdefault(split, [])
    return progress


def save_progress(workdir: str, progress: dict) -> None:
    """Written whole and renamed into place (process 0): a kill leaves the old or the new."""
    if jax.process_index() != 0:
        return
    path = os.path.join(workdir, PROGRESS)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    files.atomic_json(path, progress)


def pending(steps: list[int], splits: list[str], progress: dict) -> list[tuple[int, list[str]]]:
    """[(step, the splits it still needs)] for the committed `steps`, oldest first."""
    skipped = {int(s) for s in progress["skipped"]}
    out = []
    for step in sorted(steps):
        missing = [s for s in splits if step not in progress["done"][s]]
        if missing and step not in skipped:
            out.append((step, missing))
    return out


def finished_step(workdir: str) -> int | None:
    """The run's last step if it has finished (RUN/events.jsonl), else None."""
    st = status.run_status(workdir)
    return st["step"] if st["state"] == "finished" else None


def committed_steps(workdir: str) -> list[int]:
    """The run's committed checkpoint steps, read without touching a save in flight."""
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return []
    ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
    try:
        return ckpt.all_steps()
    finally:
        ckpt.close()


def process0_view(workdir: str) -> tuple[list[int], int | None]:
    """(committed steps, finished step) as process 0 sees them, on every process."""
    view = [committed_steps(workdir), finished_step(workdir)] if jax.process_index() == 0 else []
    steps, final = mesh_lib.allgather_json([view])[0]
    return steps, final


def watch(
    workdir: str,
    data_dir: str | None,
    splits: list[str] | None,
    method: str | None = None,
    beam: int | None = None,
    max_corrupt_fraction: float | None = None,
    decoding: dict | None = None,
    *,
    timeout_s: float = 0.0,
    poll_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Follow RUN until it has finished and its final checkpoint is scored (or no new
    checkpoint for `timeout_s` > 0 seconds). Returns the progress record and "reason":
    "finished" or "timeout".

    Raises:
      UserError: not a run directory, a decoder the model cannot run, a split that is
        not prepared, a corrupt split.
    """
    try:
        config = eval_run.run_eval_config(workdir, method, beam, max_corrupt_fraction, decoding)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(str(e)) from e
    data_dir = data_dir or config.data.dir
    splits = splits or parse_splits(config.data.eval_split)
    tag = eval_run.result_tag(config, method, beam, decoding)
    progress = load_progress(workdir, splits)
    # The training run's TensorBoard directory (another event file in it), and every
    # score as a JSON line for scripts.
    writer = MetricWriter(
        os.path.join(workdir, "tensorboard"), os.path.join(workdir, "eval", "watch_metrics.jsonl")
    )
    decoders: dict = {}  # one compiled decoder for every checkpoint of the run
    log(f"watching {workdir}: splits {', '.join(splits)}, polling every {poll_s:g} s")
    last_news = time.monotonic()
    # One watcher per run: a second one would score every checkpoint again and race on
    # RUN/eval/watch.json. Its lease is on its output, RUN/eval, not on the training run.
    out_dir, lease_s = os.path.join(workdir, "eval"), config.train.lease_timeout_s
    with lease_lib.hold_for_job(out_dir, "watch", lease_s, warn=log) as lease, closing(writer):
        while True:
            if lease is not None:
                lease.check()
            steps, final = process0_view(workdir)
            for step, missing in pending(steps, splits, progress):
                score_step(
                    workdir, config, data_dir, step, missing, tag, progress, writer, decoders
                )
                last_news = time.monotonic()
            if final is not None and (
                all(final in progress["done"][s] for s in splits)
                or str(final) in progress["skipped"]
            ):
                log(f"the run finished at step {final} and every split is scored; done")
                return progress | {"reason": "finished"}
            if timeout_s and time.monotonic() - last_news > timeout_s:
                log(f"no new checkpoint for {timeout_s:g} s (--watch_timeout); stopping")
                return progress | {"reason": "timeout"}
            sleep(poll_s)


def score_step(
    workdir: str,
    config,
    data_dir: str,
    step: int,
    splits: list[str],
    tag: str,
    progress: dict,
    writer: MetricWriter,
    decoders: dict,
) -> None:
    """Evaluate checkpoint `step` on `splits`, record each as done once written.
    `decoders` caches the compiled decoder (the model's structure does not change)."""
    try:
        with rules.axis_rules(build.rules_from_config(config)):
            run = loading.load_run(workdir, step=step, config=config)
    except ckpt_lib.CheckpointError as e:
        gone = step not in committed_steps(workdir)
        reason = "removed before it was evaluated (train.keep_checkpoints)" if gone else str(e)
        log(f"skipping checkpoint {step}: {reason}")
        progress["skipped"][str(step)] = reason
        save_progress(workdir, progress)
        return
    if "decode" not in decoders:
        decoders["decode"] = search.make_decode_fn(
            run.spec.graphdef, config, run.tokenizer.blank_id
        )
        decoders["searcher"] = search.Searcher(config, run.tokenizer, run.spec.graphdef)
    for split in splits:
        try:
            result = eval_run.evaluate_run(
                run, config, data_dir, split, decoders["decode"], decoders["searcher"]
            )
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from e
        result["step"] = step
        scoring.write_result(workdir, result, step, tag)
        writer.scalars(
            step, {f"eval/{split}/wer": result["wer"], f"eval/{split}/cer": result["cer"]}
        )
        writer.flush()
        log(scoring.describe_result(result, step))
        progress["done"][split].append(step)
        save_progress(workdir, progress)
