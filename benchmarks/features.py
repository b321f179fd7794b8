"""Front ends: jaxspeech's jitted JAX log-mel and MFCC vs librosa vs kaldi-native-fbank.

`python benchmarks/features.py [--quick] [--cores N]` computes 80-bin log-mel features
of the same seeded batch of synthetic speech-like audio (16 kHz harmonic "syllables"
with pauses and background noise) with the project's default `LogMelConfig` (n_fft 512,
25 ms Hann window, 10 ms hop, centred, constant padding, slaney mel, power 2,
log(mel + 1e-6)) three ways, prints a table and writes `benchmarks/results/features.json`:
  jax                 jax.jit(jaxspeech.audio.features.log_mel) on the whole (B, S) batch,
                      input already on the device, after a compiling call, block_until_ready
  librosa             librosa.feature.melspectrogram(...) per utterance, then np.log(mel + 1e-6);
                      the reference the JAX features are checked against
  kaldi_native_fbank  knf.OnlineFbank per utterance (accept_waveform, input_finished, then
                      get_frame for every frame), options as close as it allows: 80 bins,
                      25 ms / 10 ms, 512-point FFT, periodic "hann" window, no dither, no
                      pre-emphasis, no DC removal, librosa-style slaney mel 0-8000 Hz, power
                      spectrum, log(mel + 1e-6), no energy, snip_edges=False. Its frames sit
                      80 samples later than librosa's and its edges are reflected, not zero
                      padded: its features are not compared, only its speed.

MFCC, in the same run on the same audio (result["mfcc"]), with the default MFCC settings
(`LogMelConfig(kind="mfcc")`: the log-mel above, 40 cepstra, lifter 22):
  jax                 the model's front end jitted over the batch: log_mel, then
                      jaxspeech.audio.mfcc.mfcc_of_log_mel (one DCT matmul); also with
                      2 orders of deltas (jax_deltas2)
  librosa             librosa.feature.mfcc(S=log-mel above, norm="ortho", lifter=22) per
                      utterance (and feature.delta(width=5) of orders 1 and 2)
  kaldi_native_fbank  knf.OnlineMfcc per utterance, the fbank's options above, 40 cepstra,
                      lifter 22, no energy (it has no deltas); speed only, as its fbank
`max_abs_diff_vs_librosa_same_log_mel` compares our MFCC + deltas with librosa's given our
log-mel frames (the DCT, lifter and deltas alone); `..._from_audio` each from the audio
(interior frames: the log-mel differences, through the DCT, included).

Speed is "times real time per CPU core" (xRT/core): seconds of audio processed per second
of wall time (median over repeats of the whole batch), divided by the number of CPU cores
the library was allowed to use. Every library gets the same cores: at start-up the script
pins its process to the first N cores it may run on (`os.sched_setaffinity`; `--cores`,
default 1), sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS to N and
re-executes itself, so that every thread any library starts in the new process (XLA's
pool, OpenBLAS's) inherits that affinity; the JSON records the affinity it ran with.
librosa and kaldi-native-fbank process one utterance at a time (kaldi-native-fbank on one
thread; librosa's mel matmul may use N BLAS threads); XLA may use all N cores. On an
accelerator, `jax_xrt` is the device's plain xRT (not divided by N).

`max_abs_log_diff_vs_librosa` is max |JAX - librosa| over interior frames: frames whose
n_fft-sample span lies wholly inside the signal (not touching the centring pad).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import kaldi_native_fbank as knf
import librosa
import numpy as np

from jaxspeech.audio import mfcc
from jaxspeech.audio.features import LogMelConfig, log_mel, num_frames

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # `benchmarks.lib` from this checkout when run as a script
    sys.path.insert(0, ROOT)

from benchmarks.lib import environment, results, timing  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
_PINNED_ENV = "JAXSPEECH_BENCH_PINNED_CORES"
_THREAD_ENVS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_and_reexec(cores: int) -> None:
    """Restrict this process to `cores` CPUs and re-execute it, once, so all threads obey."""
    if os.environ.get(_PINNED_ENV) == str(cores):
        return
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        sys.exit(f"--cores {cores}: only {len(allowed)} cores are available")
    os.sched_setaffinity(0, allowed[:cores])
    env = dict(os.environ, **{k: str(cores) for k in _THREAD_ENVS}, **{_PINNED_ENV: str(cores)})
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def speech_like(num: int, seconds: float, sr: int, seed: int = 0) -> np.ndarray:
    """(num, seconds * sr) float32: voiced syllables (harmonics of a gliding f0 under two
    formant-like resonances), pauses, and background noise at about -45 dB; peak <= 0.9."""
    rng = np.random.default_rng(seed)
    s = int(seconds * sr)
    out = np.empty((num, s), np.float32)
    t = np.arange(s) / sr
    for i in range(num):
        # Syllable gate: alternating voiced spans (80-300 ms) and gaps (30-400 ms).
        gate = np.zeros(s)
        pos = int(rng.uniform(0.0, 0.3) * sr)
        while pos < s:
            n = int(rng.uniform(0.08, 0.3) * sr)
            seg = np.sin(np.pi * np.arange(min(n, s - pos)) / n) ** 0.5
            gate[pos : pos + len(seg)] = seg * rng.uniform(0.3, 1.0)
            pos += n + int(rng.uniform(0.03, 0.4) * sr)
        f0_base = rng.uniform(90.0, 220.0)
        f0 = f0_base * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3.0) * t + rng.uniform(0, 6)))
        phase = 2 * np.pi * np.cumsum(f0) / sr
        formants = rng.uniform([300.0, 900.0], [900.0, 2500.0])
        voiced = np.zeros(s)
        for k in range(1, int(7600 // (1.1 * f0_base)) + 1):
            fk = k * f0_base
            gain = sum(1.0 / (1.0 + ((fk - f) / 150.0) ** 2) for f in formants) + 0.05
            voiced += gain / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
        x = voiced * gate + 10 ** (-45 / 20) * rng.standard_normal(s)
        out[i] = 0.9 * x / np.max(np.abs(x))
    return out


def librosa_log_mel(audio_s: np.ndarray, cfg: LogMelConfig) -> np.ndarray:
    """(T, F) log-mel of one utterance with librosa (the reference)."""
    mel = librosa.feature.melspectrogram(
        y=audio_s,
        sr=cfg.sample_rate,
        n_fft=cfg.n_fft,
        hop_length=cfg.hop_length,
        win_length=cfg.win_length,
        window="hann",
        center=True,
        pad_mode="constant",
        power=2.0,
        n_mels=cfg.num_mel_bins,
        fmin=cfg.fmin,
        fmax=cfg.fmax,
        htk=False,
        norm="slaney",
    )
    return np.log(mel + cfg.log_floor).T


def knf_options(cfg: LogMelConfig) -> knf.FbankOptions:
    """kaldi-native-fbank options as close to `cfg` (and librosa) as the library allows."""
    opts = knf.FbankOptions()
    fr = opts.frame_opts
    fr.samp_freq = cfg.sample_rate
    fr.frame_length_ms = 1000.0 * cfg.win_length / cfg.sample_rate
    fr.frame_shift_ms = 1000.0 * cfg.hop_length / cfg.sample_rate
    fr.dither = 0.0
    fr.preemph_coeff = 0.0
    fr.remove_dc_offset = False
    fr.window_type = "hann"  # periodic Hann, as librosa's
    fr.round_to_power_of_two = True  # 400 -> 512-point FFT
    fr.snip_edges = False  # one frame per hop (edges reflected, not zero padded)
    mel = opts.mel_opts
    mel.num_bins = cfg.num_mel_bins
    mel.low_freq = cfg.fmin
    mel.high_freq = cfg.fmax
    mel.is_librosa = True
    mel.norm = "slaney"
    mel.use_slaney_mel_scale = True
    opts.use_energy = False
    opts.use_power = True
    opts.use_log_fbank = True
    opts.use_log_floor = False  # log(mel + eps), not log(max(mel, eps))
    opts.eps = cfg.log_floor
    return opts


def knf_log_mel(audio_s: np.ndarray, sr: int, opts: knf.FbankOptions) -> np.ndarray:
    """(T, F) log-mel of one utterance with kaldi-native-fbank."""
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(sr, audio_s)
    fbank.input_finished()
    return np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])


def interior(num_samples: int, cfg: LogMelConfig) -> slice:
    """Frames t whose n_fft span [t*hop - n_fft/2, t*hop + n_fft/2) lies inside the signal."""
    half = cfg.n_fft // 2
    first = -(-half // cfg.hop_length)
    last = (num_samples - half) // cfg.hop_length
    return slice(first, last + 1)


def knf_mfcc_options(cfg: LogMelConfig) -> knf.MfccOptions:
    """kaldi-native-fbank's MFCC options: the fbank's frame and mel options (as close to
    `cfg` as `knf_options`), `cfg.num_ceps` cepstra, its lifter, no energy."""
    fbank = knf_options(cfg)
    opts = knf.MfccOptions()
    opts.frame_opts, opts.mel_opts = fbank.frame_opts, fbank.mel_opts
    opts.num_ceps = cfg.num_ceps
    opts.cepstral_lifter = cfg.lifter
    opts.use_energy = False  # c0 as the DCT gives it, as librosa's and ours
    return opts


def knf_mfcc(audio_s: np.ndarray, sr: int, opts: knf.MfccOptions) -> np.ndarray:
    """(T, C) MFCC of one utterance with kaldi-native-fbank."""
    m = knf.OnlineMfcc(opts)
    m.accept_waveform(sr, audio_s)
    m.input_finished()
    return np.stack([m.get_frame(i) for i in range(m.num_frames_ready)])


def librosa_mfcc(audio_s: np.ndarray, cfg: LogMelConfig) -> np.ndarray:
    """(T, C * (1 + deltas)) MFCC of one utterance with librosa: `feature.mfcc` of the
    log-mel (`librosa_log_mel`), then `feature.delta(width=5)` of each order."""
    ceps = librosa.feature.mfcc(
        S=librosa_log_mel(audio_s, cfg).T, n_mfcc=cfg.num_ceps, norm="ortho", lifter=cfg.lifter
    )
    deltas = [librosa.feature.delta(ceps, width=5, order=k) for k in range(1, cfg.deltas + 1)]
    return np.concatenate([ceps, *deltas]).T


def jax_mfcc_fn(cfg: LogMelConfig):
    """The model's MFCC front end jitted over a whole batch: log-mel, DCT, deltas."""

    def fn(audio_bs):
        lengths = jnp.full(audio_bs.shape[:1], num_frames(audio_bs.shape[1], cfg.hop_length))
        return mfcc.mfcc_of_log_mel(
            log_mel(audio_bs, cfg), lengths, cfg.num_ceps, cfg.lifter, cfg.deltas
        )

    return jax.jit(fn)


