"""Every key of every shipped config, walked: each bad value of a key makes
`validate.mistakes` report exactly one line, naming the key and saying what is allowed.

The keys come from `defaults.get_config(task)` of each task, so a key added there fails
this test until it has a check (a range in `ranges.RANGES`, a set of values in
`validate.CHOICES`, a file in `validate.FILES`, or bad values of its own in BAD here) or a
reason in EXEMPT. Bad values follow the key's kind: numbers just outside the key's range
(and NaN and infinities for floats), a name outside the choices, a file that does not
exist, malformed tuples. Keys checked only where they are used are walked in a config
that uses them (ENABLE).
"""

from __future__ import annotations

import math
import re

import pytest
from ml_collections import ConfigDict

from jaxspeech.config import defaults, keys, ranges, sections, validate
from tests.config.test_defaults import SHIPPED, flat, shipped

DEVICES = 8
HERE = __file__  # a file that exists: an "LM" that turns LM fusion on
NAN, INF = float("nan"), float("inf")
ORDERED = "positive and ascending"

EXEMPT = {
    "init_from": "a run directory, opened (and its errors reported) when training starts",
    "distill.other_split": "a split name of distill.other_dir; '' turns distillation off",
    "distill.other_dir": "a corpus directory ('' = data.dir), opened when training starts",
    "specaug.enabled": "a bool: both values are valid",
    "model.conformer.scan_layers": "a bool: both values are valid",
    "model.conformer.dynamic_chunk": "a bool: both values are valid",
    "model.decoder.scan_layers": "a bool: both values are valid",
    "pipeline.gather_weights_once": "a bool: both values are valid",
    "loss.rnnt_encoder_warmup": "a bool: both values are valid",
    "scoring.lowercase": "a bool: both values are valid",
    "scoring.remove_punctuation": "a bool: both values are valid",
    "train.eval_at_end": "a bool: both values are valid",
    "monitor.log_batch_ids": "a bool: both values are valid",
    "monitor.count_flops": "a bool: both values are valid",
    "sync.nesterov": "a bool: both values are valid",
    "sync.gossip_overlap": "a bool: both values are valid",
    "decoding.length_norm": "a bool: both values are valid",
    "vocoder.vocos_mel_prior": "a bool: both values are valid",
}

# key or key prefix -> [(bad value, what its line says)]: keys whose type does not say
# what is bad (free text with a format, tuples, settings that clash with others).
BAD: dict[str, list[tuple[object, str]]] = {
    "data.dir": [("", "must name a prepared corpus")],
    "monitor.trackers": [(v, "distinct names out of") for v in ("comet", "mlflow,,mlflow")],
    "data.train_split": [("", "must name a split"), (" ", "must name a split")],
    "data.eval_split": [(v, "distinct names") for v in ("dev,dev", "", "dev,,test")],
    "data.loader_shards": [(-1, "must be 0 (one per process) or a multiple")],
    "data.bucket_boundaries": [
        *[(v, ORDERED) for v in [(), (3.0, 2.0), (-1.0, 8.0), (2.0, 2.0)]],
        *[(v, "finite") for v in [(NAN, 8.0), (INF,)]],
        ((1e6,), "must not exceed data.batch_seconds"),
    ],
    "data.eval_bucket_boundaries": [
        *[(v, ORDERED) for v in [(3.0, 2.0), (-1.0,), (0.0, 2.0)]],
        ((NAN,), "finite"),
        ((1e6,), "must not exceed data.batch_seconds"),
    ],
    "waveform_aug.speeds": [
        *[(v, "non-empty tuple of factors > 0") for v in [(), (0.0,), (-1.0, 1.0)]],
        ((NAN,), "finite"),
    ],
    "waveform_aug.snr_db": [
        *[(v, "ordered (low, high) pair") for v in [(20.0, 5.0), (5.0,), (5.0, 10.0, 20.0)]],
        ((NAN, 20.0), "finite"),
    ],
    "waveform_aug.rt60": [
        *[(v, "ordered (low, high) pair > 0") for v in [(0.8, 0.2), (0.0, 0.5), (-0.2, 0.5)]],
        ((0.2, INF), "finite"),
    ],
    "waveform_aug.noise_exponents": [((NAN,), "finite"), ((), "must not be empty")],
    "distill.schedule": [
        ("nonsense", "is not END:LABELED_EVERY"),
        ("0.5:4", "must cover all"),
        ("0.5:4,0.4:1", "phase ends must increase"),
    ],
    "distill.targets": [("t", "needs distill.other_split")],
    "train.compile_cache_dir": [
        (v, "may hold only the {workdir} placeholder") for v in ("{run}/x", "{workdir", "{}")
    ],
    "mesh.rules.": [("fdsp", "unknown mesh axes"), ("data,data", "each mesh axis once")],
    "decoding.streaming": [(True, "needs a streaming encoder")],
    "model.conformer.causal": [(False, "must be odd (a centred convolution)")],
    "model.lstm.bidirectional": [(True, "must be 0 with model.lstm.bidirectional=True")],
}

