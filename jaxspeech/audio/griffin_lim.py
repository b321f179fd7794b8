"""Griffin-Lim vocoder: our log-mel features -> waveform, on the host in numpy (librosa).

A baseline that needs no training: it undoes each step of
`jaxspeech.audio.features.log_mel`, with the same settings:
  log(mel + floor)      -> mel power: exp(x) - floor, clipped at 0;
  slaney mel filterbank -> linear power spectrum: non-negative least squares against the
                           same filterbank matrix (`features.mel_filterbank`; `nnls`, the
                           solution of librosa's nnls);
  |STFT|^2              -> magnitude: the square root (the features are power, not magnitude);
  STFT                  -> waveform: Griffin-Lim phase recovery (librosa's fast variant,
                           momentum 0.99) with the front end's STFT: n_fft 512, periodic Hann
                           window of win_length 400 centred in the frame, hop 160, centred
                           frames with zero padding (center=True, pad_mode="constant").
The mel projection discards detail (80 bins for 257), and Griffin-Lim's phase is only
self-consistent, not the original's (the method's known "phasey" sound): a floor that a
neural vocoder (`jaxspeech.vocoder.hifigan`) should beat.

Host-side and not jittable (scipy's optimizer inside nnls, librosa's STFT loop): for
evaluation and listening, not for a training step. T frames give T * hop samples, as the
neural vocoder's; the front end of those gives T + 1 frames whose first T are the input's.
"""

from __future__ import annotations

import functools

import librosa
import numpy as np
import scipy.optimize

from jaxspeech.audio import features
from jaxspeech.audio.features import LogMelConfig

FRONT_END = LogMelConfig()
# L-BFGS-B's convergence threshold on the projected gradient's largest entry (scipy's
# default `pgtol`, which librosa's nnls keeps).
_PGTOL = 1e-5


def _nnls_objective(
    x_flat: np.ndarray, shape: tuple[int, int], a: np.ndarray, b: np.ndarray
) -> tuple[float, np.ndarray]:
    """librosa's nnls objective, 0.5 |A X - B|^2 / B.size, and its gradient w.r.t. the
    flattened (N * T,) X of `shape` (N, T); A (M, N), B (M, T)."""
    diff = np.einsum("mf,...ft->...mt", a, x_flat.reshape(shape), optimize=True) - b
    value = (1 / b.size) * 0.5 * np.sum(diff**2)
    grad = (1 / b.size) * np.einsum("mf,...mt->...ft", a, diff, optimize=True)
    return value, grad.ravel()


def _nnls_block(a: np.ndarray, b: np.ndarray, x0: np.ndarray) -> np.ndarray:
    """One block of `nnls`: L-BFGS-B from (N, T) `x0` (>= 0) for (M, T) `b` -> (N, T)."""
    _, grad = _nnls_objective(x0.ravel(), x0.shape, a, b)
    # L-BFGS-B's first test, before it takes any step: the gradient projected on the
    # bounds x >= 0 (a positive entry counts only up to x, the room left to descend).
    projected = np.where(grad >= 0, np.minimum(x0.ravel(), grad), grad)
    if np.max(np.abs(projected)) <= _PGTOL:
        return x0  # what the optimizer returns: converged at its starting point
    x, _, _ = scipy.optimize.fmin_l_bfgs_b(
        _nnls_objective, x0, args=(x0.shape, a, b), bounds=[(0, None)] * x0.size, m=a.shape[1]
    )
    return x.reshape(x0.shape)


def nnls(a: np.ndarray, b: np.ndarray, a_pinv: np.ndarray | None = None) -> np.ndarray:
    """(M, N) basis, (M, T) targets -> (N, T) float64 X >= 0 that minimizes |A X - B|^2:
    the solution of `librosa.util.nnls` (that of `librosa.feature.inverse.mel_to_stft`),
    computed the same way: pinv(A) B clipped at 0 as the starting point, then scipy's
    L-BFGS-B (memory N) on 0.5 |A X - B|^2 / B.size, over blocks of columns of
    librosa's size (`librosa.util.MAX_MEM_BLOCK` bytes of B). `a_pinv`: (N, M)
    `np.linalg.pinv(a)`, when the caller keeps it for many B.

    Not librosa's own function because of what it costs for nothing here: with the
    objective divided by B.size, the log-mel of every recording of the demo's tts_heldout
    (96) already passes L-BFGS-B's first convergence test at the clipped pseudo-inverse
    (largest projected gradient 2.9e-6, threshold 1e-5), so the optimizer returns its
    starting point unchanged; yet scipy (1.17) first converts the bounds element by
    element (a list of N * T tuples, then a Python loop over the variables in
    `_minimize_lbfgsb`, which every public form of the bounds goes through). Measured on
    the shared 2-core VM: 0.24-0.56 s an utterance in librosa's nnls, 59 s of a
    96-utterance evaluation's 442 s, against ~30 ms for the same bits here. The same
    first test is applied before calling scipy, which runs (with librosa's arguments)
    only when it would take a step.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a_pinv is None:
        a_pinv = np.linalg.pinv(a)
    x = np.einsum("fm,...mt->...ft", a_pinv, b, optimize=True)
    np.clip(x, 0, None, out=x)
    columns = max(librosa.util.MAX_MEM_BLOCK // (b.shape[0] * a.itemsize), 1)
    if b.shape[1] <= columns:
        return _nnls_block(a, b, x) if x.size else x
    for start in range(0, b.shape[1], columns):
        block = slice(start, start + columns)
        x[:, block] = _nnls_block(a, b[:, block], x[:, block])
    return x


@functools.lru_cache(maxsize=4)
def _mel_basis(cfg: LogMelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(F, n_fft // 2 + 1) float64 mel filterbank of `cfg` and its (n_fft // 2 + 1, F)
    pseudo-inverse, read-only, made once per front end: the SVD was most of what `nnls`
    still cost an utterance (2-200 ms on the shared 2-core VM, its LAPACK threads waiting
    for the cores)."""
    basis = features.mel_filterbank(cfg).T.astype(np.float64)
    pinv = np.linalg.pinv(basis)
    basis.flags.writeable = pinv.flags.writeable = False
    return basis, pinv


