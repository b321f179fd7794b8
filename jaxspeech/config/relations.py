"""Checks between config keys: values each within its own range that do not fit together.

Each check runs only when the keys it relates are themselves valid (`ranges.valid`), so a
bad value is reported once, as its own range, and each mistake here is one line naming
both keys and the relation that must hold. What must hold comes from the code that would
fail later: the loader's bucket shapes (`jaxspeech.data.pipeline`), the front end's STFT
and MFCC (`jaxspeech.audio.features`, `jaxspeech.audio.mfcc`), the Conformer's subsampling
(`jaxspeech.models.subsampling`), the device mesh (`jaxspeech.parallel.mesh`) and its
pipeline stages (`jaxspeech.parallel.pipeline`: layer stacks that split into the stages,
a schedule the microbatches fill, all-reduce learners).
"""

from __future__ import annotations

import math

from ml_collections import ConfigDict

from jaxspeech.audio import mfcc as mfcc_lib
from jaxspeech.config import ranges
from jaxspeech.config.ranges import Report, show
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.models.subsampling import SUBSAMPLING_FACTORS, receptive_field
from jaxspeech.parallel import rules


def buckets(c: ConfigDict, report: Report) -> None:
    """Both bucket lists: finite, positive and ascending (the loader's own check), and no
    boundary longer than data.batch_seconds: a batch holds at least one utterance of each
    bucket, so a longer one would make every batch of that bucket exceed the budget the
    memory was planned for. Then the short-first phase's limit, one of the buckets."""
    budget_ok = ranges.valid(c, "data.batch_seconds")
    train_ok = _bucket_list_ok(c, "bucket_boundaries", budget_ok, report)
    if c.data.eval_bucket_boundaries:  # () = the training buckets
        _bucket_list_ok(c, "eval_bucket_boundaries", budget_ok, report)
    d = c.data
    if (
        train_ok  # (else reported above)
        and ranges.valid(c, "data.short_first_steps", "data.short_first_seconds")
        and d.short_first_steps > 0
        and d.short_first_seconds not in tuple(d.bucket_boundaries)
    ):
        report(
            f"data.short_first_seconds must be one of data.bucket_boundaries="
            f"{show(d.bucket_boundaries)} when data.short_first_steps > 0 (the short phase "
            f"reads whole buckets), got {show(d.short_first_seconds)}"
        )


def _bucket_list_ok(c: ConfigDict, key: str, budget_ok: bool, report: Report) -> bool:
    """data.`key`'s checks (`buckets`); False when one failed (reported)."""
    bounds = c.data[key]
    if not isinstance(bounds, tuple | list) or not all(ranges.allows("finite", b) for b in bounds):
        report(f"data.{key} must hold finite numbers of seconds, got {show(bounds)}")
        return False
    try:
        pipeline_lib.make_bucket_spec(bounds, 1.0, 1.0, 1)
    except ValueError as e:
        report(f"data.{key}: {e}")
        return False
    if budget_ok and max(bounds) > c.data.batch_seconds:
        report(
            f"data.{key} must not exceed data.batch_seconds={show(c.data.batch_seconds)} "
            f"(a batch holds at least one utterance of each bucket), got a boundary of "
            f"{show(max(bounds))}"
        )
        return False
    return True


def features(c: ConfigDict, report: Report) -> None:
    """The STFT's window within its FFT, the hop within the window (else samples between
    windows are never seen), and the mel filters between fmin and Nyquist."""
    f = c.features
    if ranges.valid(c, "features.win_length", "features.n_fft") and f.win_length > f.n_fft:
        report(f"features.win_length must be <= features.n_fft={f.n_fft}, got {f.win_length}")
    if (
        ranges.valid(c, "features.hop_length", "features.win_length")
        and f.hop_length > f.win_length
    ):
        report(
            f"features.hop_length must be <= features.win_length={f.win_length} (frames "
            f"would skip audio between windows), got {f.hop_length}"
        )
    rate_ok = ranges.valid(c, "features.fmin", "features.fmax", "features.sample_rate")
    if rate_ok and not f.fmin < f.fmax <= f.sample_rate / 2:
        report(
            f"features.fmax must be above features.fmin={show(f.fmin)} and at most half "
            f"features.sample_rate={f.sample_rate}, got {show(f.fmax)}"
        )


