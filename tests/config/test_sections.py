"""A config per task (jaxspeech.config.sections): each task's config holds the shared
sections and its own; the vocoder's two optimizers are config.optim / config.optim2 and
train exactly as HiFi-GAN's AdamW did; a run saved with every task's sections (the flat
layout) reads as today's; another task's key is one line."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from configs import tts, vocoder
from jaxspeech.config import defaults, keys, sections, validate
from jaxspeech.training import optim
from jaxspeech.vocoder.objective import make_optimizers


def test_each_task_carries_the_shared_sections_and_its_own():
    every = keys.every_key()  # every task's keys, the shared ones at the recognizer's values
    for task in sections.TASKS:
        config = defaults.get_config(task)
        assert config.task == task
        assert set(config) == set(sections.SHARED) | set(sections.TASK_SECTIONS[task])
        for key, value in keys.flat(config.to_dict()).items():
            if not key.startswith(("optim.", "optim2.", "task")):
                assert every[key] == value, key  # the same default in every layout
    assert "model" not in defaults.get_config("vocoder")
    assert {"optim2", "tts", "vocoder"}.isdisjoint(defaults.get_config("asr"))
    with pytest.raises(ValueError, match="unknown config.task 'speech'"):
        defaults.get_config("speech")


def _params() -> dict:
    """A matrix, a convolution kernel and biases: weight decay on every one of them or on
    the matrices only tells the optimizers apart."""
    rng = np.random.default_rng(0)
    shapes = {"w": (4, 3), "conv": (5, 2, 3), "b": (3,), "scale": (2,)}
    return {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}


def _updates(tx: optax.GradientTransformation, steps: int = 3) -> tuple[list, object]:
    """The updates of `steps` steps on fixed gradients, and the state's tree structure."""
    params, state = _params(), tx.init(_params())
    rng, out = np.random.default_rng(1), []
    for _ in range(steps):
        grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(updates)
    return out, jax.tree.structure(state)


@pytest.mark.parametrize("variant,lr", [("hifigan", 1e-3), ("tiny", 2e-3)])
def test_the_vocoders_optimizers_are_hifigans_adamw_as_before(variant, lr):
    """configs/vocoder.py's optim and optim2 build what the flat layout's
    vocoder.learning_rate / b1 / b2 / weight_decay / lr_decay / lr_decay_steps built:
    optax.adamw over an exponential decay, no clipping, decay on every parameter; the
    same updates, bit for bit, and the same state layout (old checkpoints resume)."""
    schedule = optax.exponential_decay(lr, 820, 0.999)
    reference = optax.adamw(schedule, b1=0.8, b2=0.99, weight_decay=0.01)
    want, want_tree = _updates(reference)
    txs, got_schedule = make_optimizers(vocoder.get_config(variant))
    for name in ("generator", "discriminator"):
        got, got_tree = _updates(txs[name])
        assert got_tree == want_tree
        for a, b in zip(got, want, strict=True):
            jax.tree.map(np.testing.assert_array_equal, a, b)
    for step in (0, 1, 819, 820, 5000):
        assert got_schedule(step) == schedule(step)


def test_the_demo_vocos_generator_learns_on_a_cosine_from_its_peak():
    """configs/vocoder.py's default (Vocos): the generator's AdamW from 4e-3 at step 0 (no
    warm-up) down a cosine to 2% at the last step; the resting discriminators keep the
    HiFi-GAN optimizer of the flat layout."""
    txs, schedule = make_optimizers(vocoder.get_config())
    want = optax.cosine_decay_schedule(4e-3, 3000, alpha=0.02)
    for step in (0, 1, 1500, 2999, 3000):
        assert float(schedule(step)) == pytest.approx(float(want(step)), rel=1e-6)
    reference = optax.adamw(optax.exponential_decay(1e-3, 820, 0.999), b1=0.8, b2=0.99,
                            weight_decay=0.01)  # fmt: skip
    (want_d, _), (got_d, _) = _updates(reference), _updates(txs["discriminator"])
    for a, b in zip(got_d, want_d, strict=True):
        jax.tree.map(np.testing.assert_array_equal, a, b)


def test_the_recognizers_optimizer_is_unchanged():
    """config.optim's defaults: clipping, then AdamW with decay on matrices only, over
    warm-up and cosine decay (optax's own parts, written out)."""
    cfg = defaults.get_config().optim
    schedule = optax.warmup_cosine_decay_schedule(0.0, 2e-3, 150, 1350, 2e-3 * 0.02)
    mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731
    reference = optax.chain(
        optax.clip_by_global_norm(5.0),
        optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=1e-3, mask=mask),
    )
    (want, want_tree), (got, got_tree) = (
        _updates(reference),
        _updates(optim.make_optimizer(cfg, 1350)[0]),
    )
    assert got_tree == want_tree
    for a, b in zip(got, want, strict=True):
        jax.tree.map(np.testing.assert_array_equal, a, b)


