"""A synthetic voiced signal for the vocoder tests."""

import numpy as np

SR = 16000


def harmonic_tone(num_samples: int, seed: int = 0) -> np.ndarray:
    """(S,) float32: a 140 Hz tone with vibrato, harmonics to 7.8 kHz falling as 1/k, a
    slow loudness swell and white noise at -60 dBFS RMS (so no mel bin sits at the log floor)."""
    t = np.arange(num_samples) / SR
    f0 = 140.0 * (1.0 + 0.1 * np.sin(2 * np.pi * 3.0 * t))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = sum(np.sin(k * phase) / k for k in range(1, 50) if k * f0.max() < 7800)
    x = x * (0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t))
    x = 0.5 * x / np.abs(x).max()
    return (x + 1e-3 * np.random.default_rng(seed).standard_normal(num_samples)).astype(np.float32)