def time_log_mel(audio: np.ndarray, cfg: LogMelConfig, repeats: int) -> dict:
    """The three log-mel front ends: seconds per batch and their features."""
    jit_log_mel = jax.jit(log_mel, static_argnums=1)
    audio_dev = jax.device_put(audio)
    out = {}
    out["jax_s"] = timing.median_seconds(
        lambda: jit_log_mel(audio_dev, cfg).block_until_ready(), repeats
    )
    out["jax"] = np.asarray(jit_log_mel(audio_dev, cfg))
    out["librosa_s"] = timing.median_seconds(
        lambda: [librosa_log_mel(a, cfg) for a in audio], repeats
    )
    out["librosa"] = np.stack([librosa_log_mel(a, cfg) for a in audio])
    out["librosa64"] = np.stack([librosa_log_mel(a.astype(np.float64), cfg) for a in audio])
    opts = knf_options(cfg)
    out["knf_s"] = timing.median_seconds(
        lambda: [knf_log_mel(a, cfg.sample_rate, opts) for a in audio], repeats
    )
    out["knf_frames"] = knf_log_mel(audio[0], cfg.sample_rate, opts).shape[0]
    return out


def time_mfcc(audio: np.ndarray, cfg: LogMelConfig, repeats: int, divisors: tuple) -> dict:
    """The MFCC rows: ours (jitted, batched; also with 2 orders of deltas), librosa's
    `feature.mfcc` (+ `feature.delta`) per utterance, kaldi-native-fbank's `OnlineMfcc`
    (no deltas: it has none) per utterance; xRT per core and the differences to librosa."""
    audio_dev = jax.device_put(audio)
    with_deltas = dataclasses.replace(cfg, deltas=2)
    jax_s, feats = {}, {}
    for c in (cfg, with_deltas):
        fn = jax_mfcc_fn(c)
        jax_s[c.deltas] = timing.median_seconds(
            lambda fn=fn: fn(audio_dev).block_until_ready(), repeats
        )
        feats[c.deltas] = np.asarray(fn(audio_dev))
    lib_s = {
        c.deltas: timing.median_seconds(lambda c=c: [librosa_mfcc(a, c) for a in audio], repeats)
        for c in (cfg, with_deltas)
    }
    lib = np.stack([librosa_mfcc(a, with_deltas) for a in audio])
    opts = knf_mfcc_options(cfg)
    knf_s = timing.median_seconds(
        lambda: [knf_mfcc(a, cfg.sample_rate, opts) for a in audio], repeats
    )
    # Given the same log-mel frames (ours): the DCT and deltas alone, as tests/audio/test_mfcc.py.
    ours_log_mel = np.asarray(jax.jit(log_mel, static_argnums=1)(audio_dev, cfg))
    same = np.stack([librosa_mfcc_of_log_mel(x, with_deltas) for x in ours_log_mel])
    inner = interior(audio.shape[1], cfg)
    seconds, (jax_div, lib_div) = audio.shape[0] * audio.shape[1] / cfg.sample_rate, divisors
    return {
        "mfcc_config": cfg.as_dict(),
        "jax_s": round(jax_s[0], 5),
        "jax_deltas2_s": round(jax_s[2], 5),
        "librosa_s": round(lib_s[0], 5),
        "librosa_deltas2_s": round(lib_s[2], 5),
        "kaldi_native_fbank_s": round(knf_s, 5),
        "jax_xrt": round(seconds / jax_s[0] / jax_div, 1),
        "jax_deltas2_xrt": round(seconds / jax_s[2] / jax_div, 1),
        "librosa_xrt": round(seconds / lib_s[0] / lib_div, 1),
        "librosa_deltas2_xrt": round(seconds / lib_s[2] / lib_div, 1),
        "kaldi_native_fbank_xrt": round(seconds / knf_s / lib_div, 1),
        "max_abs_diff_vs_librosa_same_log_mel": float(np.abs(feats[2] - same).max()),
        "max_abs_diff_vs_librosa_from_audio": float(np.abs(feats[2] - lib)[:, inner].max()),
    }


