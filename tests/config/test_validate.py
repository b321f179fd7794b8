"""`validate` accepts every shipped config and reports each mistake on a line of its own
(key, bad value, what is allowed), all of them in one UserError; the trainer calls it
before any work."""

from __future__ import annotations

import pytest

from configs import conformer, demo, tts
from jaxspeech.common.errors import UserError
from jaxspeech.config import defaults, validate
from jaxspeech.training import optim
from tests.config.test_defaults import SHIPPED, shipped

HERE = __file__  # a file that exists (an "LM" for the greedy-with-LM mistake)


def tiny(*settings: tuple[str, object]):
    """configs/demo.py:tiny with `settings`; ("task", "tts") first: configs/tts.py:tiny."""
    config = demo.get_config("tiny")
    if settings and settings[0] == ("task", "tts"):
        config, settings = tts.get_config("tiny"), settings[1:]
    for key, value in settings:
        *head, last = key.split(".")
        node = config
        for part in head:
            node = node[part]
        node[last] = value
    return config


@pytest.mark.parametrize("name,variant", SHIPPED, ids=[f"{n}:{v}" for n, v in SHIPPED])
def test_every_shipped_config_is_valid(name, variant):
    config = shipped(name, variant)
    validate.validate(config)
    validate.validate(config, devices=8)
    if name == "demo":  # conformer XL needs tensor = 4 devices at least
        validate.validate(config, devices=1)


