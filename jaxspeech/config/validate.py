"""A whole config checked before any work: every mistake at once, one line each.

`validate(config)` raises one `UserError` listing each mistake with its key, the bad
value and what is allowed, e.g. `data.batch_seconds must be > 0, got -5`. It reads the
config only (and whether the files it names exist); the objects built later (mesh, model,
loader, checkpoints) keep their own checks. Settings a config does not use (the other
encoder's, the transducer's with a CTC head, distillation's when it is off) are not
checked. The allowed values come from the code that reads them wherever it sits at or
below this layer (`jaxspeech.models`, `jaxspeech.decoding.search`, `jaxspeech.parallel`,
`jaxspeech.data.mixing`, `jaxspeech.losses.distill`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from ml_collections import ConfigDict

from jaxspeech.audio import augment
from jaxspeech.config import defaults
from jaxspeech.data import mixing
from jaxspeech.data import pipeline as pipeline_lib
from jaxspeech.decoding import search
from jaxspeech.errors import UserError
from jaxspeech.losses import distill as distill_losses
from jaxspeech.models import DTYPES, ENCODERS, asr
from jaxspeech.models.conformer import REMAT_POLICIES
from jaxspeech.models.subsampling import SUBSAMPLING_FACTORS
from jaxspeech.models.transducer import PREDICTORS
from jaxspeech.parallel import mesh as mesh_lib
from jaxspeech.parallel import rules, sync

# What jaxspeech.training.optim builds (it sits above this layer).
OPTIMIZERS = ("adamw",)
DECAYS = ("cosine", "noam", "constant")

# key -> the allowed range: "> 0", ">= N" or an interval "in [0, 1)".
RANGES = {
    "data.batch_seconds": "> 0",
    "data.max_tokens_per_second": "> 0",
    "data.num_workers": ">= 0",
    "data.prefetch": ">= 0",
    "data.max_corrupt_fraction": "in [0, 1]",
    "data.read_retries": ">= 0",
    "data.read_backoff_s": ">= 0",
    "features.sample_rate": ">= 1",
    "features.n_fft": ">= 1",
    "features.win_length": ">= 1",
    "features.hop_length": ">= 1",
    "features.num_mel_bins": ">= 1",
    "features.fmin": ">= 0",
    "features.log_floor": "> 0",
    "waveform_aug.num_rirs": ">= 0",
    "decoding.beam": ">= 1",
    "decoding.max_symbols_per_frame": ">= 1",
    "scoring.worst": ">= 0",
    "scoring.bootstrap_samples": ">= 0",
    "optim.peak_lr": "> 0",
    "optim.warmup_steps": ">= 0",
    "optim.end_lr_ratio": "in [0, 1]",
    "optim.b1": "in [0, 1)",
    "optim.b2": "in [0, 1)",
    "optim.eps": "> 0",
    "optim.weight_decay": ">= 0",
    "optim.clip_norm": "> 0",
    "train.num_steps": ">= 1",
    "train.run_steps": ">= 0",
    "train.log_every": ">= 1",
    "train.checkpoint_every": ">= 0",
    "train.checkpoint_minutes": ">= 0",
    "train.keep_checkpoints": ">= 1",
    "train.keep_best": ">= 0",
    "train.max_nonfinite_steps": ">= 1",
    "train.eval_every": ">= 0",
    "train.grad_accum": ">= 1",
    "monitor.peak_tflops": ">= 0",
    "monitor.samples_every": ">= 0",
    "monitor.num_samples": ">= 1",
}
# Checked only when used: SpecAugment when enabled, the selected encoder's settings, the
# transducer's with an RNN-T head, soft targets' when distill.targets is set.
SPECAUG_RANGES = {
    "specaug.num_freq_masks": ">= 0",
    "specaug.freq_mask_width": ">= 0",
    "specaug.num_time_masks": ">= 0",
    "specaug.time_mask_max_ratio": "in [0, 1]",
    "specaug.freq_warp": "in [0, 1)",
}
ENCODER_RANGES = {
    "conformer": {
        "dim": ">= 1",
        "num_layers": ">= 1",
        "num_heads": ">= 1",
        "ff_mult": ">= 1",
        "conv_kernel": ">= 1",
        "subsampling_channels": ">= 1",
        "dropout": "in [0, 1)",
        "chunk_size": ">= 0",
        "left_chunks": ">= -1",
        "max_dynamic_chunk": ">= 1",
    },
    "lstm": {
        "hidden": ">= 1",
        "num_layers": ">= 1",
        "proj_dim": ">= 0",
        "stack_frames": ">= 1",
        "lookahead": ">= 0",
        "dropout": "in [0, 1)",
        "output_dim": ">= 0",
    },
}
TRANSDUCER_RANGES = {
    "model.transducer.predictor_dim": ">= 1",
    "model.transducer.context_size": ">= 1",
    "model.transducer.lstm_layers": ">= 1",
    "model.transducer.lstm_hidden": ">= 0",
    "model.transducer.joiner_dim": ">= 1",
    "loss.prune_range": ">= 1",
    "loss.simple_scale": ">= 0",
    "loss.rnnt_warmup_steps": ">= 0",
    "loss.frames_per_chunk": ">= 1",
}
SOFT_TARGET_RANGES = {"distill.temperature": "> 0", "distill.weight": ">= 0"}


def validate(config: ConfigDict, *, devices: int | None = None) -> None:
    """Check the whole config; `devices`: the device count the mesh must fit (unchecked
    when None).

    Raises:
      UserError: one, listing every mistake on a line of its own.
    """
    found = mistakes(config, devices=devices)
    if found:
        s = "s" if len(found) > 1 else ""
        raise UserError(f"config: {len(found)} mistake{s}:\n" + "\n".join(f"  {m}" for m in found))


def mistakes(config: ConfigDict, *, devices: int | None = None) -> list[str]:
    """Every mistake of `config`, one line each, section by section (empty: none)."""
    out = _key_mistakes(config)
    # A copy with the keys it lacks at their defaults: each lack is reported once above,
    # and every check below can read every key. The rules table stays as given (its
    # entries are checked whole by `rules.rules_from_config`).
    table = defaults.lookup(config, "mesh.rules")
    view = defaults.fill_missing(ConfigDict(config.to_dict()))
    for check in (_data, _features, _augmentation, _model, _decoding, _distill, _train):
        check(view, out.append)
    _mesh_and_sync(view, table, devices, out.append)
    return out


def split_names(text: str) -> list[str]:
    """ "dev,test" -> ["dev", "test"]: data.eval_split's splits, in order.

    Raises:
      ValueError: an empty name or a split named twice.
    """
    splits = [s.strip() for s in str(text).split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise ValueError(f"splits must be distinct names separated by commas, got {text!r}")
    return splits


# ---------------------------------------------------------------- helpers
Report = Callable[[str], None]


def _get(c: ConfigDict, key: str):
    for part in key.split("."):
        c = c[part]
    return c


def _show(value) -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def _in_range(value, rule: str) -> bool:
    if rule.startswith("in "):
        lo, hi = (float(x) for x in rule[4:-1].split(","))
        above = value >= lo if rule[3] == "[" else value > lo
        return above and (value <= hi if rule[-1] == "]" else value < hi)
    op, bound = rule.split()
    return value > float(bound) if op == ">" else value >= float(bound)


def _ranges(c: ConfigDict, table: dict[str, str], report: Report) -> None:
    """Each numeric key of `table` within its range."""
    for key, rule in table.items():
        value = _get(c, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            report(f"{key} must be a number {rule}, got {_show(value)}")
        elif math.isnan(value) or not _in_range(value, rule):
            report(f"{key} must be {rule}, got {_show(value)}")


def _choice(c: ConfigDict, key: str, allowed, report: Report) -> bool:
    """Whether `key` holds one of `allowed` (else reported)."""
    value = _get(c, key)
    if value in tuple(allowed):
        return True
    what = key.rpartition(".")[2]
    report(f"{key}: unknown {what} {_show(value)}; choose one of {', '.join(map(str, allowed))}")
    return False


def _key_mistakes(config: ConfigDict) -> list[str]:
    """Keys `config` has that the defaults do not (a typo would be silently ignored), and
    keys it lacks. mesh.rules' entries are `_mesh_and_sync`'s."""

    def leaves(d: dict, prefix: str = "") -> set[str]:
        out = set()
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and key != "mesh.rules":
                out |= leaves(v, f"{key}.")
            else:
                out.add(key)
        return out

    have, known = leaves(config.to_dict()), leaves(defaults.get_config().to_dict())
    home = "jaxspeech/config/defaults.py"
    return [f"{k} is not a config key (none such in {home})" for k in sorted(have - known)] + [
        f"{k} is missing (every key of {home} must be set)" for k in sorted(known - have)
    ]


def _file(c: ConfigDict, key: str, report: Report) -> None:
    path = _get(c, key)
    if path and not os.path.isfile(path):
        report(f"{key}: no such file {path!r}")


# ---------------------------------------------------------------- the sections
def _data(c: ConfigDict, report: Report) -> None:
    d = c.data
    if not d.dir:
        report("data.dir must name a prepared corpus (python -m data_prep.prepare), got ''")
    if not str(d.train_split).strip():
        report("data.train_split must name a split, got ''")
    try:
        split_names(d.eval_split)
    except ValueError as e:
        report(f"data.eval_split: {e}")
    for key in ("bucket_boundaries", "eval_bucket_boundaries"):
        bounds = d[key]
        if key == "eval_bucket_boundaries" and not bounds:
            continue  # () = the training buckets
        try:
            pipeline_lib.make_bucket_spec(bounds, 1.0, 1.0, 1)
        except (ValueError, TypeError) as e:
            report(f"data.{key}: {e}")
    shards = d.loader_shards
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 0:
        report(
            f"data.loader_shards={_show(shards)} must be 0 (one per process) or a multiple "
            "of every process count the run will use"
        )
    _ranges(c, {k: v for k, v in RANGES.items() if k.startswith("data.")}, report)


def _features(c: ConfigDict, report: Report) -> None:
    before = []
    _ranges(c, {k: v for k, v in RANGES.items() if k.startswith("features.")}, before.append)
    for line in before:
        report(line)
    if before:
        return
    f = c.features
    if f.win_length > f.n_fft:
        report(f"features.win_length must be <= features.n_fft={f.n_fft}, got {f.win_length}")
    if not f.fmin < f.fmax <= f.sample_rate / 2:
        report(
            f"features.fmax must be above features.fmin={_show(f.fmin)} and at most half "
            f"features.sample_rate={f.sample_rate}, got {_show(f.fmax)}"
        )


def _augmentation(c: ConfigDict, report: Report) -> None:
    if c.specaug.enabled:
        _ranges(c, SPECAUG_RANGES, report)
    _ranges(c, {"waveform_aug.num_rirs": RANGES["waveform_aug.num_rirs"]}, report)
    w = c.waveform_aug
    try:  # the loader's own checks; a manifest stands for its (unread) noise files
        augment.WaveformAugmentConfig(
            speeds=tuple(w.speeds),
            noise_prob=w.noise_prob,
            snr_db=tuple(w.snr_db),
            noise_files=(w.noise_manifest,) if w.noise_manifest else (),
            noise_exponents=tuple(w.noise_exponents),
            reverb_prob=w.reverb_prob,
            num_rirs=w.num_rirs,
            rt60=tuple(w.rt60),
            seed=0,
        )
    except (ValueError, TypeError) as e:
        report(f"waveform_aug.{e}" if str(e).split(" ")[0] in w else f"waveform_aug: {e}")
    _file(c, "waveform_aug.noise_manifest", report)


def _model(c: ConfigDict, report: Report) -> None:
    m = c.model
    encoder_ok = _choice(c, "model.encoder", tuple(ENCODERS), report)
    head_ok = _choice(c, "model.head", asr.HEADS, report)
    _choice(c, "model.dtype", tuple(DTYPES), report)
    if encoder_ok:
        section = ENCODER_RANGES[m.encoder]
        table = {f"model.{m.encoder}.{k}": rule for k, rule in section.items()}
        before: list[str] = []
        _ranges(c, table, before.append)
        for line in before:
            report(line)
        if not before:
            (_conformer if m.encoder == "conformer" else _lstm)(c, report)
    if head_ok and "rnnt" in m.head.split("+"):
        _choice(c, "model.transducer.predictor", PREDICTORS, report)
        _choice(c, "loss.rnnt", asr.RNNT_LOSSES, report)
        _ranges(c, TRANSDUCER_RANGES, report)
    if head_ok and m.head == "ctc+rnnt":
        _ranges(c, {"loss.ctc_weight": ">= 0"}, report)


def _conformer(c: ConfigDict, report: Report) -> None:
    e = c.model.conformer
    _choice(c, "model.conformer.remat", tuple(REMAT_POLICIES), report)
    _choice(c, "model.conformer.subsampling_factor", SUBSAMPLING_FACTORS, report)
    if e.dim % e.num_heads:
        report(
            f"model.conformer.dim must be a multiple of model.conformer.num_heads="
            f"{e.num_heads}, got {e.dim}"
        )
    if e.conv_kernel % 2 == 0 and not e.causal:
        report(
            f"model.conformer.conv_kernel must be odd (a centred convolution) unless "
            f"model.conformer.causal, got {e.conv_kernel}"
        )


def _lstm(c: ConfigDict, report: Report) -> None:
    if c.model.lstm.lookahead and c.model.lstm.bidirectional:
        report(
            f"model.lstm.lookahead must be 0 with model.lstm.bidirectional=True (it already "
            f"sees the whole utterance), got {c.model.lstm.lookahead}"
        )


def _decoding(c: ConfigDict, report: Report) -> None:
    for table in ("decoding.", "scoring."):
        _ranges(c, {k: v for k, v in RANGES.items() if k.startswith(table)}, report)
    for key in ("decoding.lm_path", "scoring.mapping_file"):
        _file(c, key, report)
    if c.model.head not in asr.HEADS:
        return  # reported; the decoder is checked against a valid head only
    try:
        search.decoding_method(c)  # a method the head can run
        search.uses_lm(c)  # an LM only with a beam search
    except ValueError as e:
        report(str(e))
    e = c.model.conformer
    chunked = isinstance(e.chunk_size, int) and e.chunk_size > 0
    streams = c.model.encoder == "conformer" and e.causal and chunked
    if c.decoding.streaming and not streams:
        report(
            "decoding.streaming needs a streaming encoder (model.encoder=conformer with "
            f"causal=True and chunk_size > 0), got {c.model.encoder}, causal={e.causal}, "
            f"chunk_size={_show(e.chunk_size)}"
        )


def _distill(c: ConfigDict, report: Report) -> None:
    d = c.distill
    if d.other_split:
        steps = c.train.num_steps
        if isinstance(steps, int) and steps >= 1:  # else train.num_steps is reported
            try:
                mixing.parse_schedule(str(d.schedule), steps)
            except ValueError as e:
                report(f"distill.schedule: {e}")
    if not d.targets:
        return  # pseudo-label mode or off: the soft-target settings are unused
    if not d.other_split:
        report("distill.targets needs distill.other_split (the split whose audio it labels)")
    if c.model.head in asr.HEADS and "ctc" not in c.model.head.split("+"):
        report(
            f"distill.targets trains a CTC output: model.head must be ctc or ctc+rnnt, "
            f"got {_show(c.model.head)}"
        )
    _choice(c, "distill.loss", distill_losses.LOSS_KINDS, report)
    _choice(c, "distill.rest", distill_losses.REST_MODES, report)
    _ranges(c, SOFT_TARGET_RANGES, report)


def _train(c: ConfigDict, report: Report) -> None:
    for section in ("optim.", "train.", "monitor."):
        _ranges(c, {k: v for k, v in RANGES.items() if k.startswith(section)}, report)
    _choice(c, "optim.name", OPTIMIZERS, report)
    _choice(c, "optim.decay", DECAYS, report)
    try:
        str(c.train.compile_cache_dir).format(workdir="RUN")
    except (KeyError, IndexError, ValueError) as e:
        report(
            f"train.compile_cache_dir may hold only the {{workdir}} placeholder, got "
            f"{_show(c.train.compile_cache_dir)} ({type(e).__name__}: {e})"
        )


def _mesh_and_sync(c: ConfigDict, entries, devices: int | None, report: Report) -> None:
    """Mesh sizes (fitting `devices` when given), the rules table of `entries`
    (config.mesh.rules), and the sync strategy on that mesh with those rules."""
    sizes = {a: c.mesh[a] for a in rules.MESH_AXES}
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in sizes.values())
    if not ok:
        report(f"mesh sizes must be integers (-1: the rest of the devices), got {sizes}")
        return
    shape = None
    try:
        # Unknown devices: a count the sizes fit (2 for a -1 axis), so only the sizes'
        # own mistakes show.
        known = math.prod(v for v in sizes.values() if v > 0)
        count = devices if devices is not None else known * (2 if -1 in sizes.values() else 1)
        shape = dict(zip(rules.MESH_AXES, mesh_lib.resolve_mesh_shape(sizes, count)))
    except ValueError as e:
        report(str(e))
    table = None
    try:
        table = rules.rules_from_config(entries)
    except (ValueError, TypeError) as e:
        report(str(e))
    if shape is None or table is None:
        return
    try:
        sync.strategy_from_config(c.sync, shape, table)
    except sync.SyncConfigError as e:
        report(str(e))
