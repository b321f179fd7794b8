"""A whole config checked before any work: every mistake at once, one line each.

`validate(config)` raises one `UserError` listing each mistake with its key, the bad
value and what is allowed, e.g. `data.batch_seconds must be > 0, got -5`. Each key that
can be wrong is checked in one of four ways: a numeric range (`ranges.RANGES`), a fixed
set of values (`CHOICES`), a file that must exist (`FILES`), or a check of its own here
(tests/config/test_validate_keys.py walks them all, and names the keys that need none);
`jaxspeech.config.relations` checks values that do not fit together (buckets longer than
a batch, a mesh the devices do not fill). It reads the config only (and whether the files
it names exist); the objects built later (mesh, model, loader, checkpoints) keep their own
checks. Settings a config does not use (the other encoder's, the transducer's with a CTC
head, the attention decoder's without one, distillation's when it is off, the other sync
strategies') are not checked. The allowed values come from the code that reads them
wherever it sits at or below this layer
(`jaxspeech.models`, `jaxspeech.decoding.search`, `jaxspeech.parallel`,
`jaxspeech.data.mixing`, `jaxspeech.losses.distill`).
"""

from __future__ import annotations

import functools
import os

from ml_collections import ConfigDict

from jaxspeech.audio import augment, mfcc
from jaxspeech.common import storage
from jaxspeech.common.errors import UserError
from jaxspeech.config import defaults, ranges, relations, sections
from jaxspeech.config.ranges import RANGES, Report, get, show, under
from jaxspeech.data import mixing
from jaxspeech.decoding import search
from jaxspeech.losses import distill as distill_losses
from jaxspeech.losses.kernels import common as loss_kernels
from jaxspeech.metrics import trackers
from jaxspeech.models import DTYPES, ENCODERS, asr, attention_ops
from jaxspeech.models.conformer import REMAT_POLICIES
from jaxspeech.models.subsampling import SUBSAMPLING_FACTORS
from jaxspeech.models.transducer import PREDICTORS
from jaxspeech.parallel import pipeline, sync

__all__ = ["CHOICES", "FILES", "RANGES", "mistakes", "split_names", "validate"]

# What jaxspeech.training.optim builds (it sits above this layer).
OPTIMIZERS = ("adamw",)
DECAYS = ("cosine", "noam", "constant", "exponential")
WEIGHT_DECAY_MASKS = ("matrices", "all")
# The tasks config.task may name: those of the registry (jaxspeech.tasks; tests/test_tasks.py).
TASKS = ("asr", "tts", "vocoder")
# The discriminator sizes jaxspeech.vocoder.loading builds (config.vocoder.discriminator).
VOCODER_DISCRIMINATORS = ("paper", "demo", "tiny")
VOCODER_GENERATORS = ("hifigan", "vocos")  # jaxspeech.vocoder.generator.GENERATORS's