MISTAKES = [
    ([("data.dir", "")], "data.dir must name a prepared corpus"),
    ([("data.batch_seconds", -5.0)], "data.batch_seconds must be > 0, got -5"),
    ([("data.max_corrupt_fraction", 1.5)], "data.max_corrupt_fraction must be in [0, 1], got 1.5"),
    ([("data.loader_shards", -1)], "data.loader_shards=-1 must be 0 (one per process)"),
    ([("data.eval_split", "dev,dev")], "data.eval_split: splits must be distinct names"),
    (
        [("data.bucket_boundaries", (3.0, 2.0))],
        "data.bucket_boundaries: bucket boundaries must be positive and ascending",
    ),
    (
        [("data.bucket_boundaries", (3.0, 30.0))],
        "data.bucket_boundaries must not exceed data.batch_seconds=24 (a batch holds at least "
        "one utterance of each bucket), got a boundary of 30",
    ),
    ([("data.eval_bucket_boundaries", (float("nan"),))], "data.eval_bucket_boundaries must hold"),
    (
        [("data.short_first_steps", 300), ("data.short_first_seconds", 2.5)],
        "data.short_first_seconds must be one of data.bucket_boundaries=(3.0, 8.0) when "
        "data.short_first_steps > 0 (the short phase reads whole buckets), got 2.5",
    ),
    ([("seed", -1)], "seed must be in [0, 9223372036854775805], got -1"),
    ([("features.fmax", 9000.0)], "features.fmax must be above features.fmin=0 and at most"),
    ([("features.win_length", 600)], "features.win_length must be <= features.n_fft=512, got 600"),
    (
        [("features.hop_length", 500)],
        "features.hop_length must be <= features.win_length=400 (frames would skip audio",
    ),
    ([("features.log_floor", float("inf"))], "features.log_floor must be > 0, got inf"),
    (
        [("features.num_mel_bins", 6), ("specaug.freq_mask_width", 4)],
        "features.num_mel_bins must be >= 7 for model.conformer.subsampling_factor=4",
    ),
    (
        [("specaug.freq_mask_width", 81)],
        "specaug.freq_mask_width must be <= features.num_mel_bins=80, got 81",
    ),
    ([("waveform_aug.snr_db", (float("nan"), 20.0))], "waveform_aug.snr_db must hold finite"),
    (
        [("waveform_aug.noise_exponents", ())],
        "waveform_aug.noise_exponents must not be empty when waveform_aug.noise_prob > 0",
    ),
    ([("specaug.freq_warp", 1.0)], "specaug.freq_warp must be in [0, 1), got 1"),
    ([("waveform_aug.speeds", (0.0,))], "waveform_aug.speeds must be a non-empty tuple"),
    (
        [("model.encoder", "transformer")],
        "model.encoder: unknown encoder 'transformer'; choose one of conformer, lstm",
    ),
    (
        [("model.head", "attention")],
        "model.head: unknown head 'attention'; choose one of ctc, rnnt, ctc+rnnt",
    ),
    ([("model.dtype", "float16")], "model.dtype: unknown dtype 'float16'"),
    (
        [("model.conformer.num_heads", 3)],
        "model.conformer.dim must be a multiple of model.conformer.num_heads=3, got 32",
    ),
    ([("model.conformer.conv_kernel", 8)], "model.conformer.conv_kernel must be odd"),
    ([("model.conformer.chunk_size", -1)], "model.conformer.chunk_size must be >= 0, got -1"),
    (
        [("model.conformer.subsampling_factor", 6)],
        "model.conformer.subsampling_factor: unknown subsampling_factor 6; choose one of 4, 8",
    ),
    (
        [("model.encoder", "lstm"), ("model.lstm.lookahead", 2)],
        "model.lstm.lookahead must be 0 with model.lstm.bidirectional=True",
    ),
    (
        [("model.head", "ctc+rnnt"), ("loss.rnnt", "exact")],
        "loss.rnnt: unknown rnnt 'exact'; choose one of pruned, full",
    ),
    (
        [("model.head", "rnnt"), ("loss.prune_range", 1)],
        "loss.prune_range must be >= 2, got 1",
    ),
    (
        [("model.head", "rnnt"), ("model.transducer.predictor", "lstm")]
        + [("model.transducer.lstm_layers", 0)],
        "model.transducer.lstm_layers must be >= 1, got 0",
    ),
    ([("decoding.method", "viterbi")], "decoding.method must be auto or one of"),
    ([("decoding.method", "rnnt_greedy")], "decoding.method 'rnnt_greedy' needs a model"),
    (
        [("decoding.method", "ctc_greedy"), ("decoding.lm_path", HERE)],
        "decoding.lm_path is set but decoding.method 'ctc_greedy' is greedy",
    ),
    ([("decoding.lm_path", "/no/such.arpa")], "decoding.lm_path: no such file '/no/such.arpa'"),
    ([("decoding.beam", 0)], "decoding.beam must be >= 1, got 0"),
    (
        [("decoding.lm_path", HERE), ("decoding.lm_weight", -1.0)],
        "decoding.lm_weight must be >= 0, got -1",
    ),
    ([("decoding.streaming", True)], "decoding.streaming needs a streaming encoder"),
    ([("scoring.mapping_file", "/no/map.tsv")], "scoring.mapping_file: no such file"),
    ([("optim.decay", "linear")], "optim.decay: unknown decay 'linear'"),
    ([("optim.b2", 1.0)], "optim.b2 must be in [0, 1), got 1"),
    ([("train.num_steps", -3)], "train.num_steps must be >= 1, got -3"),
    ([("train.grad_accum", 0)], "train.grad_accum must be >= 1, got 0"),
    ([("train.compile_cache_dir", "{run}/x")], "train.compile_cache_dir may hold only"),
    ([("monitor.num_samples", 0)], "monitor.num_samples must be >= 1, got 0"),
    ([("distill.targets", "t")], "distill.targets needs distill.other_split"),
    (
        [("distill.other_split", "u"), ("distill.schedule", "0.8:4")],
        "distill.schedule: schedule '0.8:4' must cover all 8 steps",
    ),
    (
        [("distill.other_split", "u"), ("distill.targets", "t"), ("distill.loss", "mse")],
        "distill.loss: unknown loss 'mse'",
    ),
    (
        [("distill.other_split", "u"), ("distill.targets", "t"), ("distill.temperature", 0.0)],
        "distill.temperature must be > 0, got 0",
    ),
    (
        [("distill.other_split", "u"), ("distill.targets", "t"), ("model.head", "rnnt")],
        "distill.targets trains a CTC output: model.head must be ctc, ctc+rnnt or ctc+aed, "
        "got 'rnnt'",
    ),
    ([("mesh.data", 3)], "needs 3 devices, but 8 are available"),
    ([("mesh.replica", 3)], "cannot use 8 devices"),
    ([("mesh.data", 0)], "mesh.data must be -1 or >= 1, got 0"),
    (
        [("mesh.fsdp", -1)],
        "mesh.data and mesh.fsdp are -1 together: at most one mesh axis may take the rest",
    ),
    (
        [("mesh.data", 1), ("mesh.tensor", 3)],
        "mesh.replica x mesh.stage x mesh.data x mesh.fsdp x mesh.tensor = 1 x 1 x 1 x 1 x 3 "
        "needs 3 devices, but 8 are available",
    ),
    ([("mesh.rules.embed", "fsdp,fsdp")], "mesh.rules.embed must name each mesh axis once"),
    ([("mesh.rules.embed", "fdsp")], "mesh.rules.embed: unknown mesh axes ['fdsp']"),
    ([("sync.strategy", "ring")], "sync.strategy must be one of"),
    ([("sync.strategy", "hierarchical")], "mesh.replica >= 2"),
    ([("sync.strategy", "gossip"), ("mesh.data", 1), ("mesh.fsdp", -1)], "one learner"),
    ([("sync.strategy", "bmuf"), ("sync.block_steps", 0)], "sync.block_steps must be >= 1"),
    (
        [("sync.strategy", "bmuf"), ("sync.block_momentum", 1.0)],
        "sync.block_momentum must be -1 or in [0, 1), got 1",
    ),
    (
        [("sync.strategy", "gtc"), ("sync.gtc_tau", float("nan"))],
        "sync.gtc_tau must be >= 0, got nan",
    ),
    ([("task", "speech")], "task: unknown task 'speech'; choose one of asr, tts"),
    ([("task", "tts"), ("features.kind", "mfcc")], "task=tts needs features.kind='log_mel'"),
    ([("task", "tts"), ("sync.strategy", "bmuf")], "task=tts needs sync.strategy='allreduce'"),
    ([("task", "tts"), ("mesh.stage", 2)], "task=tts needs mesh.stage=1"),
    (
        [("task", "tts"), ("model", {"dtype": "bfloat16"})],
        "config.model is not read by a tts run (config.task=tts); its compute dtype is "
        "config.tts.dtype: build it from jaxspeech/config/defaults.py, get_config(task='tts')",
    ),
    ([("task", "tts"), ("tts.dtype", "float16")], "tts.dtype: unknown dtype 'float16'"),
    ([("task", "tts"), ("tts.model.conv_kernel", 4)], "tts.model.conv_kernel must be odd"),
    (
        [("task", "tts"), ("tts.model.num_heads", 3)],
        "tts.model.dim must be a multiple of tts.model.num_heads=3, got 32",
    ),
    ([("task", "tts"), ("tts.model.pos_enc", "abs")], "tts.model.pos_enc: unknown pos_enc 'abs'"),
    (
        [("task", "tts"), ("tts.model.num_heads", 32)],
        "tts.model.pos_enc=rope needs an even head dim (dim / num_heads), got 32 / 32 = 1",
    ),
]


