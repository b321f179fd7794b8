"""jaxspeech.training.inputs: the training input pipeline's settings from a config."""

import os

import pytest

from configs import demo
from jaxspeech.common.errors import UserError
from jaxspeech.config import build
from jaxspeech.training import inputs


def test_read_noise_list_json_lines_and_plain_paths(tmp_path):
    (tmp_path / "noise").mkdir()
    manifest = tmp_path / "noise.jsonl"
    manifest.write_text('{"audio_filepath": "noise/a.wav"}\n\nnoise/b.wav\n/abs/c.wav\n')
    assert inputs.read_noise_list(str(manifest)) == (
        os.path.join(str(tmp_path), "noise/a.wav"),
        os.path.join(str(tmp_path), "noise/b.wav"),
        "/abs/c.wav",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"path": "a.wav"}\n', r"noise.jsonl:1: not a \{audio_filepath\} line"),
        ("\n\n", "lists no files"),
    ],
)
def test_read_noise_list_errors(tmp_path, text, message):
    manifest = tmp_path / "noise.jsonl"
    manifest.write_text(text)
    with pytest.raises(UserError, match=message):
        inputs.read_noise_list(str(manifest))
    with pytest.raises(UserError, match="noise manifest not found"):
        inputs.read_noise_list(str(tmp_path / "missing.jsonl"))


def test_waveform_augmenter_from_config(tmp_path):
    config = demo.get_config()
    aug = inputs.waveform_augmenter(config)  # the demo's: speed and noise from epoch 3
    assert aug.cfg.speeds == (0.9, 1.0, 1.1) and aug.cfg.noise_prob == 0.5
    assert inputs.waveform_augmenter(demo.get_config("rnnt")) is None  # measured clean
    tiny = inputs.waveform_augmenter(demo.get_config("tiny"))
    assert tiny.cfg.speeds == (0.9, 1.0, 1.1) and tiny.cfg.reverb_prob == 0.5
    config.waveform_aug.noise_prob = 1.5
    with pytest.raises(UserError, match="config.waveform_aug: noise_prob must be in"):
        inputs.waveform_augmenter(config)
    config.waveform_aug.noise_prob = 0.5
    (tmp_path / "list.txt").write_text("gone.wav\n")
    config.waveform_aug.noise_manifest = str(tmp_path / "list.txt")
    with pytest.raises(UserError, match="gone.wav"):
        inputs.waveform_augmenter(config)


def test_the_loader_gets_the_first_augmented_epoch(monkeypatch):
    """config.waveform_aug.start_epoch reaches the pipeline (plan and loader)."""
    seen = {}
    monkeypatch.setattr(inputs.pipeline_lib, "make_pipeline", lambda **kw: seen.update(kw))
    config = demo.get_config("ctc")
    aug = inputs.waveform_augmenter(config)
    inputs._split_pipeline(config, "data", "train", None, aug, "tok")
    # configs/demo.py's ctc variant augments from epoch 4, after its short phase's 3.5
    # passes (the library's default: 0)
    assert seen["augment_from_epoch"] == 4 and seen["speeds"] == (0.9, 1.0, 1.1)
    assert seen["augment"] is aug


def test_loader_settings_are_the_configs_and_training_alone_has_shards_and_workers():
    """`build.loader_settings`: what the six pipeline call sites read from the config."""
    config = demo.get_config("ctc")
    config.data.loader_shards, config.data.num_workers, config.data.prefetch = 4, 3, 5
    train = build.loader_settings(config, train=True)
    evaluation = build.loader_settings(config, train=False)
    assert (train["loader_shards"], train["num_workers"], train["prefetch"]) == (4, 3, 5)
    assert train["train"] and not evaluation["train"] and train["seed"] == config.seed
    assert train["retry"] == build.retry_policy(config)
    # An evaluation pass reads in order in this process: the loader's defaults.
    assert set(train) - set(evaluation) == {"loader_shards", "num_workers"}


def test_the_short_first_phase_reaches_the_labeled_split_only(monkeypatch):
    """config.data.short_first_* reach the loader of the split being learned; a
    distillation's other stream (short_first=False) reads every utterance from step 0."""
    seen = {}
    monkeypatch.setattr(inputs.pipeline_lib, "make_pipeline", lambda **kw: seen.update(kw))
    config = demo.get_config()  # the demo's default: 300 steps of utterances <= 2.25 s
    inputs._split_pipeline(config, "data", "train", None, None, "tok", short_first=True)
    assert (seen["short_first_steps"], seen["short_first_seconds"]) == (300, 2.25)
    assert seen["augment_from_epoch"] == 1  # the phase's 2nd pass (its passes count first)
    inputs._split_pipeline(config, "data", "other", None, None, "tok")
    assert seen["short_first_steps"] == 0


def test_settings_that_do_not_fit_the_split_are_one_user_error(monkeypatch):
    """The loader's ValueErrors (a short-first limit no utterance fits, another sample
    rate) reach the user as one line naming the split."""

    def refuse(**kw):
        raise ValueError("no utterance of the split is <= 0.25s")

    monkeypatch.setattr(inputs.pipeline_lib, "make_pipeline", refuse)
    with pytest.raises(UserError, match=r"^data/train: no utterance of the split is <= 0.25s"):
        inputs._split_pipeline(demo.get_config(), "data", "train", None, None, "tok")