# key -> its allowed values, from the code that reads the key. decoding.method is checked
# by jaxspeech.decoding.search and the sync keys by jaxspeech.parallel.sync (their own
# lines); the others here.
CHOICES: dict[str, tuple] = {
    "task": TASKS,
    "vocoder.discriminator": VOCODER_DISCRIMINATORS,
    "vocoder.generator": VOCODER_GENERATORS,
    "features.kind": mfcc.FEATURE_KINDS,
    "model.encoder": tuple(ENCODERS),
    "model.head": asr.HEADS,
    "pipeline.schedule": pipeline.SCHEDULES,
    "model.dtype": tuple(DTYPES),
    "model.conformer.remat": tuple(REMAT_POLICIES),
    "model.conformer.pos_enc": attention_ops.POSITION_ENCODINGS,
    "tts.model.pos_enc": attention_ops.POSITION_ENCODINGS,
    "model.conformer.attention": attention_ops.ATTENTION_IMPLS,
    "model.conformer.subsampling_factor": SUBSAMPLING_FACTORS,
    "model.transducer.predictor": PREDICTORS,
    "loss.rnnt": asr.RNNT_LOSSES,
    "loss.kernel": loss_kernels.KERNEL_SETTINGS,
    "decoding.method": ("auto", *search.DECODERS),
    "distill.loss": distill_losses.LOSS_KINDS,
    "distill.rest": distill_losses.REST_MODES,
    "optim.name": OPTIMIZERS,
    "optim.decay": DECAYS,
    "optim.weight_decay_mask": WEIGHT_DECAY_MASKS,
    "optim2.name": OPTIMIZERS,
    "optim2.decay": DECAYS,
    "optim2.weight_decay_mask": WEIGHT_DECAY_MASKS,
    "tts.dtype": tuple(DTYPES),
    "vocoder.dtype": tuple(DTYPES),
    "sync.strategy": sync.STRATEGIES,
    "sync.outer": sync.OUTER_METHODS,
    "sync.gtc_values": sync.GTC_VALUES,
}
# The front end's keys that only features.kind = "mfcc" reads.
MFCC_KEYS = ("features.num_ceps", "features.lifter", "features.deltas")
# Keys naming a file that must exist when set ("" = none).
FILES = (
    "waveform_aug.noise_manifest",
    "decoding.lm_path",
    "scoring.mapping_file",
    "vocoder.gta_mels",
)
# waveform_aug's tuples of numbers (what each must be: WaveformAugmentConfig's check).
_WAVEFORM_TUPLES = ("speeds", "snr_db", "noise_exponents", "rt60")


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
    """Every mistake of `config`, one line each, section by section (empty: none): the
    shared sections' and config.task's own (`jaxspeech.config.sections`)."""
    out: list[str] = []
    if "task" not in config or not _choice(config, "task", out.append):
        return out or ["task is missing (asr, tts or vocoder: it decides the sections)"]
    more, missing = _key_mistakes(config)
    out += more
    # Keys the config lacks are read at their defaults (from a copy): each lack is
    # reported once above, and every check below can read every key. The rules table
    # stays as given (its entries are checked whole by `rules.rules_from_config`).
    table = defaults.lookup(config, "mesh.rules")
    view = defaults.fill_missing(ConfigDict(config.to_dict())) if missing else config
    own = TASK_CHECKS[config.task]
    for check in (_data, _features, *own, _train):
        check(view, out.append)
    _mesh_and_sync(view, table, devices, out.append)
    return out


def decoding_mistakes(config: ConfigDict) -> list[str]:
    """The mistakes of config.decoding alone (a run's config with the command line's
    decoding overrides: evaluate, transcribe), one line each."""
    out: list[str] = []
    c = defaults.fill_missing(ConfigDict(config.to_dict()))
    keys = ["decoding.beam", "decoding.ctc_weight", "decoding.eos_threshold"]
    ranges.check(c, keys + ["decoding.max_len_ratio"], out.append)
    _attention_decoding(c, out.append)  # (the LM file is checked by its loader)
    return out


def split_names(text: str) -> list[str]:
    """ "dev,test" -> ["dev", "test"]: data.eval_split's splits, in order; a ValueError
    for an empty name or a split named twice."""
    splits = [s.strip() for s in str(text).split(",")]
    if not all(splits) or len(set(splits)) != len(splits):
        raise ValueError(f"splits must be distinct names separated by commas, got {text!r}")
    return splits


# ---------------------------------------------------------------- helpers
def _choice(c: ConfigDict, key: str, report: Report) -> bool:
    """Whether `key` holds one of its CHOICES (else reported)."""
    value, allowed = get(c, key), CHOICES[key]
    if not isinstance(value, bool) and value in allowed:
        return True
    what = key.rpartition(".")[2]
    report(f"{key}: unknown {what} {show(value)}; choose one of {', '.join(map(str, allowed))}")
    return False


def _leaves(d: dict, prefix: str = "") -> set[str]:
    """Dotted keys of a config dict; mesh.rules is one key (`_mesh_and_sync` checks it)."""
    out = set()
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "mesh.rules":
            out |= _leaves(v, f"{key}.")
        else:
            out.add(key)
    return out