# key or key prefix -> settings under which the keys it covers are used (the longest
# entry a key starts with applies); the bad value of the key is set on top.
CTC_RNNT = [("model.head", "ctc+rnnt"), ("decoding.method", "auto")]  # (ctc_aed: aed_beam)
CTC_AED = [("model.head", "ctc+aed"), ("decoding.method", "auto")]
MFCC = [("features.kind", "mfcc")]
# Stacks that split into 2 stages x 2 groups: the Conformer's, and a decoder's (ctc_aed).
PIPELINED = [
    ("mesh.stage", 2),
    ("model.conformer.scan_layers", True),
    ("model.conformer.num_layers", 8),
    ("model.decoder.scan_layers", True),
    ("model.decoder.num_layers", 4),
]
ENABLE: dict[str, list[tuple[str, object]]] = {
    "features.num_ceps": MFCC,
    "features.lifter": MFCC,
    "features.deltas": MFCC,
    "model.lstm.": [("model.encoder", "lstm")],
    "model.lstm.bidirectional": [
        ("model.encoder", "lstm"),
        ("model.lstm.bidirectional", False),
        ("model.lstm.lookahead", 2),
    ],
    "model.conformer.causal": [
        ("model.conformer.causal", True),
        ("model.conformer.conv_kernel", 16),
    ],
    "decoding.streaming": [("model.conformer.causal", False)],
    "model.transducer.": CTC_RNNT,
    "model.transducer.lstm_": [*CTC_RNNT, ("model.transducer.predictor", "lstm")],
    "loss.": CTC_RNNT,
    "model.decoder.": CTC_AED,
    "loss.label_smoothing": CTC_AED,
    "decoding.lm_": [("decoding.lm_path", HERE)],
    "decoding.word_bonus": [("decoding.lm_path", HERE)],
    "distill.": [*CTC_RNNT, ("distill.other_split", "u"), ("distill.targets", "t")],
    "distill.targets": [("model.head", "ctc"), ("decoding.method", "auto")],
    "specaug.": [("specaug.enabled", True)],
    "waveform_aug.noise_exponents": [
        ("waveform_aug.noise_prob", 0.5),
        ("waveform_aug.noise_manifest", ""),
    ],
    "pipeline.": PIPELINED,
    "pipeline.repeats": [*PIPELINED, ("pipeline.schedule", "circular")],
    "sync.block_": [("sync.strategy", "bmuf")],
    "sync.gtc_": [("sync.strategy", "gtc")],
    "sync.outer": [("sync.strategy", "hierarchical"), ("mesh.replica", 2)],
}

# The walk's configs: every shipped one. A recognizer's walks every key of its layout;
# configs/tts.py's and configs/vocoder.py's walk their own sections only (tts; vocoder
# and optim2): the shared ones are walked in the recognizers', and these tasks forbid
# some of ENABLE's settings (sync strategies other than all-reduce, pipeline stages, MFCC).
WALKED = SHIPPED

KEYS = list(keys.every_key())  # every task's


def walked_keys(name: str, variant: str) -> list[str]:
    task = shipped(name, variant).task
    layout = flat(defaults.get_config(task).to_dict())
    own = sections.TASK_SECTIONS[task]
    return [k for k in layout if task == "asr" or k.partition(".")[0] in own]


def _entry(table: dict, key: str):
    """`table`'s entry for `key`: the longest of its entries that `key` starts with (the
    key itself, or a prefix such as "mesh.rules." or "sync.gtc_"), or None."""
    covering = [p for p in table if key.startswith(p)]
    return table[max(covering, key=len)] if covering else None


def _set(config: ConfigDict, key: str, value) -> None:
    *head, last = key.split(".")
    node = config
    for part in head:
        node = node[part]
    node[last] = value


def outside(rule: str, kind: type) -> list:
    """Values of `kind` (int or float) around the bounds written in `rule` that it does
    not allow; for floats NaN and the infinities are always among them."""
    bounds = [float(b) for b in re.findall(r"-?\d+(?:\.\d+)?", rule)]
    if kind is int:
        near = {int(b) + d for b in bounds for d in (-2, -1, 0, 1, 2)}
        candidates = sorted({-2, -1, 0, 1, 2} | near)
    else:
        near = {b + d for b in bounds for d in (-0.5, -1e-3, 0.0, 1e-3, 0.5)}
        candidates = sorted({-1.0, 0.0, 0.5, 1.0, 1.5} | near) + [NAN, INF, -INF]
    return [v for v in candidates if not ranges.allows(rule, v)]


