"""MFCCs of log-mel frames: a DCT-II over the mel axis, liftering and optional deltas.

The cepstra are one matmul of the log-mel with a constant (num_mel_bins, num_ceps)
matrix built in numpy (the orthonormal DCT-II, `scipy.fft.dct(type=2, norm="ortho")`,
times the lifter weights), so inside the jitted step MFCC costs one small matmul more
than the log-mel. They equal `librosa.feature.mfcc(S=log_mel.T, n_mfcc=num_ceps,
dct_type=2, norm="ortho", lifter=lifter)` given the same log-mel frames. librosa's lifter
weights coefficient k (from 0) by 1 + (L / 2) sin(pi (k + 1) / L); Kaldi and HTK use
sin(pi k / L) (c0 unliftered): the same curve, one coefficient earlier.

Deltas are librosa's `delta(width=5, order=k, mode="interp")` (k = 1, 2): the k-th
derivative of a degree-k polynomial fitted by least squares to the 5 frames t-2..t+2
(for k = 1 Kaldi's delta formula, sum_n n (x[t+n] - x[t-n]) / 10; for k = 2 one 5-frame
quadratic fit, not Kaldi's delta of the delta over 9 frames). Near the edges librosa's
"interp" fits the first (last) 5 frames, and a degree-k fit's k-th derivative is constant:
the first 2 frames take frame 2's value and the last 2 that of frame T-3. Here T is each
row's own frame count, so a padded row's deltas equal its unpadded utterance's. A row
of fewer than 5 frames (librosa refuses one) gets zero deltas.

The numpy functions (`mfcc_np`) are the same arithmetic for one utterance: data_prep's
normalization statistics use them.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

FEATURE_KINDS = ("log_mel", "mfcc")  # features.kind: the front end's output
DELTA_WIDTH = 2  # frames each side of a delta's window (librosa's width=5, Kaldi's window 2)
MAX_DELTAS = 2  # delta orders that may be appended


def feature_width(num_ceps: int, deltas: int) -> int:
    """Features per frame of MFCC: the cepstra and each order of their deltas."""
    return num_ceps * (1 + deltas)


@functools.lru_cache(maxsize=16)
def dct_matrix(num_mel_bins: int, num_ceps: int, lifter: float) -> np.ndarray:
    """(num_mel_bins, num_ceps) float32: the orthonormal DCT-II's first num_ceps basis
    vectors (columns), each times its lifter weight (computed in float64)."""
    if not 1 <= num_ceps <= num_mel_bins:
        raise ValueError(f"num_ceps must be in [1, num_mel_bins={num_mel_bins}], got {num_ceps}")
    if not (math.isfinite(lifter) and lifter >= 0):
        raise ValueError(f"lifter must be a finite number >= 0, got {lifter}")
    m = np.arange(num_mel_bins)[:, None]
    k = np.arange(num_ceps)[None, :]
    basis = np.cos(np.pi * k * (2 * m + 1) / (2 * num_mel_bins))
    scale = np.where(k == 0, math.sqrt(1.0 / num_mel_bins), math.sqrt(2.0 / num_mel_bins))
    weights = np.ones(num_ceps)
    if lifter > 0:
        weights = 1.0 + 0.5 * lifter * np.sin(np.pi * np.arange(1, num_ceps + 1) / lifter)
    return (basis * scale * weights[None, :]).astype(np.float32)


@functools.lru_cache(maxsize=4)
def delta_filter(order: int) -> np.ndarray:
    """(2 * DELTA_WIDTH + 1,) float64 weights w of frames t-2..t+2: delta = sum_j w_j x[t+j],
    the order-th derivative at 0 of the degree-`order` least-squares polynomial fit (what
    `scipy.signal.savgol_filter(deriv=order, polyorder=order)` applies inside the signal)."""
    n = np.arange(-DELTA_WIDTH, DELTA_WIDTH + 1, dtype=np.float64)
    vander = n[:, None] ** np.arange(order + 1)[None, :]  # (5, order + 1)
    return np.linalg.pinv(vander)[order] * math.factorial(order)


def cepstra(log_mel_btm: jax.Array, num_ceps: int, lifter: float) -> jax.Array:
    """(B, T, M) log-mel -> (B, T, num_ceps) liftered MFCCs (one matmul, full precision:
    a TPU's default bfloat16 passes would cost the 1e-3 agreement with librosa)."""
    dct = dct_matrix(log_mel_btm.shape[-1], num_ceps, float(lifter))
    return jnp.einsum("btm,mc->btc", log_mel_btm, dct, precision="highest")


def _window_weights(offset_bt: jax.Array, coef: np.ndarray) -> jax.Array:
    """(B, T) float32: coef[j] where offset == j (a frame's place in a row's edge window),
    else 0."""
    out = jnp.zeros(offset_bt.shape, jnp.float32)
    for j, c in enumerate(coef):
        out = jnp.where(offset_bt == j, float(c), out)
    return out


def append_deltas(x_btc: jax.Array, lengths_b: jax.Array, deltas: int) -> jax.Array:
    """(B, T, C) features and (B,) frame counts -> (B, T, C * (1 + deltas)): [x, delta,
    delta-delta] per frame, each row's edges as librosa's mode="interp" at its own length
    (see the module docstring). Frames past a row's length hold its last delta."""
    if deltas == 0:
        return x_btc
    w = DELTA_WIDTH
    t_len = x_btc.shape[1]
    padded = jnp.pad(x_btc, ((0, 0), (w, w), (0, 0)))  # static widths: symbolic T is fine
    windows = [jax.lax.slice_in_dim(padded, j, j + t_len, axis=1) for j in range(2 * w + 1)]
    t = jax.lax.broadcasted_iota(jnp.int32, (1, t_len), 1)
    last = lengths_b.astype(jnp.int32)[:, None] - 1 - w  # (B, 1) the last full window's centre
    enough = (last >= w)[..., None]  # at least 2w + 1 frames
    out = [x_btc]
    for order in range(1, deltas + 1):
        coef = delta_filter(order)
        inner = sum(float(c) * win for c, win in zip(coef, windows, strict=True))
        # The edge values straight from the row's first and last 2w + 1 frames (weighted
        # sums over time: no gather, which the ONNX conversion of symbolic shapes cannot
        # lower; reading `inner` there instead made XLA recompute it, 6x slower on CPU).
        edge = [
            jnp.sum(_window_weights(off, coef)[..., None] * x_btc, axis=1, keepdims=True)
            for off in (t, t - (last - w))
        ]
        tt = t[..., None]
        d = jnp.where(tt < w, edge[0], jnp.where(tt > last[..., None], edge[1], inner))
        out.append(jnp.where(enough, d, 0.0))
    return jnp.concatenate(out, axis=-1)


def mfcc_of_log_mel(
    log_mel_btm: jax.Array, lengths_b: jax.Array, num_ceps: int, lifter: float, deltas: int
) -> jax.Array:
    """(B, T, M) log-mel, (B,) frame counts -> (B, T, num_ceps * (1 + deltas)) MFCCs."""
    return append_deltas(cepstra(log_mel_btm, num_ceps, lifter), lengths_b, deltas)


def mfcc_np(log_mel_mt: np.ndarray, num_ceps: int, lifter: float, deltas: int) -> np.ndarray:
    """One utterance, numpy: (M, T) log-mel -> (num_ceps * (1 + deltas), T) float64 MFCCs,
    the arithmetic of `mfcc_of_log_mel` (librosa's layout: features x frames)."""
    ceps = dct_matrix(log_mel_mt.shape[0], num_ceps, float(lifter)).astype(np.float64).T
    x = ceps @ np.asarray(log_mel_mt, np.float64)  # (C, T)
    out = [x]
    t_len, w = x.shape[1], DELTA_WIDTH
    for order in range(1, deltas + 1):
        if t_len < 2 * w + 1:
            out.append(np.zeros_like(x))
            continue
        coef = delta_filter(order)
        inner = sum(c * x[:, j : j + t_len - 2 * w] for j, c in enumerate(coef))  # centres w..
        centre = np.clip(np.arange(t_len), w, t_len - 1 - w) - w
        out.append(inner[:, centre])
    return np.concatenate(out, axis=0)