def feature_width(c: ConfigDict) -> tuple[int, str] | None:
    """(features per frame, what sets it as a line names it): the mel bins, or for MFCC
    num_ceps * (1 + deltas). None: a key it depends on is invalid (reported)."""
    f = c.features
    if f.kind == "log_mel" and ranges.valid(c, "features.num_mel_bins"):
        return f.num_mel_bins, f"features.num_mel_bins={f.num_mel_bins}"
    if f.kind == "mfcc" and ranges.valid(c, "features.num_ceps", "features.deltas"):
        width = mfcc_lib.feature_width(f.num_ceps, f.deltas)
        return width, (
            f"the MFCC width {width} (features.num_ceps={f.num_ceps} x "
            f"(1 + features.deltas={f.deltas}))"
        )
    return None


def mfcc(c: ConfigDict, report: Report) -> None:
    """features.kind = mfcc: the cepstra are at most the mel bins (a DCT of them), and no
    deltas with a streaming encoder: the stream functions compute each frame from its own
    window, a delta needs 2 frames after it (`Frontend.init_stream` refuses them)."""
    f = c.features
    keys = ("features.num_ceps", "features.num_mel_bins")
    if ranges.valid(c, *keys) and f.num_ceps > f.num_mel_bins:
        report(
            f"features.num_ceps must be <= features.num_mel_bins={f.num_mel_bins} (the "
            f"cepstra are a DCT of the mel bins), got {f.num_ceps}"
        )
    e = c.model.conformer
    chunked = isinstance(e.chunk_size, int) and e.chunk_size > 0
    streams = c.model.encoder == "conformer" and e.causal and chunked
    if ranges.valid(c, "features.deltas") and f.deltas and streams:
        report(
            f"features.deltas must be 0 with a streaming encoder (model.conformer.causal=True, "
            f"chunk_size={e.chunk_size}): a delta needs 2 frames of look-ahead the stream "
            f"functions do not carry, got {f.deltas}"
        )


def specaug(c: ConfigDict, report: Report) -> None:
    """A frequency mask is at most the features wide (SpecAugment, when enabled)."""
    width = feature_width(c)
    if (
        width
        and ranges.valid(c, "specaug.freq_mask_width")
        and c.specaug.freq_mask_width > width[0]
    ):
        report(f"specaug.freq_mask_width must be <= {width[1]}, got {c.specaug.freq_mask_width}")


def subsampling(c: ConfigDict, report: Report) -> None:
    """The Conformer's subsampling convolutions (VALID, over time and features) need at
    least their receptive field of features (mel bins or MFCCs), else the model fails to
    build."""
    factor, width = c.model.conformer.subsampling_factor, feature_width(c)
    if factor not in SUBSAMPLING_FACTORS or width is None:
        return  # reported
    need = receptive_field(factor)
    if width[0] < need and c.features.kind == "mfcc":
        report(
            f"features.num_ceps x (1 + features.deltas) must be >= {need} for "
            f"model.conformer.subsampling_factor={factor} (its convolutions span {need} "
            f"features), got {width[1]}"
        )
    elif width[0] < need:
        report(
            f"features.num_mel_bins must be >= {need} for model.conformer.subsampling_factor="
            f"{factor} (its convolutions span {need} bins), got {width[0]}"
        )