@functools.cache
def _default_keys(task: str) -> frozenset[str]:
    return frozenset(_leaves(defaults.get_config(task).to_dict()))


def _key_mistakes(config: ConfigDict) -> tuple[list[str], bool]:
    """(lines for the keys `config` has that its task's do not, since a typo would be
    ignored (another task's sections: one line), and for those it lacks; whether any)."""
    task = config.task
    home = f"jaxspeech/config/defaults.py, get_config(task={task!r})"
    foreign = sections.foreign(task, list(config))
    absent = [n for n in sections.sections(task) if n not in config]
    lines = [sections.not_read(task, foreign) + f": build it from {home}"] if foreign else []
    lines += [sections.not_there(task, absent) + f": build it from {home}"] if absent else []
    have = {k for k in _leaves(config.to_dict()) if k.partition(".")[0] not in foreign}
    known = {k for k in _default_keys(task) if k.partition(".")[0] not in absent}
    missing = sorted(known - have)
    for k in sorted(have - known):
        lines.append(sections.old_key_hint(k) or f"{k} is not a config key (none such in {home})")
    lines += [f"{k} is missing (every key of {home} must be set)" for k in missing]
    return lines, bool(missing or absent)


REMOTE_FILES = ("decoding.lm_path",)  # may be s3://, gs:// (read when the LM is loaded)


def _file(c: ConfigDict, key: str, report: Report) -> None:
    path = get(c, key)
    if path and storage.is_remote(path):
        if key not in REMOTE_FILES:
            report(f"{key}: a local file, not an object-store URL, got {path!r}")
        return
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
    shards = d.loader_shards
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 0:
        report(
            f"data.loader_shards={show(shards)} must be 0 (one per process) or a multiple "
            "of every process count the run will use"
        )
    ranges.check(c, under("data."), report)
    relations.buckets(c, report)


def _features(c: ConfigDict, report: Report) -> None:
    """The log-mel's settings; the MFCC's (num_ceps, lifter, deltas) only with kind mfcc."""
    kind_ok = _choice(c, "features.kind", report)
    uses_mfcc = kind_ok and c.features.kind == "mfcc"
    ranges.check(c, [k for k in under("features.") if uses_mfcc or k not in MFCC_KEYS], report)
    relations.features(c, report)
    if uses_mfcc and c.task == "asr":  # (the other tasks need log-mel: reported there)
        relations.mfcc(c, report)


def _augmentation(c: ConfigDict, report: Report) -> None:
    if c.specaug.enabled:
        ranges.check(c, under("specaug."), report)
        relations.specaug(c, report)
    w = c.waveform_aug
    before: list[str] = []
    ranges.check(c, under("waveform_aug."), before.append)
    for name in _WAVEFORM_TUPLES:
        values = w[name]
        if not isinstance(values, tuple | list) or not all(
            ranges.allows("finite", v) for v in values
        ):
            before.append(f"waveform_aug.{name} must hold finite numbers, got {show(values)}")
    if not before and w.noise_prob > 0 and not w.noise_manifest and not w.noise_exponents:
        before.append(
            "waveform_aug.noise_exponents must not be empty when waveform_aug.noise_prob > 0 "
            "and there is no waveform_aug.noise_manifest (generated noise needs a colour)"
        )
    for line in before:
        report(line)
    if not before:
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
    encoder_ok = _choice(c, "model.encoder", report)
    head_ok = _choice(c, "model.head", report)
    _choice(c, "model.dtype", report)
    _choice(c, "loss.kernel", report)
    if encoder_ok and ranges.check(c, under(f"model.{m.encoder}."), report):
        (_conformer if m.encoder == "conformer" else _lstm)(c, report)
    if head_ok and "rnnt" in m.head.split("+"):
        _transducer(c, report)
    if head_ok and m.head == "ctc+rnnt":
        ranges.check(c, ["loss.ctc_weight"], report)
    if head_ok and "aed" in m.head.split("+"):
        _attention_decoder(c, report)


