"""Spectrogram pictures for TensorBoard, with numpy only (no matplotlib).

`spectrogram_image` turns a (T, F) feature matrix into an RGB image with low
frequencies at the bottom, the way spectrograms are read; `stack_images` puts
several (e.g. input features, SpecAugment-ed features, model posteriors) under
one another in one image.
"""

from __future__ import annotations

import numpy as np

# Viridis (perceptually uniform, readable in grey scale and by colour-blind
# readers) sampled at 9 evenly spaced points, as in viridisLite::viridis(9);
# linear interpolation between them is visually indistinguishable from the
# 256-entry table for a log-mel picture.
_VIRIDIS_ANCHORS = np.array(
    [
        [0x44, 0x01, 0x54],
        [0x47, 0x2D, 0x7B],
        [0x3B, 0x52, 0x8B],
        [0x2C, 0x72, 0x8E],
        [0x21, 0x90, 0x8C],
        [0x27, 0xAD, 0x81],
        [0x5D, 0xC8, 0x63],
        [0xAA, 0xDC, 0x32],
        [0xFD, 0xE7, 0x25],
    ],
    dtype=np.float64,
)


def _colormap_lut(anchors: np.ndarray = _VIRIDIS_ANCHORS, size: int = 256) -> np.ndarray:
    """(size, 3) uint8 lookup table linearly interpolated between anchor colours."""
    xs = np.linspace(0.0, 1.0, len(anchors))
    grid = np.linspace(0.0, 1.0, size)
    lut = np.stack([np.interp(grid, xs, anchors[:, c]) for c in range(3)], axis=-1)
    return np.round(lut).astype(np.uint8)


_LUT = _colormap_lut()


def spectrogram_image(
    feats_tf: np.ndarray, *, lo: float | None = None, hi: float | None = None
) -> np.ndarray:
    """(T, F) float features -> (F, T, 3) uint8 viridis image, frequency bin 0 on the bottom row.

    Values are scaled linearly from lo (darkest) to hi (brightest) and clipped;
    the defaults are the 1st and 99th percentiles of the finite inputs, so a
    few outliers (padding, -inf log of zero) do not wash the picture out.
    Non-finite values are drawn as the darkest colour.
    """
    x = np.asarray(feats_tf, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"spectrogram_image expects (T, F) features, got shape {x.shape}")
    finite = x[np.isfinite(x)]
    if lo is None:
        lo = float(np.percentile(finite, 1)) if finite.size else 0.0
    if hi is None:
        hi = float(np.percentile(finite, 99)) if finite.size else 1.0
    # A constant input (or hi <= lo from the caller) maps everything to the low colour.
    span = hi - lo if hi > lo else 1.0
    scaled = np.clip((x - lo) / span, 0.0, 1.0)
    scaled = np.where(np.isfinite(x), scaled, 0.0)
    idx = np.round(scaled * (len(_LUT) - 1)).astype(np.int64)  # (T, F)
    # (T, F) -> (F, T) with rows reversed: image row 0 is the top, bin 0 belongs at the bottom.
    return _LUT[idx.T[::-1]]


def stack_images(images: list[np.ndarray], gap: int = 2) -> np.ndarray:
    """Stack (H_i, W_i, 3) uint8 images top to bottom, with `gap` white rows between them.

    Narrower images are padded on the right with white to the widest width.
    """
    if not images:
        raise ValueError("stack_images needs at least one image")
    for i, img in enumerate(images):
        if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
            raise ValueError(f"image {i} must be (H, W, 3) uint8, got {img.shape} {img.dtype}")
    width = max(img.shape[1] for img in images)
    white = np.uint8(255)
    parts = []
    for i, img in enumerate(images):
        if i and gap > 0:
            parts.append(np.full((gap, width, 3), white, dtype=np.uint8))
        pad = width - img.shape[1]
        parts.append(np.pad(img, ((0, 0), (0, pad), (0, 0)), constant_values=white))
    return np.concatenate(parts, axis=0)