@pytest.mark.parametrize("settings,line", MISTAKES, ids=[m[1][:40] for m in MISTAKES])
def test_each_mistake_is_one_line_naming_it(settings, line):
    found = validate.mistakes(tiny(*settings), devices=8)
    assert len(found) == 1 and line in found[0], found
    with pytest.raises(UserError) as e:
        validate.validate(tiny(*settings), devices=8)
    assert str(e.value) == f"config: 1 mistake:\n  {found[0]}"


def test_several_mistakes_give_one_error_with_a_line_each():
    settings = [s for s, _ in MISTAKES[:4]] + [[("train.num_steps", -3)]]
    config = tiny(*[kv for s in settings for kv in s])
    with pytest.raises(UserError) as e:
        validate.validate(config, devices=8)
    header, *lines = str(e.value).splitlines()
    assert header == "config: 5 mistakes:"
    expected = [line for _, line in MISTAKES[:4]] + ["train.num_steps must be >= 1, got -3"]
    assert len(lines) == 5, lines
    for want in expected:  # each mistake on exactly one line
        assert sum(want in got for got in lines) == 1, (want, lines)


def test_unused_settings_are_not_checked():
    """The other encoder's, the transducer's under a CTC head, soft targets' when off."""
    config = tiny(
        ("model.lstm.hidden", 0),
        ("model.transducer.predictor", "gru"),
        ("loss.prune_range", 0),
        ("distill.loss", "mse"),
        ("distill.schedule", "nonsense"),
        ("specaug.enabled", False),
        ("specaug.freq_warp", 2.0),
        ("data.eval_bucket_boundaries", ()),  # () = the training buckets
        ("decoding.lm_weight", -1.0),  # no LM
        ("sync.block_steps", 0),  # all-reduce
        ("sync.gtc_capacity", 0.0),
    )
    assert validate.mistakes(config, devices=8) == []


