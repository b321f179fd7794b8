import numpy as np
import pytest

from jaxspeech.metrics.images import _LUT, spectrogram_image, stack_images

DARK, BRIGHT = _LUT[0], _LUT[-1]


def test_spectrogram_shape_dtype_and_orientation():
    t, f = 7, 5
    feats = np.zeros((t, f), np.float32)
    feats[:, 0] = 1.0  # energy only in the lowest frequency bin
    img = spectrogram_image(feats, lo=0.0, hi=1.0)
    assert img.shape == (f, t, 3) and img.dtype == np.uint8
    # Low frequencies at the bottom: the last image row is bin 0.
    np.testing.assert_array_equal(img[-1], np.broadcast_to(BRIGHT, (t, 3)))
    np.testing.assert_array_equal(img[:-1], np.broadcast_to(DARK, (f - 1, t, 3)))


def test_spectrogram_time_runs_left_to_right():
    feats = np.zeros((4, 3), np.float32)
    feats[0] = 1.0  # first frame loud in every bin
    img = spectrogram_image(feats, lo=0.0, hi=1.0)
    np.testing.assert_array_equal(img[:, 0], np.broadcast_to(BRIGHT, (3, 3)))
    np.testing.assert_array_equal(img[:, 1:], np.broadcast_to(DARK, (3, 3, 3)))


def test_spectrogram_clips_and_scales():
    feats = np.array([[-10.0, 0.0, 0.5, 1.0, 10.0, np.nan, -np.inf]], np.float32)
    img = spectrogram_image(feats, lo=0.0, hi=1.0)[:, 0]  # (F, 3), bin 0 last
    col = img[::-1]  # back to bin order
    np.testing.assert_array_equal(col[0], DARK)  # below lo clips to the darkest colour
    np.testing.assert_array_equal(col[1], DARK)
    np.testing.assert_array_equal(col[2], _LUT[128])  # 0.5 -> middle of the table
    np.testing.assert_array_equal(col[3], BRIGHT)
    np.testing.assert_array_equal(col[4], BRIGHT)  # above hi clips to the brightest
    np.testing.assert_array_equal(col[5], DARK)  # non-finite -> darkest
    np.testing.assert_array_equal(col[6], DARK)


def test_spectrogram_default_range_is_robust_to_outliers():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(200, 40)).astype(np.float32)
    feats[0, 0] = 1e6  # one outlier must not squash everything else to dark
    img = spectrogram_image(feats)
    # Default lo/hi are the 1st/99th percentiles: about 1% of pixels saturate at each
    # end (min/max scaling would make ~all pixels dark here).
    frac_dark = np.all(img == DARK, axis=-1).mean()
    frac_bright = np.all(img == BRIGHT, axis=-1).mean()
    assert 0.005 < frac_dark < 0.03
    assert 0.005 < frac_bright < 0.03
    assert np.all(img[-1, 0] == BRIGHT)  # the outlier itself (bin 0, frame 0) saturates


def test_spectrogram_constant_input_and_bad_rank():
    img = spectrogram_image(np.full((3, 4), 2.0))
    assert img.shape == (4, 3, 3)
    np.testing.assert_array_equal(img, np.broadcast_to(DARK, img.shape))
    with pytest.raises(ValueError, match=r"\(T, F\)"):
        spectrogram_image(np.zeros((2, 3, 4)))


def test_colormap_is_viridis_like():
    # Dark purple to yellow, brightness increasing monotonically (perceptual order).
    np.testing.assert_array_equal(DARK, [0x44, 0x01, 0x54])
    np.testing.assert_array_equal(BRIGHT, [0xFD, 0xE7, 0x25])
    luma = _LUT.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.all(np.diff(luma) >= -0.5)


def test_stack_images_pads_and_gaps():
    a = np.zeros((2, 3, 3), np.uint8)
    b = np.full((4, 5, 3), 7, np.uint8)
    out = stack_images([a, b], gap=2)
    assert out.shape == (2 + 2 + 4, 5, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[:2, :3], a)
    np.testing.assert_array_equal(out[:2, 3:], 255)  # a padded to the max width with white
    np.testing.assert_array_equal(out[2:4], 255)  # gap rows are white
    np.testing.assert_array_equal(out[4:], b)


def test_stack_images_single_no_gap_and_errors():
    a = np.ones((2, 3, 3), np.uint8)
    np.testing.assert_array_equal(stack_images([a]), a)
    assert stack_images([a, a, a], gap=0).shape == (6, 3, 3)
    assert stack_images([a, a, a], gap=1).shape == (8, 3, 3)
    with pytest.raises(ValueError):
        stack_images([])
    with pytest.raises(ValueError, match="uint8"):
        stack_images([a.astype(np.float32)])


def test_spectrograms_stack_end_to_end():
    feats = np.linspace(0, 1, 30, dtype=np.float32).reshape(10, 3)
    imgs = [spectrogram_image(feats), spectrogram_image(feats[:6])]
    out = stack_images(imgs)
    assert out.shape == (3 + 2 + 3, 10, 3)