def _attention_decoder(c: ConfigDict, report: Report) -> None:
    """The attention decoder's settings and the joint loss's (ctc_weight in [0, 1]: ESPnet's
    ctc_weight * CTC + (1 - ctc_weight) * attention)."""
    joint = "ctc" in c.model.head.split("+")  # aed alone: no CTC, no weight
    keys = [*under("model.decoder."), "loss.label_smoothing"]
    ranges.check(c, keys + (["loss.ctc_weight"] if joint else []), report)
    d = c.model.decoder
    if ranges.valid(c, "model.decoder.dim", "model.decoder.num_heads") and d.dim % d.num_heads:
        report(
            f"model.decoder.dim must be a multiple of model.decoder.num_heads="
            f"{d.num_heads}, got {d.dim}"
        )
    if joint and ranges.valid(c, "loss.ctc_weight") and c.loss.ctc_weight > 1:
        report(
            f"loss.ctc_weight must be <= 1 with model.head={c.model.head} (the attention "
            f"loss weighs 1 - ctc_weight), got {show(c.loss.ctc_weight)}"
        )


def _attention(c: ConfigDict, report: Report) -> None:
    """An explicit attention kernel or position encoding the model cannot run."""
    e = c.model.conformer
    if not (
        ranges.valid(c, "model.conformer.dim") and ranges.valid(c, "model.conformer.num_heads")
    ):
        return
    head_dim = e.dim // e.num_heads
    if e.get("pos_enc") == "rope" and head_dim % 2:
        report(
            f"model.conformer.pos_enc=rope needs an even head dim (dim / num_heads), got "
            f"{e.dim} / {e.num_heads} = {head_dim}"
        )
    if e.get("attention") == "cudnn" and c.model.dtype in DTYPES:
        why_not = attention_ops.cudnn_supports(DTYPES[c.model.dtype], head_dim)
        if why_not:
            report(f"model.conformer.attention=cudnn: {why_not} (model.dtype, dim / num_heads)")


def _conformer(c: ConfigDict, report: Report) -> None:
    e = c.model.conformer
    _choice(c, "model.conformer.remat", report)
    _choice(c, "model.conformer.pos_enc", report)
    _choice(c, "model.conformer.attention", report)
    _attention(c, report)
    _choice(c, "model.conformer.subsampling_factor", report)
    relations.subsampling(c, report)
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


def _transducer(c: ConfigDict, report: Report) -> None:
    """The predictor's settings (the chosen predictor's only) and the transducer loss's
    (the pruned loss's only with loss.rnnt = pruned)."""
    keys = ["model.transducer.predictor_dim", "model.transducer.joiner_dim"]
    if _choice(c, "model.transducer.predictor", report):
        if c.model.transducer.predictor == "stateless":
            keys.append("model.transducer.context_size")
        else:
            keys += ["model.transducer.lstm_layers", "model.transducer.lstm_hidden"]
    keys += ["loss.rnnt_warmup_steps", "loss.frames_per_chunk"]
    if _choice(c, "loss.rnnt", report) and c.loss.rnnt == "pruned":
        keys += ["loss.prune_range", "loss.simple_scale"]
    ranges.check(c, keys, report)


def _decoding(c: ConfigDict, report: Report) -> None:
    keys = ["decoding.beam", "decoding.max_symbols_per_frame", "decoding.ctc_weight"]
    ranges.check(c, keys + ["decoding.eos_threshold", "decoding.max_len_ratio"], report)
    ranges.check(c, under("scoring."), report)
    for key in ("decoding.lm_path", "scoring.mapping_file"):
        _file(c, key, report)
    if c.model.head not in asr.HEADS:
        return  # reported; the decoder is checked against a valid head only
    try:
        search.decoding_method(c)  # a method the head can run
        if search.uses_lm(c):  # an LM only with a beam search
            ranges.check(c, ["decoding.lm_weight", "decoding.word_bonus"], report)
    except ValueError as e:
        report(str(e))
    e = c.model.conformer
    chunked = isinstance(e.chunk_size, int) and e.chunk_size > 0
    streams = c.model.encoder == "conformer" and e.causal and chunked
    _attention_decoding(c, report, streams)
    if c.decoding.streaming and not streams:
        report(
            "decoding.streaming needs a streaming encoder (model.encoder=conformer with "
            f"causal=True and chunk_size > 0), got {c.model.encoder}, causal={e.causal}, "
            f"chunk_size={show(e.chunk_size)}"
        )


