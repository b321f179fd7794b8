"""The allowed range of every numeric config key, in one table, and the check of a value.

A rule is written as the line that reports it reads: `> 0`, `>= 1`, `in [0, 1)`, `finite`,
or alternatives joined by `or` (`-1 or >= 1`: a sentinel, else a count). Every rule also
demands a finite number (not a bool): NaN slips through every comparison and an infinite
size or rate only fails deep in the code, so both are rejected here for every key.

`jaxspeech.config.validate` decides which keys a config uses (the other encoder's are not
checked) and reports `{key} must be {rule}, got {value}` for each one out of range;
`valid` lets its checks between keys run only on keys that are themselves in range, so
one bad value gives one line.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable

from ml_collections import ConfigDict

# jax keys are int64: the trainer's streams use seed + 1 and seed + 2 (numpy's generators,
# which also take the seed, refuse negative ones).
SEED_MAX = 2**63 - 3

# key -> the allowed range (every numeric key but the few checked whole elsewhere:
# data.loader_shards, model.conformer.subsampling_factor, in jaxspeech.config.validate).
RANGES: dict[str, str] = {
    "seed": f"in [0, {SEED_MAX}]",
    "data.batch_seconds": "> 0",
    "data.max_tokens_per_second": "> 0",
    "data.short_first_steps": ">= 0",
    "data.short_first_seconds": ">= 0",
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
    "features.fmax": "> 0",
    "features.log_floor": "> 0",
    "features.num_ceps": ">= 1",
    "features.lifter": ">= 0",
    "features.deltas": "in [0, 2]",
    "specaug.num_freq_masks": ">= 0",
    "specaug.freq_mask_width": ">= 0",
    "specaug.num_time_masks": ">= 0",
    "specaug.time_mask_max_ratio": "in [0, 1]",
    "specaug.freq_warp": "in [0, 1)",
    "waveform_aug.noise_prob": "in [0, 1]",
    "waveform_aug.reverb_prob": "in [0, 1]",
    "waveform_aug.num_rirs": ">= 0",
    "waveform_aug.start_epoch": ">= 0",
    "model.conformer.dim": ">= 1",
    "model.conformer.num_layers": ">= 1",
    "model.conformer.num_heads": ">= 1",
    "model.conformer.ff_mult": ">= 1",
    "model.conformer.conv_kernel": ">= 1",
    "model.conformer.subsampling_channels": ">= 1",
    "model.conformer.dropout": "in [0, 1)",
    "model.conformer.chunk_size": ">= 0",
    "model.conformer.left_chunks": ">= -1",
    "model.conformer.max_dynamic_chunk": ">= 1",
    "model.lstm.hidden": ">= 1",
    "model.lstm.num_layers": ">= 1",
    "model.lstm.proj_dim": ">= 0",
    "model.lstm.stack_frames": ">= 1",
    "model.lstm.lookahead": ">= 0",
    "model.lstm.dropout": "in [0, 1)",
    "model.lstm.output_dim": ">= 0",
    "model.transducer.predictor_dim": ">= 1",
    "model.transducer.context_size": ">= 1",
    "model.transducer.lstm_layers": ">= 1",
    "model.transducer.lstm_hidden": ">= 0",
    "model.transducer.joiner_dim": ">= 1",
    "model.decoder.dim": ">= 1",
    "model.decoder.num_layers": ">= 1",
    "model.decoder.num_heads": ">= 1",
    "model.decoder.ff_mult": ">= 1",
    "model.decoder.dropout": "in [0, 1)",
    "loss.prune_range": ">= 2",  # one label move per window (jaxspeech.losses.rnnt)
    "loss.simple_scale": ">= 0",
    "loss.rnnt_warmup_steps": ">= 0",
    "loss.ctc_weight": ">= 0",  # and <= 1 with ctc+aed (jaxspeech.config.validate)
    "loss.label_smoothing": "in [0, 1)",
    "loss.frames_per_chunk": ">= 1",
    "decoding.beam": ">= 1",
    "decoding.ctc_weight": "-1 or in [0, 1]",  # -1: 0.3 with a CTC head, 0 without
    "decoding.eos_threshold": ">= 0",
    "decoding.max_len_ratio": ">= 0",
    "decoding.max_symbols_per_frame": ">= 1",
    "decoding.lm_weight": ">= 0",
    "decoding.word_bonus": "finite",  # negative: fewer, longer words
    "scoring.worst": ">= 0",
    "scoring.bootstrap_samples": ">= 0",
    "optim.peak_lr": "> 0",
    "optim.warmup_steps": ">= 0",
    "optim.end_lr_ratio": "in [0, 1]",
    "optim.decay_rate": "in (0, 1]",
    "optim.decay_steps": ">= 1",
    "optim.b1": "in [0, 1)",
    "optim.b2": "in [0, 1)",
    "optim.eps": "> 0",
    "optim.weight_decay": ">= 0",
    "optim.clip_norm": ">= 0",  # 0 = no clipping
    "tts.model.dim": ">= 1",
    "tts.model.num_heads": ">= 1",
    "tts.model.encoder_layers": ">= 1",
    "tts.model.decoder_layers": ">= 1",
    "tts.model.ff_mult": ">= 1",
    "tts.model.conv_kernel": ">= 1",  # and odd (jaxspeech.config.validate)
    "tts.model.variance_channels": ">= 1",
    "tts.model.variance_kernel": ">= 1",  # and odd
    "tts.model.embed_kernel": ">= 1",  # and odd
    "tts.model.dropout": "in [0, 1)",
    "tts.model.reduction": ">= 1",
    "tts.loss.mel_weight": ">= 0",
    "tts.loss.duration_weight": ">= 0",
    "tts.loss.pitch_weight": ">= 0",
    "tts.loss.energy_weight": ">= 0",
    "tts.mcd_utterances": ">= 0",
    "tts.pitch_utterances": ">= 1",
    "vocoder.segment_samples": ">= 1",
    "vocoder.batch_size": ">= 1",
    "vocoder.generator_channels": ">= 16",  # and a multiple of 16 (four halvings)
    "vocoder.resblocks": "in [1, 3]",
    "vocoder.vocos_dim": ">= 1",
    "vocoder.vocos_intermediate_dim": ">= 1",
    "vocoder.vocos_layers": ">= 1",
    "vocoder.adversarial_start": ">= 0",
    "vocoder.mel_weight": ">= 0",
    "vocoder.feature_weight": ">= 0",
    "vocoder.adversarial_weight": ">= 0",
    "vocoder.eval_utterances": ">= 0",
    "distill.temperature": "> 0",
    "distill.weight": ">= 0",
    "train.num_steps": ">= 1",
    "train.run_steps": ">= 0",
    "train.log_every": ">= 1",
    "train.checkpoint_every": ">= 0",
    "train.checkpoint_minutes": ">= 0",
    "train.keep_checkpoints": ">= 1",
    "train.keep_best": ">= 0",
    "train.max_nonfinite_steps": ">= 1",
    "train.lease_timeout_s": "> 0",
    "train.eval_every": ">= 0",
    "train.grad_accum": ">= 1",
    "monitor.peak_tflops": ">= 0",
    "monitor.samples_every": ">= 0",
    "monitor.num_samples": ">= 1",
    "monitor.device_hour_price": ">= 0",
    "mesh.replica": "-1 or >= 1",
    "mesh.stage": "-1 or >= 1",
    "pipeline.microbatches": ">= 1",
    "pipeline.repeats": ">= 2",  # circular only (gpipe is one group per stage)
    "mesh.data": "-1 or >= 1",
    "mesh.fsdp": "-1 or >= 1",
    "mesh.tensor": "-1 or >= 1",
    # jaxspeech.parallel.sync reads these (its own checks cover fewer cases: NaN passes them)
    "sync.block_steps": ">= 1",
    "sync.block_momentum": "-1 or in [0, 1)",
    "sync.block_lr": "-1 or > 0",
    "sync.block_gain": "> 0",
    "sync.block_dense_steps": ">= 0",
    "sync.gtc_tau": ">= 0",
    "sync.gtc_density": "in [0, 1]",
    "sync.gtc_capacity": "in (0, 1]",
    "sync.gtc_dense_steps": ">= 0",
}
# The vocoder's discriminators' optimizer: optim's keys, optim's ranges.
RANGES |= {"optim2." + k[6:]: rule for k, rule in RANGES.items() if k.startswith("optim.")}

Report = Callable[[str], None]


def get(c: ConfigDict, key: str):
    """`c`'s value of the dotted `key`."""
    for part in key.split("."):
        c = c[part]
    return c