def mesh_shape(c: ConfigDict, devices: int | None, report: Report) -> dict[str, int] | None:
    """The mesh's axis sizes with -1 resolved: their product must be the device count
    (`devices`; when None, a count the sizes fit: 2 for the -1 axis). None: reported."""
    keys = [f"mesh.{a}" for a in rules.MESH_AXES]
    if not ranges.valid(c, *keys):
        return None  # reported
    sizes = {a: c.mesh[a] for a in rules.MESH_AXES}
    rest = [a for a, v in sizes.items() if v == -1]
    if len(rest) > 1:
        report(
            f"{' and '.join(f'mesh.{a}' for a in rest)} are -1 together: at most one mesh "
            "axis may take the rest of the devices"
        )
        return None
    fixed = [a for a in rules.MESH_AXES if a not in rest]
    known = math.prod(sizes[a] for a in fixed)
    product = " x ".join(f"mesh.{a}" for a in fixed)
    if rest:
        count = devices if devices is not None else 2 * known
        if count % known:
            report(
                f"{product} = {known} cannot use {count} devices: {count} is not a multiple "
                f"of {known} (mesh.{rest[0]}=-1 takes the rest)"
            )
            return None
        return sizes | {rest[0]: count // known}
    if devices is not None and known != devices:
        report(
            f"{product} = {' x '.join(str(sizes[a]) for a in fixed)} needs {known} devices, "
            f"but {devices} are available; set one axis to -1 to use the rest"
        )
        return None
    return sizes


def rules_table(entries, report: Report) -> rules.Rules | None:
    """config.mesh.rules as a table (`rules.rules_from_config`'s check), each entry naming
    a mesh axis at most once (an axis shards one dimension once). None: reported."""
    try:
        table = rules.rules_from_config(entries)
    except (ValueError, TypeError) as e:
        report(str(e))
        return None
    for name, value in entries.items():
        axes = [a.strip() for a in str(value).split(",") if a.strip()]
        if len(set(axes)) != len(axes):
            report(f"mesh.rules.{name} must name each mesh axis once, got {value!r}")
            return None
    return table


def pipeline_stages(c: ConfigDict, stages: int, circular: bool, report: Report) -> None:
    """mesh.stage > 1 (pipeline.schedule circular when `circular`; the schedule's name is
    `validate`'s choice): a scanned Conformer whose layers split into the stages (and
    groups), a schedule the microbatches can fill, all-reduce learners."""
    keys = ["pipeline.microbatches"] + (["pipeline.repeats"] if circular else [])
    if not ranges.check(c, keys, report):
        return
    e = c.model.conformer
    if c.model.encoder != "conformer" or not e.scan_layers:
        report(
            f"mesh.stage={stages} pipelines the Conformer's scanned layer stack: set "
            "model.encoder=conformer and model.conformer.scan_layers=True"
        )
        return
    repeats = int(c.pipeline.repeats) if circular else 1
    groups = stages * repeats
    if ranges.valid(c, "model.conformer.num_layers") and e.num_layers % groups:
        what = f"{stages} stages x {repeats} groups" if circular else f"{stages} stages"
        report(
            f"model.conformer.num_layers={e.num_layers} does not split into {what}: it must "
            f"be a multiple of {groups}"
        )
    if "aed" in str(c.model.head).split("+"):
        _pipelined_decoder(c, stages, repeats, report)
    if circular and c.pipeline.microbatches < stages:
        report(
            f"pipeline.schedule=circular needs pipeline.microbatches >= mesh.stage={stages} "
            f"(a microbatch comes round only after the others entered), got "
            f"{c.pipeline.microbatches}"
        )
    if c.sync.strategy != "allreduce":
        report(
            f"mesh.stage={stages} runs with sync.strategy=allreduce only (the other "
            f"strategies' learners would each need the whole pipeline), got {c.sync.strategy}"
        )


def _pipelined_decoder(c: ConfigDict, stages: int, repeats: int, report: Report) -> None:
    """mesh.stage > 1 with an attention decoder: its scanned layers split into the stages
    (and groups) as the encoder's do."""
    d = c.model.decoder
    if not d.scan_layers:
        report(
            f"mesh.stage={stages} pipelines the attention decoder's layer stack too: set "
            "model.decoder.scan_layers=True"
        )
    elif ranges.valid(c, "model.decoder.num_layers") and d.num_layers % (stages * repeats):
        groups = stages * repeats
        report(
            f"model.decoder.num_layers={d.num_layers} does not split into {stages} stages"
            + (f" x {repeats} groups" if repeats > 1 else "")
            + f": it must be a multiple of {groups}"
        )
