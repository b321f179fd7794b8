"""What a training run tells its operator: lifecycle events, progress lines and scalars,
decoded samples and spectrograms, data-order audits and non-finite-step diagnostics.

Files in the run directory:
- RUN/events.jsonl: one JSON line per lifecycle event (process 0): started, resumed,
  initialized_from, checkpoint_saved, checkpoint_committed, checkpoint_corrupt,
  nonfinite_skip, records_skipped (unreadable records of a step, all processes),
  corpus_damaged, evaluated, preempted, stopped, tracker_drops (what an experiment
  tracker did not take), finished. Tools and tests read these, not the console.
- RUN/data_faults/p<process>.jsonl: the unreadable records a process met
  (`jaxspeech.runs.faults`).
- RUN/batch_ids/p<process>.jsonl: each step's utterance ids (monitor.log_batch_ids).
- RUN/diagnostics/nonfinite-step<N>/: the last non-finite step, to replay it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspeech.common import files
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.metrics import images, perf
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.runs import events


# ---------------------------------------------------------------- progress
def describe_compiled(compiled, shapes: dict, flops: float | None, sample_rate: int) -> str:
    """One line per compiled batch shape: model GFLOP (None: not counted) and XLA's
    per-device memory plan."""
    b, s = shapes["audio"].shape
    mem = compiled.memory_analysis()
    text = f"compiled the step for batch {b} x {s / sample_rate:.2f} s"
    text += ": FLOPs not counted" if flops is None else f": {flops / 1e9:.1f} GFLOP"
    if mem is not None:
        text += (
            f"; per device: arguments {mem.argument_size_in_bytes / 2**20:.1f} MiB, "
            f"temporaries {mem.temp_size_in_bytes / 2**20:.1f} MiB"
        )
    return text


# Per-step values summed (not averaged) over a logging window.
SYNC_SCALARS = {
    "sync_bytes_per_step": "sync/bytes_per_step",
    "sync_density": "sync/gtc_density",
    "sync_overflow": "sync/gtc_overflow",
}
SUMMED = (
    "audio_seconds",
    "skipped_infeasible",
    "skipped_label_overflow",
    "skipped_corrupt",
    "nonfinite",
    "read_retries",
)


def window_summary(
    fetched: list[dict],
    times: dict[str, float],
    *,
    flops: float,
    lr: float,
    peak_flops: float | None,
    goodput: float,
    device_hour_price: float = 0.0,
) -> tuple[dict[str, float], dict[str, float]]:
    """(TensorBoard scalars, figures for the console) of a logging window.

    `fetched`: the window's per-step metrics on the host; `times`: its goodput phases
    (`perf.Goodput.window()`, "wall" included). Losses and norms are means over the
    steps that updated (a skipped step's loss is not finite); counts are sums.
    `device_hour_price` > 0: the price of an hour of audio trained too.
    """
    steps = len(fetched)
    good = [p for p in fetched if not p["nonfinite"]] or fetched
    m = {k: float(np.mean([p[k] for p in good])) for k in fetched[0]}
    sums = {k: float(np.sum([p[k] for p in fetched])) for k in SUMMED}
    wall = times["wall"]
    audio_per_s = sums["audio_seconds"] * jax.process_count() / wall
    parts = {k[5:]: v for k, v in m.items() if k.startswith("loss_")}
    figures = (
        m
        | sums
        | {
            "steps_per_s": steps / wall,
            "audio_per_s": audio_per_s,
            "step_ms": 1000 * times["compute"] / steps,
            "wait_ms": 1000 * times["data"] / steps,
            "mfu": perf.mfu(flops, times["compute"], jax.device_count(), peak_flops),
            "lr": lr,
            "goodput": goodput,
            "price_per_audio_hour": perf.price_per_audio_hour(
                device_hour_price, jax.device_count(), audio_per_s * wall, times["compute"], goodput
            ),
        }
    )
    scalars = {f"train/loss_{k}": v for k, v in parts.items()} | {
        "train/loss": m["loss"],
        "train/utt_loss": m["utt_loss"],
        "train/grad_norm": m["grad_norm"],
        "train/param_norm": m["param_norm"],
        "train/lr": lr,
        "train/steps_per_s": figures["steps_per_s"],
        "train/audio_s_per_s": audio_per_s,
        "train/audio_hours_per_s": audio_per_s / 3600,
        "train/skipped_infeasible": sums["skipped_infeasible"],
        "train/skipped_label_overflow": sums["skipped_label_overflow"],
        "train/skipped_corrupt_records": sums["skipped_corrupt"],
        "train/read_retries": sums["read_retries"],  # process 0's
        "train/skipped_nonfinite_steps": sums["nonfinite"],
        "perf/step_compute_ms": figures["step_ms"],
        "perf/data_wait_ms": figures["wait_ms"],
        "perf/goodput": goodput,
    }
    scalars |= {f"perf/seconds_{k}": v for k, v in times.items() if k != "wall"}
    # Sync strategy (jaxspeech.parallel.sync): bytes per device per step (mean), GTC's
    # density (mean) and overflow (elements that waited for a slot, summed).
    # Scheduled learning and soft targets (config.distill): the share of labeled batches,
    # rows trained on a teacher's targets and rows whose frame counts did not match it.
    if "labeled_batch" in m:
        scalars["train/labeled_batch_share"] = m["labeled_batch"]
    for key in ("soft_utterances", "skipped_frame_mismatch", "skipped_no_target"):
        if key in m:
            scalars[f"train/{key}"] = float(np.sum([p[key] for p in fetched]))
    for key, name in SYNC_SCALARS.items():
        if key in m:
            steps_sum = float(np.sum([p[key] for p in fetched]))
            scalars[name] = steps_sum if key == "sync_overflow" else m[key]
    if figures["mfu"] is not None:
        scalars["perf/mfu"] = figures["mfu"]
    if figures["price_per_audio_hour"] is not None:
        scalars["perf/price_per_audio_hour"] = figures["price_per_audio_hour"]
    return scalars, figures


def progress_line(done: int, num_steps: int, f: dict[str, float]) -> str:
    """The console line of a logging window (`f`: window_summary's figures)."""
    parts = {k[5:]: v for k, v in f.items() if k.startswith("loss_")}
    text = (
        f"{perf.progress_line(done, num_steps, f['steps_per_s'])} | loss {f['loss']:.3f} "
        f"(utt {f['utt_loss']:.1f}"
        + "".join(f", {k} {v:.3f}" for k, v in parts.items() if len(parts) > 1)
        + f") | grad {f['grad_norm']:.2f} | lr {f['lr']:.2e} | "
        f"{f['audio_per_s']:.0f} audio s/s | step {f['step_ms']:.0f} ms + data wait "
        f"{f['wait_ms']:.0f} ms"
        + (f" | MFU {f['mfu']:.1%}" if f["mfu"] is not None else "")
        + f" | goodput {f['goodput']:.0%}"
        + (
            f" | {f['price_per_audio_hour']:.3g} per audio hour"
            if f.get("price_per_audio_hour") is not None
            else ""
        )
    )
    if f["skipped_infeasible"] or f["skipped_label_overflow"] or f["skipped_corrupt"]:
        text += (
            f" | skipped {f['skipped_infeasible']:.0f} infeasible, "
            f"{f['skipped_label_overflow']:.0f} too long, {f['skipped_corrupt']:.0f} unreadable"
        )
    if f["nonfinite"]:
        text += f" | {f['nonfinite']:.0f} non-finite steps skipped"
    return text


# ---------------------------------------------------------------- samples
def peek_rows(local: dict, rows: int, samples: int) -> dict:
    """The first `rows` rows of a host-local batch, audio zero-padded (or cut) to `samples`
    and missing rows left empty (weight 0): one fixed shape for the periodic sample
    decoding and spectrograms (one compilation, not one per bucket)."""
    have = min(rows, local["audio"].shape[0])
    n = min(samples, local["audio"].shape[1])
    out = pipeline_lib.empty_batch(rows, samples, local["labels"].shape[1])
    out["audio"][:have, :n] = local["audio"][:have, :n]
    out["audio_len"][:have] = np.minimum(local["audio_len"][:have], samples)
    for k in ("labels", "label_len", "weight"):
        out[k][:have] = local[k][:have]
    return out


class SampleViewer:
    """Decoded training rows next to their references, and the spectrogram of a row before
    and after SpecAugment, to the console and TensorBoard. Rows are cut or padded to one
    fixed shape (`peek_rows`): one compilation, whatever the bucket."""

    def __init__(
        self,
        *,
        mesh,
        decode_fn: Callable,
        searcher: Any,
        features_fn: Callable,
        tokenizer,
        writer,
        num_samples: int,
        samples: int,
        seed: int,
    ):
        self.mesh, self.decode_fn, self.searcher = mesh, decode_fn, searcher
        self.features_fn, self.tokenizer, self.writer = features_fn, tokenizer, writer
        self.num_samples, self.samples, self.seed = num_samples, samples, seed
        # At least num_samples rows, a multiple of the batch shards and processes.
        unit = math.lcm(mesh_lib.num_batch_shards(mesh), jax.process_count())
        self.rows_global = unit * max(1, math.ceil(num_samples / unit))

    def __call__(self, step: int, params: dict, model_vars: dict, local: dict) -> None:
        mesh = self.mesh
        with jax.set_mesh(mesh):
            rows = peek_rows(local, self.rows_global // jax.process_count(), self.samples)
            arrays = mesh_lib.host_to_global(mesh, {k: rows[k] for k in ("audio", "audio_len")})
            out = self.decode_fn(params, model_vars, arrays["audio"], arrays["audio_len"])
            hypotheses = self.searcher.bind(params, model_vars)
            hyps = hypotheses({k: mesh_lib.to_host_local(mesh, v) for k, v in out.items()})
            key = jax.random.fold_in(jax.random.key(self.seed + 2), step)
            feats = self.features_fn(params, model_vars, arrays["audio"], arrays["audio_len"], key)
            clean, augmented, lengths = (mesh_lib.to_host_local(mesh, x) for x in feats)
        lines = []
        for i in range(min(self.num_samples, len(hyps))):
            if rows["weight"][i]:
                ref = self.tokenizer.decode(rows["labels"][i, : rows["label_len"][i]].tolist())
                lines.append(f"  ref: {ref}\n  hyp: {self.tokenizer.decode(hyps[i])}")
        events.log(f"samples at step {step}:\n" + "\n".join(lines))
        self.writer.text(step, "samples", "\n\n".join(ln.replace("\n", "  \n") for ln in lines))
        n = int(lengths[0])
        pictures = [images.spectrogram_image(x[0, :n]) for x in (clean, augmented)]
        self.writer.image(step, "spectrogram/clean_vs_augmented", images.stack_images(pictures))


def make_features_fn(graphdef) -> Callable:
    """(params, model_vars, audio, audio_len, key) -> (clean, augmented) (B, T, F) features."""

    @jax.jit
    def features_fn(params, model_vars, audio_bs, audio_len_b, key):
        model = nnx.merge(graphdef, params, model_vars)
        clean, _ = model.frontend(audio_bs, audio_len_b, train=False, rngs=None)
        augmented, lengths = model.frontend(audio_bs, audio_len_b, train=True, rngs=nnx.Rngs(key))
        return clean, augmented, lengths

    return features_fn


# ---------------------------------------------------------------- non-finite steps
def write_nonfinite_diagnostics(
    workdir: str,
    step: int,
    grads_fn: Callable,
    key: jax.Array,
    params: dict,
    model_vars: dict,
    batch: dict,
    local: dict,
    metrics: dict,
) -> str:
    """What the last non-finite step looked like, in RUN/diagnostics/nonfinite-step<N>/:
    report.json (non-finite counts per parameter and per gradient, the loss parts, this
    process's rows with non-finite or empty audio) and batch_p<i>.npz (this process's rows,
    to replay the step). `key` is the step's own random key. Every process must call it
    (the gradients are a collective). Returns the directory."""

    @jax.jit
    def counts(params, model_vars, batch):
        grads, sums = grads_fn(params, model_vars, batch, key, jnp.int32(step - 1))
        bad = lambda t: jax.tree.map(lambda x: jnp.sum(~jnp.isfinite(x)), t)  # noqa: E731
        return bad(params), bad(grads), sums

    p_bad, g_bad, sums = jax.device_get(counts(params, model_vars, batch))
    flat = lambda t: {  # noqa: E731
        jax.tree_util.keystr(k): int(v) for k, v in jax.tree_util.tree_flatten_with_path(t)[0]
    }
    audio = local["audio"]
    rows = []
    for i in range(audio.shape[0]):
        n = int(local["audio_len"][i])
        finite = bool(np.all(np.isfinite(audio[i, :n])))
        peak = float(np.max(np.abs(audio[i, :n]))) if n and finite else None
        if not finite or not peak:
            rows.append({"row": i, "audio_len": n, "finite": finite, "peak": peak})
    out = os.path.join(workdir, "diagnostics", f"nonfinite-step{step}")
    os.makedirs(out, exist_ok=True)
    with files.atomic_open(os.path.join(out, f"batch_p{jax.process_index()}.npz"), "wb") as f:
        np.savez(f, **local)
    if jax.process_index() == 0:
        report = {
            "step": step,
            "metrics": {k: float(v) for k, v in jax.device_get(metrics).items()},
            "loss_sums": {k: float(v) for k, v in sums.items()},
            "nonfinite_params": {k: v for k, v in flat(p_bad).items() if v},
            "nonfinite_grads": {k: v for k, v in flat(g_bad).items() if v},
            "suspect_rows_p0": rows,
        }
        files.atomic_json(os.path.join(out, "report.json"), report)
    return out