def bad_values(key: str, value) -> list[tuple[object, list[str]]]:
    """(bad value, [what its line must contain besides the key]) for `key`, by its kind.

    Fails for a key with no check and no exemption.
    """
    if _entry(BAD, key) is not None:
        return [(v, [said]) for v, said in _entry(BAD, key)]
    if key in validate.CHOICES:
        allowed = validate.CHOICES[key]
        if isinstance(value, str):
            return [(f"no-such-{key.rpartition('.')[2]}", [str(a) for a in allowed])]
        return [(v, [str(a) for a in allowed]) for v in (-1, 0, 1, 2, 3) if v not in allowed]
    if key in validate.FILES:
        return [("/no/such/file", ["no such file"])]
    if key in ranges.RANGES:
        rule = ranges.RANGES[key]
        kind = int if isinstance(value, int) and not isinstance(value, bool) else float
        values = outside(rule, kind)
        assert values, f"{key}: no value of {kind.__name__} lies outside {rule!r}"
        if kind is float:
            assert math.isnan(values[-3]) and values[-2:] == [INF, -INF]
        return [(v, [f"must be {rule}"]) for v in values]
    pytest.fail(
        f"{key} ({value!r}) has no check: give it a range (jaxspeech/config/ranges.py), "
        "choices or a file check (jaxspeech/config/validate.py), bad values in BAD, or a "
        "reason in EXEMPT (tests/config/test_validate_keys.py)"
    )


def _enabled(name: str, variant: str, settings: tuple) -> ConfigDict:
    config = shipped(name, variant)
    for key, value in settings:
        _set(config, key, value)
    return config


@pytest.mark.parametrize("name,variant", WALKED, ids=[f"{n}:{v}" for n, v in WALKED])
def test_every_bad_value_of_every_key_is_one_line_naming_it(name, variant):
    configs: dict[tuple, ConfigDict] = {}
    walked, failures, names = 0, [], walked_keys(name, variant)
    for key in names:
        if key in EXEMPT:
            continue
        settings = tuple(_entry(ENABLE, key) or ())
        if settings not in configs:
            configs[settings] = _enabled(name, variant, settings)
            base = validate.mistakes(configs[settings], devices=DEVICES)
            assert base == [], f"ENABLE {settings} makes {name}:{variant} invalid: {base}"
        config = configs[settings]
        good = ranges.get(config, key)
        for bad, said in bad_values(key, good):
            _set(config, key, bad)
            found = validate.mistakes(config, devices=DEVICES)
            _set(config, key, good)
            walked += 1
            wanted = [key, *said]
            if len(found) != 1 or not all(w in found[0] for w in wanted):
                failures.append(f"{key}={bad!r}: want one line with {wanted}, got {found}")
    assert not failures, f"{len(failures)} of {walked} bad values:\n" + "\n".join(failures)
    assert walked > 2 * (len(names) - len(EXEMPT))


def test_the_tables_name_only_default_keys():
    """No stale entry: every key the tables name exists (prefixes cover some key)."""
    keys = set(KEYS)
    named = [*EXEMPT, *ranges.RANGES, *validate.CHOICES, *validate.FILES]
    assert [k for k in named if k not in keys] == []
    assert [p for p in [*BAD, *ENABLE] if not any(k.startswith(p) for k in keys)] == []
    checks = [*ranges.RANGES, *validate.CHOICES, *validate.FILES]
    checked = [k for k in EXEMPT if k in checks or _entry(BAD, k) is not None]
    assert checked == [], "exempt keys that have a check"


def test_each_numeric_range_is_a_range_of_numbers_of_its_key():
    base = keys.every_key()
    for key, rule in ranges.RANGES.items():
        value = base[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), key
        assert ranges.allows(rule, value), f"{key}'s default {value!r} is outside {rule!r}"


@pytest.mark.parametrize(
    "rule,good,bad",
    [
        ("> 0", [1e-9, 1, 10**30], [0, -1, 0.0, NAN, INF, True]),
        (">= 2", [2, 3], [1, 1.999, -INF]),
        ("in [0, 1]", [0, 0.5, 1], [-1e-9, 1.0001, NAN]),
        ("in [0, 1)", [0.0, 0.999], [1, 1.0]),
        ("in (0, 1]", [1e-9, 1], [0, 0.0]),
        ("-1 or >= 1", [-1, 1, 7], [0, -2, -0.5]),
        ("-1 or in [0, 1)", [-1.0, 0.0, 0.5], [1.0, -0.5]),
        ("finite", [-1e300, 0, 3], [NAN, INF, -INF, "3", None]),
        (f"in [0, {ranges.SEED_MAX}]", [0, ranges.SEED_MAX], [-1, ranges.SEED_MAX + 1]),
    ],
)
def test_range_rules(rule, good, bad):
    assert [v for v in good if not ranges.allows(rule, v)] == []
    assert [v for v in bad if ranges.allows(rule, v)] == []


def test_a_malformed_rule_is_an_error():
    with pytest.raises(ValueError, match="malformed range rule"):
        ranges.allows("< 3", 1)
