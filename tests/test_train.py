"""Config-to-object helpers of jaxspeech.train (the CLI itself runs in tests/e2e)."""

import os

import pytest

from configs import demo
from jaxspeech import train


def test_read_noise_list_json_lines_and_plain_paths(tmp_path):
    (tmp_path / "noise").mkdir()
    manifest = tmp_path / "noise.jsonl"
    manifest.write_text('{"audio_filepath": "noise/a.wav"}\n\nnoise/b.wav\n/abs/c.wav\n')
    assert train.read_noise_list(str(manifest)) == (
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
    with pytest.raises(train.UserError, match=message):
        train.read_noise_list(str(manifest))
    with pytest.raises(train.UserError, match="noise manifest not found"):
        train.read_noise_list(str(tmp_path / "missing.jsonl"))


def test_waveform_augmenter_from_config(tmp_path):
    config = demo.get_config()
    assert train.waveform_augmenter(config) is None  # The demo leaves it off.
    tiny = train.waveform_augmenter(demo.get_config("tiny"))
    assert tiny.cfg.speeds == (0.9, 1.0, 1.1) and tiny.cfg.reverb_prob == 0.5
    config.waveform_aug.noise_prob = 1.5
    with pytest.raises(train.UserError, match="config.waveform_aug: noise_prob must be in"):
        train.waveform_augmenter(config)
    config.waveform_aug.noise_prob = 0.5
    (tmp_path / "list.txt").write_text("gone.wav\n")
    config.waveform_aug.noise_manifest = str(tmp_path / "list.txt")
    with pytest.raises(train.UserError, match="gone.wav"):
        train.waveform_augmenter(config)


def _flops_config(num_layers, scan_layers=True):
    config = demo.get_config("tiny")
    config.model.conformer.update(
        dim=144, num_heads=4, num_layers=num_layers, conv_kernel=15, scan_layers=scan_layers
    )
    config.specaug.enabled = False
    return config


def test_step_flops_counts_every_layer_like_the_matmul_arithmetic():
    """Model FLOPs grow per Conformer block by 3x (forward + backward) its matmul FLOPs,
    counted by hand; XLA's count of a scanned step would see one block only."""
    import jax
    import jax.numpy as jnp

    from jaxspeech import evaluate as eval_lib

    b, s, vocab = 2, 32000, 30
    shapes = {
        "audio": jax.ShapeDtypeStruct((b, s), jnp.float32),
        "audio_len": jax.ShapeDtypeStruct((b,), jnp.int32),
        "labels": jax.ShapeDtypeStruct((b, 20), jnp.int32),
        "label_len": jax.ShapeDtypeStruct((b,), jnp.int32),
        "weight": jax.ShapeDtypeStruct((b,), jnp.float32),
        "label_overflow": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    f2, f4 = (train.step_flops(_flops_config(n), vocab, 0, shapes) for n in (2, 4))
    # Scanned or not, the count is the same: the count unrolls the layers itself.
    assert train.step_flops(_flops_config(2, scan_layers=False), vocab, 0, shapes) == f2

    enc = jax.eval_shape(
        lambda a, n: eval_lib.make_model(_flops_config(2), vocab, 0)(a, n)[0],
        shapes["audio"],
        shapes["audio_len"],
    )
    t, d, k = enc.shape[1], 144, 15
    r = 2 * t - 1  # relative positions
    block_forward = (
        2 * b * t * d * 4 * d * 2 * 2  # two feed-forward modules, two matmuls each
        + 2 * b * t * d * d * 4  # q, k, v and output projections
        + 2 * r * d * d  # relative position projection
        + 2 * b * t * t * d * 2  # content scores and context
        + 2 * b * t * r * d  # position scores (before the relative shift)
        + 2 * b * t * d * 2 * d
        + 2 * b * t * d * d  # conv module pointwise 1 and 2
        + 2 * b * t * d * (32 + k - 1)  # depthwise conv as 32-frame band matmuls
    )
    per_block = (f4 - f2) / 2
    # Elementwise work (norms, activations, softmax, Adam) adds a little on top.
    assert 1.0 <= per_block / (3 * block_forward) < 1.25, per_block / (3 * block_forward)


def test_peek_rows_has_one_shape_whatever_the_bucket():
    import numpy as np

    local = {
        "audio": np.ones((3, 50), np.float32),
        "audio_len": np.array([50, 40, 30], np.int32),
        "labels": np.arange(12, dtype=np.int32).reshape(3, 4),
        "label_len": np.array([4, 3, 2], np.int32),
        "weight": np.array([1, 1, 0], np.float32),
    }
    out = train.peek_rows(local, 4, 80)  # more rows than the batch has, longer audio
    assert out["audio"].shape == (4, 80) and out["audio"][:3, :50].all()
    assert not out["audio"][:, 50:].any() and not out["audio"][3].any()
    np.testing.assert_array_equal(out["audio_len"], [50, 40, 30, 80])
    np.testing.assert_array_equal(out["weight"], [1, 1, 0, 0])
    np.testing.assert_array_equal(out["labels"][:3], local["labels"])
    cut = train.peek_rows(local, 2, 20)  # shorter: cut, lengths capped
    assert cut["audio"].shape == (2, 20)
    np.testing.assert_array_equal(cut["audio_len"], [20, 20])