def mel_to_magnitude(log_mel_tf: np.ndarray, cfg: LogMelConfig = FRONT_END) -> np.ndarray:
    """(T, F) log-mel -> (n_fft // 2 + 1, T) float32 magnitude spectrogram (librosa's layout),
    the least-squares non-negative power spectrum under our mel filterbank, square-rooted."""
    mel_power = np.maximum(np.exp(np.asarray(log_mel_tf, np.float64)) - cfg.log_floor, 0.0)
    basis, basis_pinv = _mel_basis(cfg)
    # librosa's nnls (`nnls`): the pseudo-inverse, clipped, where L-BFGS-B stops at once on
    # our features. It leaves ~0.1 nats of log-mel error in quiet bins; scipy's exact
    # active-set nnls fits the mel to 1e-8 but its sparse spectra (a few bins per filter)
    # are no STFT's, and the round trip after Griffin-Lim was 3x worse (0.44 vs 0.145 nats
    # mean |log-mel difference| on a 1 s harmonic tone).
    power = nnls(basis, mel_power.T, basis_pinv)
    return np.sqrt(power).astype(np.float32)


def griffin_lim(
    log_mel_tf: np.ndarray,
    cfg: LogMelConfig = FRONT_END,
    *,
    n_iter: int = 64,
    momentum: float = 0.99,
    seed: int = 0,
) -> np.ndarray:
    """(T, F) raw (not normalized) log-mel frames of our front end -> (T * hop,) float32
    waveform.

    `n_iter` Griffin-Lim iterations from random phases (`seed`: reproducible output)."""
    if cfg.kind != "log_mel":
        raise ValueError(f"Griffin-Lim inverts log-mel features, not {cfg.kind!r}")
    log_mel_tf = np.asarray(log_mel_tf)
    if log_mel_tf.ndim != 2 or log_mel_tf.shape[1] != cfg.num_mel_bins:
        raise ValueError(f"expected (T, {cfg.num_mel_bins}) log-mel, got {log_mel_tf.shape}")
    num_frames = log_mel_tf.shape[0]
    mag = mel_to_magnitude(log_mel_tf, cfg)
    # T * hop samples have T + 1 centred frames: the one past the last is taken as silent.
    mag = np.pad(mag, ((0, 0), (0, 1)))
    audio = librosa.griffinlim(
        mag,
        n_iter=n_iter,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        n_fft=cfg.n_fft,
        window="hann",
        center=True,
        pad_mode="constant",
        length=num_frames * cfg.hop_length,
        momentum=momentum,
        init="random",
        random_state=np.random.default_rng(seed),
    )
    return audio.astype(np.float32)


def griffin_lim_batch(
    log_mel_btf: np.ndarray, mask_bt: np.ndarray, cfg: LogMelConfig = FRONT_END, **kwargs
) -> np.ndarray:
    """`hifigan.vocode`'s contract on the host: (B, T, F) log-mel and (B, T) bool frame mask
    (valid frames first) -> (B, T * hop) float32, each row from its valid frames only and
    zero past their T_b * hop samples. kwargs: `griffin_lim`'s."""
    log_mel_btf, mask_bt = np.asarray(log_mel_btf), np.asarray(mask_bt, bool)
    b, t, _ = log_mel_btf.shape
    out = np.zeros((b, t * cfg.hop_length), np.float32)
    for row, (mel, mask) in enumerate(zip(log_mel_btf, mask_bt)):
        n = int(mask.sum())
        if n:
            out[row, : n * cfg.hop_length] = griffin_lim(mel[:n], cfg, **kwargs)
    return out