def test_unused_transducer_settings_are_not_checked():
    """The other predictor's settings, the pruned loss's with the full loss."""
    config = tiny(
        ("model.head", "ctc+rnnt"),
        ("model.transducer.lstm_layers", 0),
        ("loss.rnnt", "full"),
        ("loss.prune_range", 1),
        ("loss.simple_scale", -1.0),
    )
    assert validate.mistakes(config, devices=8) == []
    config.model.transducer.predictor = "lstm"
    config.model.transducer.context_size = 0
    assert validate.mistakes(config, devices=8) == [
        "model.transducer.lstm_layers must be >= 1, got 0"
    ]


def test_keys_outside_the_defaults_and_missing_keys_are_named():
    config = tiny()
    config.model.dimm = 3
    del config.data["read_retries"]
    home = "jaxspeech/config/defaults.py, get_config(task='asr')"
    assert validate.mistakes(config) == [
        f"model.dimm is not a config key (none such in {home})",
        f"data.read_retries is missing (every key of {home} must be set)",
    ]
    del config.mesh.rules["embed"]  # the rules table is checked whole, once
    (line,) = validate.mistakes(config)[2:]
    assert line.startswith("mesh.rules must name exactly the logical axes") and "embed" in line


def test_the_mesh_is_checked_against_devices_only_when_given():
    config = conformer.get_config("XL")  # tensor = 4
    assert validate.mistakes(config) == []
    (line,) = validate.mistakes(config, devices=2)
    assert "cannot use 2 devices: 2 is not a multiple of 4" in line


def test_split_names():
    assert validate.split_names("dev, test") == ["dev", "test"]
    for bad in ("dev,,test", "dev,dev", ""):
        with pytest.raises(ValueError, match="distinct names"):
            validate.split_names(bad)


def test_optimizer_names_are_what_the_trainer_builds():
    """validate's OPTIMIZERS and DECAYS (training.optim sits above the config layer)."""
    cfg = defaults.get_config().optim
    for decay in validate.DECAYS:
        cfg.decay = decay
        for name in validate.OPTIMIZERS:
            cfg.name = name
            optim.make_optimizer(cfg, 100)
    cfg.decay = "linear"
    with pytest.raises(ValueError, match="unknown optim.decay"):
        optim.make_schedule(cfg, 100)
    cfg.decay, cfg.name = "cosine", "sgd"
    with pytest.raises(ValueError, match="unknown optim.name"):
        optim.make_optimizer(cfg, 100)


def test_the_trainer_validates_before_any_work(tmp_path):
    """All mistakes at once, before the data directory is read or the run directory made."""
    from jaxspeech import tasks

    config = tiny(("data.dir", str(tmp_path / "none")), ("data.batch_seconds", -5.0))
    config.train.num_steps = -3
    with pytest.raises(UserError, match="config: 2 mistakes") as e:
        tasks.train_and_evaluate(config, str(tmp_path / "run"))
    assert "data.batch_seconds must be > 0" in str(e.value)
    assert not (tmp_path / "run").exists()
