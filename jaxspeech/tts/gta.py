"""Ground-truth-aligned (GTA) log-mel: a synthesizer's teacher-forced frames of a prepared
split, for a vocoder to learn from (`config.vocoder.gta_mels`).

A vocoder trained on the recordings' own log-mel meets, at synthesis, FastSpeech2's
smoother predicted one. Tacotron 2 trained WaveNet on its teacher-forced predictions,
HiFi-GAN fine-tunes on them and ESPnet's TTS inference writes them
(`--use_teacher_forcing`): the synthesizer's training forward (the recording's durations,
pitch and energy; no dropout, `tts.objective.make_eval_fn`) predicts frames aligned one
to one with the recording's, so a vocoder can learn predicted frames -> the real waveform.

`write_gta_mels` runs the run's checkpoint over the split (or N of its utterances spread
evenly over it) in the run's training buckets, on one device, and writes each utterance's
(T, M) raw log-mel (the front end's natural log of power, as the vocoder's input) into a
frame store (`jaxspeech.data.frame_store`); an utterance the model cannot take (an
unreadable record, more phonemes than its bucket) is left out, counted and named with its
reason in the manifest. Command line: `python -m jaxspeech.synthesize --workdir TTS_RUN --gta_split
train --output FILE.npz` (`--gta_max_utterances N`: N of its utterances, spread evenly over it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import IO

import jax
import numpy as np

from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.data import frame_store, records
from jaxspeech.data import reader as reader_lib
from jaxspeech.data.plan import PAD_INDEX, BucketSpec, PlannedBatch
from jaxspeech.evaluation import splits as eval_splits
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules
from jaxspeech.serving.progress import FileProgress
from jaxspeech.tts import artifact as tts_artifact
from jaxspeech.tts import batch as tts_batch
from jaxspeech.tts.loading import TtsRun, denormalized
from jaxspeech.tts.objective import make_eval_fn


def spread(num_records: int, limit: int) -> np.ndarray:
    """(K,) record indices: `limit` of the split's `num_records` spread evenly over it (its
    speakers and lengths alike), or all of them."""
    if limit >= num_records:
        return np.arange(num_records)
    return np.unique((np.arange(limit) * num_records) // limit).astype(np.int64)


def planned_batches(
    index: records.SplitIndex, spec: BucketSpec, positions: np.ndarray
) -> Iterator[PlannedBatch]:
    """One pass over the records `positions` in `spec`'s buckets (each record in the
    shortest that holds it, as `BatchPlan` places them; `spec` reaches the longest), in
    order, padded with PAD_INDEX rows. One process: the pass runs on one device."""
    samples = np.round(index.durations[positions] * index.sample_rate).astype(np.int64)
    bounds = np.array([spec.num_samples(b) for b in range(len(spec.boundaries))])
    bucket = np.searchsorted(bounds, samples, side="left")
    for b, rows in enumerate(spec.batch_sizes):
        mine = positions[bucket == b]
        for start in range(0, len(mine), rows):
            part = mine[start : start + rows]
            indices = np.full(rows, PAD_INDEX, np.int64)
            indices[: len(part)] = part
            yield PlannedBatch(b, indices, np.ones(rows, np.float32), 0)


def _frames(run: TtsRun, data_dir: str, split: str, limit: int, skipped: list) -> Iterator:
    """(id, (T, M) raw log-mel) of `limit` records of the split spread over it (`spread`);
    the records left out are appended to `skipped` as {"id" or "record", "reason"}."""
    config, mesh = run.config, run.spec.mesh
    cfg = build.feature_config(config)
    eval_fn = make_eval_fn(run.spec.graphdef, cfg)
    index = records.read_split_index(data_dir, split)
    # The training buckets (and one up to the longest utterance), not the evaluation's few
    # wide ones: a pass over a training split pads less. The demo's train split: 35 ms an
    # utterance in the evaluation's (3.0, 6.5) buckets (all 9,450: 331 s), 29.6 ms in these
    # (4,725 spread: 140 s), 2-core VM.
    buckets = config.copy_and_resolve_references()
    buckets.data.eval_bucket_boundaries = ()
    spec = eval_splits.eval_bucket_spec(buckets, index.durations, 1)
    load = tts_batch.LoadTtsBatch(
        index.shard_paths,
        index.shard_num_records,
        run.assets.table,
        run.assets.speakers,
        spec,
        cfg.hop_length,
        with_text=True,
        retry=build.retry_policy(config),
        unknown_speaker="error",
    )
    table = build.rules_from_config(config)
    pending = None  # the batch before: its frames are fetched after the next is loaded
    for planned in planned_batches(index, spec, spread(index.num_records, limit)):
        batch = load(planned)
        arrays = {k: v for k, v in batch.items() if isinstance(v, np.ndarray)}
        with rules.axis_rules(table), jax.set_mesh(mesh):
            out = eval_fn(run.params, run.model_vars, mesh_lib.host_to_global(mesh, arrays))
        if pending is not None:
            yield from _rows(run, *pending, skipped)
        pending = (batch, out)
    if pending is not None:
        yield from _rows(run, *pending, skipped)


def _rows(run: TtsRun, batch: dict, out: dict, skipped: list) -> Iterator:
    """(id, (T, M) raw log-mel) of one batch's usable rows; the others into `skipped`."""
    for f in batch["faults"]:
        skipped.append({"record": f.get("record"), "reason": str(f.get("error"))})
    frames = np.asarray(out["frames"])
    mel = np.asarray(out["predicted"])
    for i, utt in enumerate(batch["id"]):
        if not utt:
            continue  # padding, or a corrupt record (in "faults")
        if batch["label_overflow"][i]:
            skipped.append({"id": utt, "reason": "more phonemes than its bucket"})
        else:
            yield utt, denormalized(mel[i, : int(frames[i])], run.model_vars)