def librosa_mfcc_of_log_mel(log_mel_tm: np.ndarray, cfg: LogMelConfig) -> np.ndarray:
    """(T, C * (1 + deltas)) librosa MFCC (+ deltas) of given (T, M) log-mel frames."""
    ceps = librosa.feature.mfcc(
        S=log_mel_tm.T.astype(np.float64), n_mfcc=cfg.num_ceps, norm="ortho", lifter=cfg.lifter
    )
    deltas = [librosa.feature.delta(ceps, width=5, order=k) for k in range(1, cfg.deltas + 1)]
    return np.concatenate([ceps, *deltas]).T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller batch, fewer repeats (<2 min)")
    ap.add_argument("--cores", type=int, default=1, help="CPU cores every library may use")
    args = ap.parse_args()
    pin_and_reexec(args.cores)

    cfg = LogMelConfig()
    batch, seconds, repeats = (8, 5.0, 3) if args.quick else (32, 10.0, 10)
    audio = speech_like(batch, seconds, cfg.sample_rate)
    audio_seconds = batch * seconds
    device = jax.devices()[0]
    jax_divisor = args.cores if device.platform == "cpu" else 1

    t = time_log_mel(audio, cfg, repeats)
    jax_s, lib_s, knf_s = t["jax_s"], t["librosa_s"], t["knf_s"]
    jax_feats, lib_feats = t["jax"], t["librosa"]
    inner = interior(audio.shape[1], cfg)
    diff = np.abs(jax_feats - lib_feats)
    result = {
        "benchmark": "features",
        "device": environment.device_label(device),
        "cpu_count": os.cpu_count(),
        "cores_used": args.cores,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "machine": environment.machine(),
        "jax": jax.__version__,
        "librosa": librosa.__version__,
        "numpy": np.__version__,
        "batch": batch,
        "seconds_per_utterance": seconds,
        "sample_rate": cfg.sample_rate,
        "frames_per_utterance": {"jax": jax_feats.shape[1], "librosa": lib_feats.shape[1]}
        | {"kaldi_native_fbank": t["knf_frames"]},
        "interior_frames": [inner.start, inner.stop],
        "repeats": repeats,
        "jax_s": round(jax_s, 5),
        "librosa_s": round(lib_s, 5),
        "kaldi_native_fbank_s": round(knf_s, 5),
        "jax_xrt": round(audio_seconds / jax_s / jax_divisor, 1),
        "librosa_xrt": round(audio_seconds / lib_s / args.cores, 1),
        "kaldi_native_fbank_xrt": round(audio_seconds / knf_s / args.cores, 1),
        "max_abs_log_diff_vs_librosa": float(diff[:, inner].max()),
        "max_abs_log_diff_vs_librosa_all_frames": float(diff.max()),
        "max_abs_log_diff_vs_librosa_float64": float(
            np.abs(jax_feats - t["librosa64"])[:, inner].max()
        ),
        "log_mel_config": cfg.as_dict(),
        "mfcc": time_mfcc(audio, LogMelConfig(kind="mfcc"), repeats, (jax_divisor, args.cores)),
    }
    print_table(result, jax_s, lib_s, knf_s)
    results.save_result(os.path.join(RESULTS, "features.json"), result)