def _attention_decoding(c: ConfigDict, report: Report, streams: bool = True) -> None:
    """decoding.ctc_weight scores with a CTC head only; the attention searches read whole
    utterances (no streaming; said only of an encoder that streams, else that is the
    one mistake)."""
    heads = c.model.head.split("+")
    weight = c.decoding.get("ctc_weight", -1.0)
    if "ctc" not in heads and ranges.valid(c, "decoding.ctc_weight") and weight > 0:
        report(
            f"decoding.ctc_weight={show(weight)} scores with CTC, but model.head="
            f"{c.model.head} has no CTC head: set decoding.ctc_weight=0 (or -1, the default)"
        )
    try:
        method = search.decoding_method(c)
    except ValueError:
        return  # reported
    if method.startswith("aed") and c.decoding.streaming and streams:
        report(
            f"decoding.streaming decodes CTC or RNN-T heads chunk by chunk; decoding.method "
            f"{method} reads whole utterances: set decoding.streaming=False"
        )


def _distill(c: ConfigDict, report: Report) -> None:
    d = c.distill
    if d.other_split:
        if ranges.valid(c, "train.num_steps"):  # else train.num_steps is reported
            try:
                mixing.parse_schedule(str(d.schedule), c.train.num_steps)
            except ValueError as e:
                report(f"distill.schedule: {e}")
    if not d.targets:
        return  # pseudo-label mode or off: the soft-target settings are unused
    if not d.other_split:
        report("distill.targets needs distill.other_split (the split whose audio it labels)")
    if c.model.head in asr.HEADS and "ctc" not in c.model.head.split("+"):
        report(
            f"distill.targets trains a CTC output: model.head must be ctc, ctc+rnnt or ctc+aed, "
            f"got {show(c.model.head)}"
        )
    _choice(c, "distill.loss", report)
    _choice(c, "distill.rest", report)
    ranges.check(c, under("distill."), report)