def write_gta_mels(
    workdir: str,
    split: str,
    output: str,
    *,
    data_dir: str | None = None,
    step: int | None = None,
    max_utterances: int = 0,
    progress: IO | None = None,
) -> dict:
    """Writes RUN's teacher-forced log-mel of `split` (`max_utterances` of its utterances
    spread evenly over it, `spread`; 0: all) to the frame store `output` (.npz); returns
    its manifest: the run, step, data, split, "utterances" written, "skipped" ([{"id" or
    "record", "reason"}]), the front end ("features") and the seconds it took.

    Raises:
      UserError: not a synthesizer's run, an unprepared split, a speaker the run does not
        know, a bad output path.
    """
    if not output.endswith(".npz"):
        raise UserError(f"--output {output}: the GTA frames are one .npz file (FILE.npz)")
    if max_utterances < 0:
        raise UserError(f"--gta_max_utterances {max_utterances}: give 0 (all) or more")
    t0 = time.time()
    run = tts_artifact.load_run(workdir, step)
    data_dir = data_dir or run.config.data.dir
    try:
        num_records = records.read_split_index(data_dir, split).num_records
    except (FileNotFoundError, ValueError, reader_lib.ShardError) as e:
        raise UserError(f"GTA frames of {data_dir}/{split}: {e}") from e
    limit = min(max_utterances or num_records, num_records)
    skipped: list[dict] = []
    manifest = {
        "kind": frame_store.GTA_LOG_MEL,
        "tts_workdir": workdir,
        "step": int(run.step),
        "data_dir": data_dir,
        "split": split,
        "split_records": int(num_records),
        "features": dataclasses.asdict(build.feature_config(run.config)),  # vocoder.gta checks it
        "skipped": skipped,  # filled while the frames stream out
    }
    frames = _frames(run, data_dir, split, limit, skipped)
    if progress is not None:
        frames = _reporting(frames, limit, progress)
    try:
        count = frame_store.write_frame_store(output, _counted(frames, manifest, t0), manifest)
    except tts_batch.UnknownSpeaker as e:
        raise UserError(f"GTA frames of {split}: {e}: use a split of the run's speakers") from e
    except OSError as e:
        raise UserError(f"writing {output}: {e}") from e
    return manifest | {"utterances": count}


def _counted(frames: Iterator, manifest: dict, t0: float) -> Iterator:
    """`frames`, then the totals set in `manifest` before the store writes it."""
    count = 0
    for item in frames:
        count += 1
        yield item
    manifest["utterances"] = count
    manifest["seconds"] = round(time.time() - t0, 1)


def _reporting(frames: Iterator, total: int, out: IO) -> Iterator:
    """`frames` with the project's progress meter on `out` (the synthesizer's, counting
    utterances)."""
    meter = FileProgress("GTA frames", total, out, tty=out.isatty(), unit="utterances")
    try:
        for n, item in enumerate(frames, 1):
            yield item
            meter.update(n)
    finally:
        meter.close()