def print_table(result: dict, jax_s: float, lib_s: float, knf_s: float) -> None:
    """The batch line, the table (batch seconds unrounded) and the ratios."""
    print(
        f"{result['batch']} x {result['seconds_per_utterance']:g} s of audio, "
        f"{result['cores_used']} core(s), {result['device']}, median of {result['repeats']}"
    )
    print("| front end | batch time s | xRT per core | max abs diff vs librosa |")
    print("|---|---|---|---|")
    print(
        f"| jax log-mel (jit, batched) | {jax_s:.3f} | {result['jax_xrt']:.0f} "
        f"| {result['max_abs_log_diff_vs_librosa']:.1e} |"
    )
    print(
        f"| librosa log-mel (per utterance) | {lib_s:.3f} | {result['librosa_xrt']:.0f} "
        "| reference |"
    )
    print(
        f"| kaldi-native-fbank fbank (per utterance) | {knf_s:.3f} "
        f"| {result['kaldi_native_fbank_xrt']:.0f} | not compared |"
    )
    m = result["mfcc"]
    same = f"{m['max_abs_diff_vs_librosa_same_log_mel']:.1e}"
    rows = [
        ("jax mfcc (jit, batched)", "jax", "in the row below"),
        ("jax mfcc + 2 delta orders (jit, batched)", "jax_deltas2", same),
        ("librosa mfcc (per utterance)", "librosa", "reference"),
        ("librosa mfcc + 2 delta orders (per utterance)", "librosa_deltas2", "reference"),
        ("kaldi-native-fbank OnlineMfcc (per utterance)", "kaldi_native_fbank", "not compared"),
    ]
    for name, key, said in rows:
        print(f"| {name} | {m[key + '_s']:.3f} | {m[key + '_xrt']:.0f} | {said} |")
    print(
        f"jax / librosa xRT: log-mel {result['jax_xrt'] / result['librosa_xrt']:.2f}, "
        f"mfcc {m['jax_xrt'] / m['librosa_xrt']:.2f}; "
        f"jax vs librosa all frames {result['max_abs_log_diff_vs_librosa_all_frames']:.1e}, "
        f"vs float64 librosa (interior) {result['max_abs_log_diff_vs_librosa_float64']:.1e}; "
        f"mfcc+deltas from the audio (interior) {m['max_abs_diff_vs_librosa_from_audio']:.1e}"
    )


if __name__ == "__main__":
    main()