def _tts(c: ConfigDict, report: Report) -> None:
    """task=tts: the synthesizer's settings and what it needs of the shared ones: log-mel
    targets, all-reduce learners, no pipeline stages."""
    _choice(c, "tts.dtype", report)
    _choice(c, "tts.model.pos_enc", report)
    if ranges.check(c, under("tts."), report):
        m = c.tts.model
        if m.dim % m.num_heads:
            heads = m.num_heads
            report(f"tts.model.dim must be a multiple of tts.model.num_heads={heads}, got {m.dim}")
        elif m.pos_enc == "rope" and (m.dim // m.num_heads) % 2:
            report(
                f"tts.model.pos_enc=rope needs an even head dim (dim / num_heads), got "
                f"{m.dim} / {m.num_heads} = {m.dim // m.num_heads}"
            )
        for name in ("conv_kernel", "variance_kernel", "embed_kernel"):
            if m[name] % 2 == 0:  # 'same' padding of an even kernel shifts the sequence
                report(f"tts.model.{name} must be odd (a centred convolution), got {m[name]}")
    needs = {
        "features.kind": ("log_mel", "the synthesizer predicts log-mel frames"),
        "sync.strategy": ("allreduce", "its objective is a mean over the global batch"),
        "mesh.stage": (1, "pipeline stages split the recognizer's encoder"),
    }
    for key, (value, why) in needs.items():
        if get(c, key) != value:
            report(f"task=tts needs {key}={value!r} ({why}), got {show(get(c, key))}")


def _vocoder(c: ConfigDict, report: Report) -> None:
    """task=vocoder: its settings and what its two-model step does not support, a line each
    (log-mel only, no accumulation, all-reduce, no stages); its optimizers: `_train`."""
    for key in ("discriminator", "generator", "dtype"):
        _choice(c, f"vocoder.{key}", report)
    _file(c, "vocoder.gta_mels", report)  # its contents: jaxspeech.vocoder.gta
    hifigan = c.vocoder.generator == "hifigan"
    if ranges.check(c, under("vocoder."), report) and hifigan and c.vocoder.generator_channels % 16:
        report(
            "vocoder.generator_channels must be a multiple of 16 (halved at each of the 4 "
            f"upsampling stages), got {c.vocoder.generator_channels}"
        )
    needs = {
        "features.kind": ("log_mel", "the vocoder inverts log-mel frames"),
        **({"features.hop_length": (160, "HiFi-GAN upsamples 5 x 4 x 4 x 2")} if hifigan else {}),
        "train.grad_accum": (1, "the step updates the discriminator, then the generator"),
        "sync.strategy": ("allreduce", "the step has two models and two optimizers"),
        "mesh.stage": (1, "pipeline stages split the recognizer's encoder"),
    }
    for key, (value, why) in needs.items():
        if get(c, key) != value:
            report(f"task=vocoder needs {key}={value!r} ({why}), got {show(get(c, key))}")


# config.task -> the checks of its own sections (the shared ones': `mistakes`).
TASK_CHECKS = {
    "asr": (_augmentation, _model, _decoding, _distill),
    "tts": (_tts,),
    "vocoder": (_vocoder,),
}


def _train(c: ConfigDict, report: Report) -> None:
    ranges.check(c, ["seed", *under("train."), *under("monitor.")], report)
    for section in ("optim", "optim2") if c.task == "vocoder" else ("optim",):
        ranges.check(c, under(f"{section}."), report)
        for key in ("name", "decay", "weight_decay_mask"):
            _choice(c, f"{section}.{key}", report)
    for line in trackers.mistakes(c.monitor.trackers):
        report(line)
    try:
        str(c.train.compile_cache_dir).format(workdir="RUN", cache="CACHE")
    except (KeyError, IndexError, ValueError) as e:
        report(
            "train.compile_cache_dir may hold only the {workdir} placeholder and {cache}, "
            f"got {show(c.train.compile_cache_dir)} ({type(e).__name__}: {e})"
        )


def _sync_keys(c: ConfigDict) -> list[str]:
    """The numeric sync settings the chosen strategy reads (none for an unknown one,
    which `sync.strategy_from_config` reports)."""
    s = c.sync
    method = s.outer if s.strategy == "hierarchical" else s.strategy
    if method == "bmuf":
        keys = ["sync.block_steps", "sync.block_momentum", "sync.block_lr", "sync.block_gain"]
        return keys + ["sync.block_dense_steps"]
    if method == "gtc":
        return ["sync.gtc_tau", "sync.gtc_density", "sync.gtc_capacity", "sync.gtc_dense_steps"]
    return []


def _mesh_and_sync(c: ConfigDict, entries, devices: int | None, report: Report) -> None:
    """Mesh sizes (filling `devices` when given), the rules table of `entries`
    (config.mesh.rules), and the sync strategy on that mesh with those rules."""
    ranges.check(c, under("mesh."), report)
    shape = relations.mesh_shape(c, devices, report)
    table = relations.rules_table(entries, report)
    if shape is not None and shape["stage"] > 1 and c.task == "asr":  # (else reported)
        circular = _choice(c, "pipeline.schedule", report) and c.pipeline.schedule == "circular"
        relations.pipeline_stages(c, shape["stage"], circular, report)
        if c.sync.strategy != "allreduce":
            return  # reported there, once
    if not ranges.check(c, _sync_keys(c), report) or shape is None or table is None:
        return
    try:
        sync.strategy_from_config(c.sync, shape, table)
    except sync.SyncConfigError as e:
        report(str(e))