def show(value) -> str:
    """A value as the lines print it: 2.5, 'text', (1, 2)."""
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def allows(rule: str, value) -> bool:
    """Whether `value` is a finite number (not a bool) within `rule`.

    Raises:
      ValueError: a malformed rule.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return any(_allows_one(part.strip(), value) for part in rule.split(" or "))


def _allows_one(rule: str, value: int | float) -> bool:
    if rule == "finite":
        return True
    if rule.startswith("in ") and rule[3] in "[(" and rule[-1] in "])":
        lo, hi = (_number(x) for x in rule[4:-1].split(","))
        above = value >= lo if rule[3] == "[" else value > lo
        return above and (value <= hi if rule[-1] == "]" else value < hi)
    op, _, bound = rule.partition(" ")
    if not bound:
        return value == _number(op)  # a sentinel such as -1
    b = _number(bound)  # Python compares ints and floats exactly, however large
    if op == ">":
        return value > b
    if op == ">=":
        return value >= b
    raise ValueError(f"malformed range rule {rule!r}")


def _number(text: str) -> int | float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return float(text)


def valid(c: ConfigDict, *keys: str) -> bool:
    """Whether every one of `keys` holds a value within its range (reported elsewhere if
    not): checks between keys run on valid values only."""
    return all(allows(RANGES[k], get(c, k)) for k in keys)


def check(c: ConfigDict, keys: Iterable[str], report: Report) -> bool:
    """Report each of `keys` out of its range, one line each; whether all were in range."""
    ok = True
    for key in keys:
        rule, value = RANGES[key], get(c, key)
        if allows(rule, value):
            continue
        ok = False
        number = not isinstance(value, bool) and isinstance(value, int | float)
        report(f"{key} must be {'' if number else 'a number '}{rule}, got {show(value)}")
    return ok


@functools.cache
def under(prefix: str) -> tuple[str, ...]:
    """The keys of RANGES under `prefix` ("data.", "model.lstm.")."""
    return tuple(k for k in RANGES if k.startswith(prefix))