def test_exponential_decay_with_warmup_and_its_mistakes():
    cfg = ConfigDict(defaults.get_config("vocoder").optim.to_dict())
    cfg.warmup_steps = 10
    schedule = optim.make_schedule(cfg, 100)
    assert float(schedule(5)) == pytest.approx(1e-4)  # half way up to 2e-4
    assert float(schedule(10 + 820)) == pytest.approx(2e-4 * 0.999)
    config = vocoder.get_config("tiny")
    config.optim2.weight_decay_mask = "biases"
    config.optim2.decay_rate = 0.0
    assert validate.mistakes(config) == [
        "optim2.decay_rate must be in (0, 1], got 0",
        "optim2.weight_decay_mask: unknown weight_decay_mask 'biases'; choose one of matrices, all",
    ]


def _flat_layout_vocoder() -> tuple[dict, dict]:
    """(configs/vocoder.py as a run saved before the split wrote it, in config.json: every
    task's sections, the optimizer in config.vocoder, a bfloat16 model.dtype; the same
    run in today's layout). The HiFi-GAN variant: the flat layout's optimizer had no
    schedule but the exponential decay."""
    today = vocoder.get_config("hifigan").to_dict()
    today["vocoder"]["dtype"] = "bfloat16"
    asr = defaults.get_config("asr").to_dict()
    old = {k: v for k, v in today.items() if k != "optim2"}
    old |= {k: asr[k] for k in sections.TASK_SECTIONS["asr"]} | {"optim": asr["optim"]}
    old["model"]["dtype"] = "bfloat16"
    old["tts"] = defaults.get_config("tts").tts.to_dict()
    old["vocoder"] = {k: v for k, v in today["vocoder"].items() if k != "dtype"}
    old["vocoder"] |= dict(learning_rate=1e-3, b1=0.8, b2=0.99, weight_decay=0.01)
    old["vocoder"] |= dict(lr_decay=0.999, lr_decay_steps=820)
    return old, today


def test_a_flat_layout_run_reads_as_its_tasks_layout(tmp_path):
    from jaxspeech.runs import loading

    old, today = _flat_layout_vocoder()
    assert sections.per_task(old) == today
    assert sections.per_task(today) == today  # today's layout: unchanged
    (tmp_path / "config.json").write_text(ConfigDict(old).to_json())
    loaded = loading.load_run_config(str(tmp_path))
    assert json.loads(loaded.to_json()) == json.loads(ConfigDict(today).to_json())
    assert validate.mistakes(loaded) == []
    synthesizer = tts.get_config().to_dict() | {"model": {"dtype": "bfloat16", "head": "ctc"}}
    del synthesizer["tts"]["dtype"]  # the flat layout's synthesizer: model.dtype
    assert sections.per_task(synthesizer)["tts"]["dtype"] == "bfloat16"
    assert "model" not in sections.per_task(synthesizer)
    assert defaults.lookup(old, "vocoder.segment_samples") == 8192  # read as it is


def test_another_tasks_key_is_one_line():
    from jaxspeech.common import cli

    argv = ["train", "--config", "configs/vocoder.py:tiny", "--config.model.head=ctc"]
    assert cli._unknown_config_key("KeyError: 'model'", argv) == (
        "--config.model.head: config.model is not read by a vocoder run "
        "(config.task=vocoder); its compute dtype is config.vocoder.dtype"
    )
    argv = ["train", "--config=configs/vocoder.py", "--config.vocoder.learning_rate=1e-3"]
    line = cli._unknown_config_key("KeyError: 'learning_rate'", argv)
    assert line == (
        "--config.vocoder.learning_rate: vocoder.learning_rate is now optim.peak_lr and "
        "optim2.peak_lr (the generator's and the discriminators' optimizers)"
    )
    config = vocoder.get_config("tiny")
    config.distill = ConfigDict({"other_split": ""})
    (line,) = validate.mistakes(config)
    assert line.startswith("config.distill is not read by a vocoder run (config.task=vocoder)")


def test_config_help_shows_only_the_tasks_keys():
    text = "\n".join(keys.describe_keys(vocoder.get_config()))
    assert "optim2.peak_lr = 0.001  (default: 0.0002)" in text
    assert "\nvocoder.segment_samples = 8192" in text
    assert "model." not in text and "\ntts." not in text and "decoding." not in text
    every = "\n".join(keys.describe_keys())
    assert "[tts] config.task" in every and "(config.task=tts only)" in every
